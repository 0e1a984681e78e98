// Fuzz target: hf_model_spec on any text (the config.json of a checkpoint a user points `rotary perplexity` at).
//
// A config is refused with a rotary::Error or read into a spec; a spec it reads must describe a model we can
// build: its ModelConfig validates, and the tensor places cover every parameter with positive shapes. Anything
// else (another exception, a crash, undefined behaviour) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "rotary/error.h"
#include "rotary_nn/hf_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  rotary::nn::HfModelSpec spec;
  try {
    spec = rotary::nn::hf_model_spec(text, "config.json");
  } catch (const rotary::Error&) {
    return 0;  // refused, with a message naming the field
  }
  try {
    spec.config.validate();
  } catch (const rotary::Error& e) {
    std::fprintf(stderr, "accepted config does not validate: %s\n", e.what());
    std::abort();
  }
  // Only small models: the places list has a few entries per layer, and layers are bounded by the reader.
  for (const auto& place : rotary::nn::hf_tensor_places(spec))
    for (int64_t n : place.their_shape)
      if (n < 1) {
        std::fprintf(stderr, "tensor %s has a dimension %lld\n", place.theirs.c_str(), static_cast<long long>(n));
        std::abort();
      }
  return 0;
}
