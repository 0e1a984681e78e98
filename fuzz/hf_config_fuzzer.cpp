// Fuzz target: rope_spec_from_hf_config on any text (the config.json of any model a user points us at).
//
// A config is either refused with a rotary::Error or read into a spec; a spec it reads must be usable: its
// frequencies, at the configured context and beyond it (dynamic and longrope depend on the length), pass the
// check every kernel applies. Anything else (another exception, a crash, a leak, undefined behaviour, a spec the
// kernels would refuse) is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string_view>

#include "rotary/error.h"
#include "rotary/hf_config.h"
#include "rotary/rope_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  rotary::RopeSpec spec;
  try {
    spec = rotary::rope_spec_from_hf_config(text);
  } catch (const rotary::Error&) {
    return 0;  // refused, with a message naming the field
  }
  // Bounded so that twice it stays an int64 (the reader accepts any max_position_embeddings >= 1).
  const int64_t context = spec.max_position_embeddings > 0 ? std::min(spec.max_position_embeddings, int64_t(1) << 40)
                                                           : 4096;
  for (const int64_t seq_len : {int64_t(0), context, 2 * context}) {
    try {
      spec.freqs(seq_len).validate();
    } catch (const rotary::Error& e) {
      std::fprintf(stderr, "accepted config gives unusable frequencies at seq_len %lld: %s\n%s\n",
                   static_cast<long long>(seq_len), e.what(), spec.describe().c_str());
      std::abort();
    }
  }
  return 0;
}
