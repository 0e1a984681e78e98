// rotary/safetensors.h: files written here byte by byte (the format is small enough to spell out) read back through
// the memory map, and every way a file can be truncated or lie refused with the file, the tensor and the field.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "expect.h"
#include "rotary/safetensors.h"

namespace rotary {
namespace {

using test::expect_error;

// 8-byte little-endian header length, the header, the data. The header is padded with spaces to a multiple of 8,
// as Hugging Face's writer does, so the data is 8-byte aligned in a page-aligned map or buffer.
std::string safetensors_bytes(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

TEST(safetensors, ReadsTensorsAndMetadataThroughTheMap) {
  const std::string data = floats({1, 2, 3, 4, 5, 6}) + std::string("\x80\x3f\x00\x40", 4);  // + bf16 1.0, 2.0
  const std::string header =
      R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},)"
      R"( "b": {"dtype": "BF16", "shape": [2], "data_offsets": [24, 28]}, "__metadata__": {"format": "pt"}})";
  const auto path = std::filesystem::temp_directory_path() / ("rotary_st_" + std::to_string(::getpid()) + ".safetensors");
  { std::ofstream(path, std::ios::binary) << safetensors_bytes(header, data); }
  const SafetensorsFile f = SafetensorsFile::open(path.string());
  std::filesystem::remove(path);  // the mapping outlives the name
  ASSERT_EQ(f.tensors().size(), 2u);
  const SafetensorsTensor& w = f.get("w", {2, 3});
  EXPECT_EQ(w.dtype, DType::F32);
  EXPECT_EQ(w.numel(), 6);
  float last = 0;
  std::memcpy(&last, static_cast<const char*>(w.data) + 5 * sizeof(float), sizeof last);
  EXPECT_EQ(last, 6.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.data) % 8, 0u);  // padded header: aligned data
  const SafetensorsTensor& b = f.get("b", {2});
  EXPECT_EQ(b.dtype, DType::BF16);
  EXPECT_EQ(load_as_double(b.data, DType::BF16, 0), 1.0);
  EXPECT_EQ(load_as_double(b.data, DType::BF16, 1), 2.0);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.find("missing"), nullptr);
  expect_error([&] { f.get("missing", {1}); }, "tensor missing is missing");
  expect_error([&] { f.get("w", {3, 2}); }, {"tensor w shape = [2, 3]", "[3, 2]"});
}

TEST(safetensors, TruncatedOrLyingFilesAreRefusedByField) {
  const std::string ok = R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  const std::string data = floats({1, 2});
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(safetensors_bytes(ok, data), "t"));
  expect_error([] { SafetensorsFile::from_bytes("abc", "t"); }, "t: file size = 3");
  std::string lying_length = safetensors_bytes(ok, data);
  lying_length[0] = char(0xff), lying_length[1] = char(0xff);
  expect_error([&] { SafetensorsFile::from_bytes(lying_length, "t"); }, {"t: header length", "truncated"});
  expect_error([&] { SafetensorsFile::from_bytes(safetensors_bytes(ok, data.substr(0, 4)), "t"); },
               {"tensor w data_offsets", "<= 4"});  // data cut short
  auto refused = [&](const std::string& header, std::initializer_list<std::string> parts) {
    expect_error([&] { SafetensorsFile::from_bytes(safetensors_bytes(header, data), "t"); }, parts);
  };
  refused(R"({"w": {"dtype": "I8", "shape": [8], "data_offsets": [0, 8]}})", {"tensor w dtype = I8", "BF16"});
  refused(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", {"tensor w data_offsets", "shape [3]"});
  refused(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", {"tensor w data_offsets", "<= 8"});
  refused(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", {"begin <= end"});
  refused(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", {"tensor w shape", "non-negative"});
  refused(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
          {"tensor w data_offsets"});  // numel overflows: refused, not wrapped
  refused(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "v": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
          {"data_offsets = overlapping"});
  refused(R"({"w": {"dtype": "F32", "shape": [2]}})", {"tensor w", "dtype, shape and data_offsets"});
  refused(R"([1, 2])", {"t: header", "JSON object"});
  refused(R"({"w": )", {"t"});  // not JSON
  refused(R"({"__metadata__": {"a": 1}})", {"__metadata__.a", "a string"});
  expect_error([] { SafetensorsFile::open("/nonexistent/x.safetensors"); },
               "safetensors file = /nonexistent/x.safetensors (No such file or directory)");
  expect_error([] { SafetensorsFile::open("/"); }, "safetensors file = / (a directory)");
}

// The format does not promise alignment: an unpadded header leaves the data at any address, which the reader
// accepts; callers copy from it with memcpy (load_as_double and typed pointers need aligned data).
TEST(safetensors, AnUnpaddedHeaderLeavesTheDataUnalignedAndStillReadable) {
  const std::string header = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";  // 61 bytes
  std::string bytes(8, '\0');
  bytes[0] = char(header.size());
  bytes += header + floats({3.5f});
  const SafetensorsFile f = SafetensorsFile::from_bytes(bytes, "t");
  const SafetensorsTensor& w = f.get("w", {1});
  EXPECT_NE(reinterpret_cast<uintptr_t>(w.data) % 4, 0u);
  float v = 0;
  std::memcpy(&v, w.data, sizeof v);
  EXPECT_EQ(v, 3.5f);
}

TEST(safetensors, EmptyTensorsAndAnEmptyFileOfTensorsAreFine) {
  const SafetensorsFile f = SafetensorsFile::from_bytes(
      safetensors_bytes(R"({"e": {"dtype": "F16", "shape": [0, 5], "data_offsets": [0, 0]}})", ""), "t");
  EXPECT_EQ(f.get("e", {0, 5}).bytes, 0u);
  EXPECT_TRUE(SafetensorsFile::from_bytes(safetensors_bytes("{}", ""), "t").tensors().empty());
}

}  // namespace
}  // namespace rotary
