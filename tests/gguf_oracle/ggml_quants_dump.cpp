// tests/gguf_oracle/ggml_quants_dump.cpp: rotary's ggml block quantizers and float64 dequantization reference
// (rotary/ggml_quants.h) on files, for the oracle (test_ggml_quants_oracle.py) to compare with gguf-py and with
// llama.cpp's own C (llama_quants.c, the same interface):
//   ggml_quants_dump quantize TYPE IN OUT     IN: float32 values (raw, little-endian); OUT: the blocks
//   ggml_quants_dump dequantize TYPE IN OUT   IN: blocks; OUT: float64 values (ggml_dequantize_reference)
// TYPE is a ggml type name (Q4_K, F16, ...). A refused input prints the rotary::Error on stderr and exits 1.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "rotary/error.h"
#include "rotary/ggml_quants.h"

namespace {

std::vector<char> read_all(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw rotary::Error(std::string("cannot read ") + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const char* path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), std::streamsize(bytes));
  if (!out) throw rotary::Error(std::string("cannot write ") + path);
}

rotary::GgmlType type_named(const std::string& name) {
  for (uint32_t id = 0; id < 256; ++id)
    if (const rotary::GgmlTypeInfo* t = rotary::ggml_type_info(id); t && name == t->name) return rotary::GgmlType(id);
  throw rotary::Error("unknown type " + name);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: ggml_quants_dump quantize|dequantize TYPE IN OUT\n");
    return 2;
  }
  try {
    const std::string mode = argv[1];
    const rotary::GgmlType type = type_named(argv[2]);
    const rotary::GgmlTypeInfo& info = *rotary::ggml_type_info(uint32_t(type));
    const std::vector<char> in = read_all(argv[3]);
    if (mode == "quantize") {
      const int64_t n = int64_t(in.size() / sizeof(float));
      std::vector<float> x(static_cast<size_t>(n));
      std::copy(in.begin(), in.begin() + int64_t(n * sizeof(float)), reinterpret_cast<char*>(x.data()));
      std::vector<uint8_t> blocks(static_cast<size_t>(rotary::ggml_row_bytes(type, n)));
      rotary::ggml_quantize(type, x.data(), n, blocks.data());
      write_all(argv[4], blocks.data(), blocks.size());
    } else if (mode == "dequantize") {
      const int64_t n = int64_t(in.size()) / info.type_size * info.block_size;
      std::vector<double> out(static_cast<size_t>(n));
      rotary::ggml_dequantize_reference(type, in.data(), n, out.data());
      write_all(argv[4], out.data(), out.size() * sizeof(double));
    } else {
      throw rotary::Error("unknown mode " + mode);
    }
  } catch (const rotary::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
