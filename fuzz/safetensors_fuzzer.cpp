// Fuzz target: SafetensorsFile::from_bytes on any bytes (a model file a user points us at, possibly truncated or
// crafted). A file is either refused with a rotary::Error or read; every tensor of a file it reads must lie inside
// the data (each byte is read here, so ASan sees a view past the buffer) with bytes = numel x dtype size.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "rotary/error.h"
#include "rotary/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const rotary::SafetensorsFile f =
        rotary::SafetensorsFile::from_bytes(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    unsigned sum = 0;
    for (const rotary::SafetensorsTensor& t : f.tensors()) {
      if (uint64_t(t.numel()) * rotary::dtype_size(t.dtype) != t.bytes) {
        std::fprintf(stderr, "tensor %s: %zu bytes for %lld elements\n", t.name.c_str(), t.bytes, (long long)t.numel());
        std::abort();
      }
      for (size_t i = 0; i < t.bytes; ++i) sum += static_cast<const uint8_t*>(t.data)[i];
    }
    volatile unsigned keep = sum;
    (void)keep;
  } catch (const rotary::Error&) {
  }
  return 0;
}
