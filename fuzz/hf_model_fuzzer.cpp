// Fuzz target: the engine's model description on any text (engine::read_hf_model: the config.json of a checkpoint
// a user points `rotary generate` or `rotary perplexity` at).
//
// A config is refused with a rotary::Error or read into a description; a description it reads must describe a
// model the engine can build: its Architecture validates, and the family's table names every slot with positive
// shapes. Anything else (another exception, a crash, undefined behaviour) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "rotary/error.h"
#include "rotary_engine/hf_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  rotary::engine::HfModelDescription model;
  try {
    model = rotary::engine::read_hf_model(text, "config.json");
  } catch (const rotary::Error&) {
    return 0;  // refused, with a message naming the field
  }
  try {
    model.arch.validate();
    model.rope.validate();
  } catch (const rotary::Error& e) {
    std::fprintf(stderr, "accepted config does not validate: %s\n", e.what());
    std::abort();
  }
  // Only small models: the table has a few entries per layer, and layers are bounded by the reader.
  for (const auto& name : rotary::engine::hf_tensor_names(model)) {
    if (name.stored.empty()) std::abort();
    for (int64_t n : name.slot.shape)
      if (n < 1) {
        std::fprintf(stderr, "tensor %s has a dimension %lld\n", name.stored.c_str(), static_cast<long long>(n));
        std::abort();
      }
  }
  return 0;
}
