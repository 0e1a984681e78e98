// Fuzz target: GgufFile::from_bytes on any bytes (a GGUF model file a user points us at, possibly truncated or
// crafted). A file is either refused with a rotary::Error or read; a file it reads is used as a loader would use
// it: every metadata value is printed (each string and array item touched) and read through the getter of its
// type and of another type (a mismatch is a rotary::Error), and every tensor must lie inside the data section with
// bytes = numel / block size x type size, offset a multiple of the alignment, no two sharing bytes; each of its
// bytes is read, so ASan sees a view past the buffer.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "rotary/error.h"
#include "rotary/gguf.h"

namespace {

[[noreturn]] void broken(const char* what, const std::string& name) {
  std::fprintf(stderr, "broken invariant: %s (%s)\n", what, name.c_str());
  std::abort();
}

unsigned touch(const rotary::GgufValue& v) {
  unsigned sum = unsigned(v.text(1 << 20).size());
  using T = rotary::GgufType;
  try {
    switch (v.type()) {
      case T::String: for (char c : v.as_string("v")) sum += unsigned(char(c)); break;
      case T::U32: sum += v.as<uint32_t>("v"); break;
      case T::F32: sum += unsigned(v.as<float>("v") != 0); break;
      case T::Array:
        if (v.array_type() == T::String)
          for (std::string_view s : v.as_array<std::string_view>("v")) sum += unsigned(s.size()) + (s.empty() ? 0 : s.back());
        else if (v.array_type() == T::I32)
          for (int32_t x : v.as_array<int32_t>("v")) sum += unsigned(x);
        else if (v.array_type() == T::F32)
          for (float x : v.as_array<float>("v")) sum += unsigned(x == 0);
        else if (v.array_type() == T::Array)
          for (const rotary::GgufValue& item : v.items()) sum += touch(item);
        break;
      default: sum += unsigned(v.as<uint64_t>("v"));  // a mismatch but for uint64
    }
  } catch (const rotary::Error&) {
  }
  try {  // a getter of the wrong type refuses
    if (v.type() != T::String) (void)v.as_string("v");
    else (void)v.as<uint32_t>("v");
    broken("a getter of another type read the value", "");
  } catch (const rotary::Error&) {
  }
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const rotary::GgufFile f =
        rotary::GgufFile::from_bytes(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    unsigned sum = 0;
    for (const rotary::GgufMetadataEntry& e : f.metadata()) {
      if (f.find(e.key) != &e.value) broken("find gives another value", std::string(e.key));
      sum += touch(e.value);
    }
    if (f.alignment() == 0 || (f.alignment() & (f.alignment() - 1)) != 0) broken("alignment", "");
    const uint64_t data_size = f.data_offset() <= size ? size - f.data_offset() : 0;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const rotary::GgufTensor& t : f.tensors()) {
      const rotary::GgmlTypeInfo* info = rotary::ggml_type_info(uint32_t(t.type));
      if (!info || t.dims.empty() || t.dims.size() > 4 || t.numel() <= 0 || t.dims[0] % info->block_size != 0 ||
          uint64_t(t.numel() / info->block_size) * uint64_t(info->type_size) != t.bytes)
        broken("type, dims or bytes", t.name);
      if (t.offset % f.alignment() != 0 || t.offset > data_size || t.bytes > data_size - t.offset)
        broken("offset", t.name);
      const auto* first = static_cast<const uint8_t*>(f.tensors()[0].data);
      if (static_cast<const uint8_t*>(t.data) - first != int64_t(t.offset) - int64_t(f.tensors()[0].offset))
        broken("data pointer", t.name);
      if (t.shape().size() != t.dims.size() || t.shape().front() != t.dims.back()) broken("shape", t.name);
      if (f.find_tensor(t.name) != &t) broken("find_tensor", t.name);
      ranges.emplace_back(t.offset, t.offset + t.bytes);
      for (size_t i = 0; i < t.bytes; ++i) sum += static_cast<const uint8_t*>(t.data)[i];
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i - 1].second > ranges[i].first) broken("overlapping tensors", "");
    volatile unsigned keep = sum;
    (void)keep;
  } catch (const rotary::Error&) {
  }
  return 0;
}
