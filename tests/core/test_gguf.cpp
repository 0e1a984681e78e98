// rotary/gguf.h: GGUF files written here byte by byte (a small writer below, not gguf-py: the format is spelled
// out), read back through the memory map - every metadata value type, nested arrays, tensors of the plain and the
// block-quantized types - and every way a file can be truncated or lie refused with the field named.
// (tests/gguf_oracle checks the reader against files gguf-py writes, where gguf-py is at hand.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "expect.h"
#include "rotary/gguf.h"

namespace rotary {
namespace {

using test::expect_error;

// ---- The writer ----------------------------------------------------------------------------------------------

template <class T> std::string le(T v) {
  std::string s(sizeof v, '\0');
  std::memcpy(s.data(), &v, sizeof v);  // x86 / ARM: little-endian, as GGUF
  return s;
}
std::string gstr(std::string_view s) { return le<uint64_t>(s.size()) + std::string(s); }
std::string tag(GgufType t) { return le<uint32_t>(uint32_t(t)); }
template <class T> std::string scalar(GgufType t, T v) { return tag(t) + le(v); }
std::string string_value(std::string_view s) { return tag(GgufType::String) + gstr(s); }
// An array's body (element type, count, items) - also what an element of an array of arrays is.
std::string array_body(GgufType elem, uint64_t n, const std::string& items) {
  return tag(elem) + le<uint64_t>(n) + items;
}
std::string array_value(GgufType elem, uint64_t n, const std::string& items) {
  return tag(GgufType::Array) + array_body(elem, n, items);
}
template <class T> std::string items(std::initializer_list<T> v) {
  std::string s;
  for (const T& x : v) s += le(x);
  return s;
}

struct Builder {
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::string data;
    std::optional<uint64_t> offset;  // a lie, where set
  };
  uint32_t version = 3;
  uint32_t alignment = 32;  // the data section's padding (the key is written by the test where it wants one)
  bool pad_end = true;      // pad after the tensor infos (a file of metadata alone may end there)
  std::optional<uint64_t> n_tensors, n_kv;
  std::vector<std::string> kvs;
  std::vector<Tensor> tensors;

  Builder& kv(std::string_view key, const std::string& typed_value) {
    kvs.push_back(gstr(key) + typed_value);
    return *this;
  }
  Builder& tensor(std::string name, std::vector<uint64_t> dims, GgmlType type, std::string data) {
    tensors.push_back({std::move(name), std::move(dims), uint32_t(type), std::move(data), std::nullopt});
    return *this;
  }
  static uint64_t align(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
  std::string bytes() const {
    std::string out = "GGUF" + le(version) + le<uint64_t>(n_tensors.value_or(tensors.size())) +
                      le<uint64_t>(n_kv.value_or(kvs.size()));
    for (const std::string& kv : kvs) out += kv;
    std::string data;
    for (const Tensor& t : tensors) {
      data.resize(align(data.size(), alignment), '\0');
      out += gstr(t.name) + le<uint32_t>(uint32_t(t.dims.size()));
      for (uint64_t d : t.dims) out += le(d);
      out += le(t.type) + le<uint64_t>(t.offset.value_or(data.size()));
      data += t.data;
    }
    if (pad_end) out.resize(align(out.size(), alignment), '\0');
    return out + data;
  }
};

// n deterministic bytes (a tensor's payload: any bytes are a valid block of any type).
std::string pattern(size_t n, unsigned seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = char((i * 131 + seed * 17 + (i >> 8)) & 0xff);
  return s;
}

GgufFile read(const std::string& bytes) { return GgufFile::from_bytes(bytes, "m.gguf"); }

// ---- Values --------------------------------------------------------------------------------------------------

TEST(gguf, EveryValueTypeReadsBackExactly) {
  for (const uint32_t version : {2u, 3u}) {
    Builder b;
    b.version = version;
    b.kv("u8", scalar<uint8_t>(GgufType::U8, 255))
        .kv("i8", scalar<int8_t>(GgufType::I8, -128))
        .kv("u16", scalar<uint16_t>(GgufType::U16, 65535))
        .kv("i16", scalar<int16_t>(GgufType::I16, -32768))
        .kv("u32", scalar<uint32_t>(GgufType::U32, 4294967295u))
        .kv("i32", scalar<int32_t>(GgufType::I32, -2147483647 - 1))
        .kv("u64", scalar<uint64_t>(GgufType::U64, 18446744073709551615ull))
        .kv("i64", scalar<int64_t>(GgufType::I64, -9223372036854775807ll - 1))
        .kv("f32", scalar<float>(GgufType::F32, 1e-38f))
        .kv("f64", scalar<double>(GgufType::F64, 0.1))
        .kv("yes", scalar<uint8_t>(GgufType::Bool, 1))
        .kv("no", scalar<uint8_t>(GgufType::Bool, 0))
        .kv("general.name", string_value("Qwen2.5 \xe2\x80\x94 0.5B"))
        .kv("empty", string_value(""))
        .kv("nul", string_value(std::string("a\0b", 3)))
        .kv("a.u8", array_value(GgufType::U8, 3, items<uint8_t>({0, 7, 255})))
        .kv("a.i8", array_value(GgufType::I8, 2, items<int8_t>({-1, 127})))
        .kv("a.u16", array_value(GgufType::U16, 2, items<uint16_t>({1, 65535})))
        .kv("a.i16", array_value(GgufType::I16, 2, items<int16_t>({-2, 300})))
        .kv("a.u32", array_value(GgufType::U32, 2, items<uint32_t>({3, 4000000000u})))
        .kv("a.i32", array_value(GgufType::I32, 3, items<int32_t>({-5, 0, 5})))
        .kv("a.u64", array_value(GgufType::U64, 1, items<uint64_t>({1ull << 60})))
        .kv("a.i64", array_value(GgufType::I64, 2, items<int64_t>({-(1ll << 60), 9})))
        .kv("a.f32", array_value(GgufType::F32, 3, items<float>({0.5f, -1.25f, 3e38f})))
        .kv("a.f64", array_value(GgufType::F64, 2, items<double>({1e300, -0.0})))
        .kv("a.bool", array_value(GgufType::Bool, 3, items<uint8_t>({1, 0, 1})))
        .kv("a.str", array_value(GgufType::String, 3, gstr("<s>") + gstr("") + gstr("\xc4\xa0the")))
        .kv("a.empty", array_value(GgufType::F32, 0, ""))
        .kv("a.nested", array_value(GgufType::Array, 2,
                                    array_body(GgufType::I32, 2, items<int32_t>({1, 2})) +
                                        array_body(GgufType::String, 1, gstr("x"))));
    const GgufFile f = read(b.bytes());
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.alignment(), 32u);
    EXPECT_EQ(f.metadata().size(), 29u);
    EXPECT_EQ(f.metadata()[0].key, "u8");
    EXPECT_EQ(f.get<uint8_t>("u8"), 255);
    EXPECT_EQ(f.get<int8_t>("i8"), -128);
    EXPECT_EQ(f.get<uint16_t>("u16"), 65535);
    EXPECT_EQ(f.get<int16_t>("i16"), -32768);
    EXPECT_EQ(f.get_u32("u32"), 4294967295u);
    EXPECT_EQ(f.get<int32_t>("i32"), -2147483647 - 1);
    EXPECT_EQ(f.get<uint64_t>("u64"), 18446744073709551615ull);
    EXPECT_EQ(f.get<int64_t>("i64"), -9223372036854775807ll - 1);
    EXPECT_EQ(f.get_f32("f32"), 1e-38f);
    EXPECT_EQ(f.get<double>("f64"), 0.1);
    EXPECT_TRUE(f.get<bool>("yes"));
    EXPECT_FALSE(f.get<bool>("no"));
    EXPECT_EQ(f.get_string("general.name"), "Qwen2.5 \xe2\x80\x94 0.5B");
    EXPECT_EQ(f.get_string("empty"), "");
    EXPECT_EQ(f.get_string("nul"), std::string_view("a\0b", 3));
    EXPECT_EQ(f.get_array<uint8_t>("a.u8"), (std::vector<uint8_t>{0, 7, 255}));
    EXPECT_EQ(f.get_array<int8_t>("a.i8"), (std::vector<int8_t>{-1, 127}));
    EXPECT_EQ(f.get_array<uint16_t>("a.u16"), (std::vector<uint16_t>{1, 65535}));
    EXPECT_EQ(f.get_array<int16_t>("a.i16"), (std::vector<int16_t>{-2, 300}));
    EXPECT_EQ(f.get_array<uint32_t>("a.u32"), (std::vector<uint32_t>{3, 4000000000u}));
    EXPECT_EQ(f.get_i32_array("a.i32"), (std::vector<int32_t>{-5, 0, 5}));
    EXPECT_EQ(f.get_array<uint64_t>("a.u64"), (std::vector<uint64_t>{1ull << 60}));
    EXPECT_EQ(f.get_array<int64_t>("a.i64"), (std::vector<int64_t>{-(1ll << 60), 9}));
    EXPECT_EQ(f.get_f32_array("a.f32"), (std::vector<float>{0.5f, -1.25f, 3e38f}));
    const std::vector<double> f64 = f.get_array<double>("a.f64");
    ASSERT_EQ(f64.size(), 2u);
    EXPECT_EQ(f64[0], 1e300);
    EXPECT_TRUE(f64[1] == 0.0 && std::signbit(f64[1]));
    EXPECT_EQ(f.get_array<bool>("a.bool"), (std::vector<bool>{true, false, true}));
    EXPECT_EQ(f.get_strings("a.str"), (std::vector<std::string_view>{"<s>", "", "\xc4\xa0the"}));
    EXPECT_TRUE(f.get_f32_array("a.empty").empty());
    const GgufValue* nested = f.find("a.nested");
    ASSERT_NE(nested, nullptr);
    EXPECT_EQ(nested->type(), GgufType::Array);
    EXPECT_EQ(nested->array_type(), GgufType::Array);
    ASSERT_EQ(nested->items().size(), 2u);
    EXPECT_EQ(nested->items()[0].as_array<int32_t>("a.nested[0]"), (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(nested->items()[1].as_array<std::string_view>("a.nested[1]"), (std::vector<std::string_view>{"x"}));
    EXPECT_EQ(nested->text(), "[[1, 2] (2 items), [\"x\"] (1 item)] (2 items)");
    EXPECT_EQ(f.find("absent"), nullptr);
    EXPECT_EQ(f.get_optional<uint32_t>("absent"), std::nullopt);
    EXPECT_EQ(f.get_optional<uint32_t>("u32"), 4294967295u);
    EXPECT_EQ(f.get_optional_string("general.name"), "Qwen2.5 \xe2\x80\x94 0.5B");
    EXPECT_TRUE(f.tensors().empty());
  }
}

TEST(gguf, GettersNameTheKeyAndTheExpectedType) {
  Builder b;
  b.kv("llama.context_length", scalar<uint32_t>(GgufType::U32, 4096))
      .kv("general.architecture", string_value("llama"))
      .kv("tokenizer.ggml.tokens", array_value(GgufType::String, 1, gstr("a")))
      .kv("tokenizer.ggml.scores", array_value(GgufType::F32, 1, items<float>({0.f})));
  const GgufFile f = read(b.bytes());
  expect_error([&] { f.get<int32_t>("llama.context_length"); },
               {"m.gguf: metadata llama.context_length type = uint32 is invalid; allowed: int32"});
  expect_error([&] { f.get<uint64_t>("llama.context_length"); }, {"llama.context_length type = uint32", "uint64"});
  expect_error([&] { f.get_u32("general.architecture"); }, {"general.architecture type = string", "uint32"});
  expect_error([&] { f.get_string("llama.context_length"); }, {"llama.context_length type = uint32", "string"});
  expect_error([&] { f.get_i32_array("tokenizer.ggml.tokens"); },
               {"tokenizer.ggml.tokens type = array of string", "allowed: array of int32"});
  expect_error([&] { f.get_strings("tokenizer.ggml.scores"); },
               {"tokenizer.ggml.scores type = array of float32", "array of string"});
  expect_error([&] { f.get_strings("general.architecture"); }, {"general.architecture type = string", "array of string"});
  expect_error([&] { f.get_f32("llama.rope.freq_base"); }, "m.gguf: metadata llama.rope.freq_base is missing");
  expect_error([&] { f.get_optional<float>("llama.context_length"); }, {"llama.context_length type = uint32", "float32"});
}

// ---- Tensors -------------------------------------------------------------------------------------------------

TEST(gguf, TypeTableHasGgmlBlocks) {
  struct Row {
    GgmlType type;
    const char* name;
    int64_t block, bytes;
  };
  // ggml-common.h: block_q4_0 (half d, 16 nibble bytes), ..., block_q8_K (float d, 256 int8, 16 int16 sums).
  for (const Row& r : {Row{GgmlType::F32, "F32", 1, 4}, Row{GgmlType::F16, "F16", 1, 2}, Row{GgmlType::BF16, "BF16", 1, 2},
                       Row{GgmlType::F64, "F64", 1, 8}, Row{GgmlType::I8, "I8", 1, 1}, Row{GgmlType::I16, "I16", 1, 2},
                       Row{GgmlType::I32, "I32", 1, 4}, Row{GgmlType::I64, "I64", 1, 8},
                       Row{GgmlType::Q4_0, "Q4_0", 32, 18}, Row{GgmlType::Q4_1, "Q4_1", 32, 20},
                       Row{GgmlType::Q5_0, "Q5_0", 32, 22}, Row{GgmlType::Q5_1, "Q5_1", 32, 24},
                       Row{GgmlType::Q8_0, "Q8_0", 32, 34}, Row{GgmlType::Q2_K, "Q2_K", 256, 84},
                       Row{GgmlType::Q3_K, "Q3_K", 256, 110}, Row{GgmlType::Q4_K, "Q4_K", 256, 144},
                       Row{GgmlType::Q5_K, "Q5_K", 256, 176}, Row{GgmlType::Q6_K, "Q6_K", 256, 210},
                       Row{GgmlType::Q8_K, "Q8_K", 256, 292}}) {
    const GgmlTypeInfo* info = ggml_type_info(uint32_t(r.type));
    ASSERT_NE(info, nullptr) << r.name;
    EXPECT_STREQ(info->name, r.name);
    EXPECT_EQ(info->block_size, r.block) << r.name;
    EXPECT_EQ(info->type_size, r.bytes) << r.name;
    EXPECT_EQ(ggml_type_name(r.type), r.name);
  }
  EXPECT_EQ(ggml_type_info(9), nullptr);   // Q8_1
  EXPECT_EQ(ggml_type_info(23), nullptr);  // IQ4_XS
  EXPECT_EQ(ggml_type_info(4), nullptr);   // removed
}

struct TensorCase {
  const char* name;
  std::vector<uint64_t> dims;
  GgmlType type;
  size_t bytes;
};

const std::vector<TensorCase>& tensor_cases() {
  static const std::vector<TensorCase> cases = {
      {"token_embd.weight", {3, 2}, GgmlType::F32, 24},       {"blk.0.attn_norm.weight", {5}, GgmlType::F16, 10},
      {"blk.0.attn_q.weight", {4, 3, 2}, GgmlType::BF16, 48},  {"blk.0.attn_k.weight", {64, 2}, GgmlType::Q4_0, 4 * 18},
      {"blk.0.attn_v.weight", {32, 3}, GgmlType::Q8_0, 3 * 34}, {"blk.0.q41", {32}, GgmlType::Q4_1, 20},
      {"blk.0.q50", {32}, GgmlType::Q5_0, 22},                 {"blk.0.q51", {32, 1, 1, 2}, GgmlType::Q5_1, 2 * 24},
      {"blk.0.ffn_up.weight", {256, 2}, GgmlType::Q4_K, 2 * 144}, {"blk.0.ffn_down.weight", {512}, GgmlType::Q6_K, 2 * 210},
      {"blk.0.q2k", {256}, GgmlType::Q2_K, 84},                {"blk.0.q3k", {256}, GgmlType::Q3_K, 110},
      {"blk.0.q5k", {256}, GgmlType::Q5_K, 176},               {"blk.0.q8k", {256}, GgmlType::Q8_K, 292},
      {"output.f64", {2}, GgmlType::F64, 16},                  {"ids", {3}, GgmlType::I32, 12},
  };
  return cases;
}

Builder tensors_file(uint32_t alignment) {
  Builder b;
  b.alignment = alignment;
  b.kv("general.architecture", string_value("llama"));
  if (alignment != 32) b.kv("general.alignment", scalar<uint32_t>(GgufType::U32, alignment));
  unsigned seed = 0;
  for (const TensorCase& c : tensor_cases()) b.tensor(c.name, c.dims, c.type, pattern(c.bytes, ++seed));
  return b;
}

TEST(gguf, TensorsOfEveryTypeReadBackInPlace) {
  for (const uint32_t alignment : {32u, 64u, 8u}) {
    const Builder b = tensors_file(alignment);
    const std::string bytes = b.bytes();
    const auto path =
        std::filesystem::temp_directory_path() / ("rotary_gguf_" + std::to_string(::getpid()) + ".gguf");
    { std::ofstream(path, std::ios::binary) << bytes; }
    const GgufFile f = GgufFile::open(path.string());
    std::filesystem::remove(path);  // the mapping outlives the name
    EXPECT_EQ(f.alignment(), alignment);
    EXPECT_EQ(f.data_offset() % alignment, 0u);
    EXPECT_EQ(f.source(), path.string());
    ASSERT_EQ(f.tensors().size(), tensor_cases().size());
    unsigned seed = 0;
    for (size_t i = 0; i < tensor_cases().size(); ++i) {
      const TensorCase& c = tensor_cases()[i];
      const GgufTensor& t = f.tensors()[i];
      SCOPED_TRACE(c.name);
      EXPECT_EQ(t.name, c.name);
      EXPECT_EQ(t.type, c.type);
      EXPECT_EQ(t.dims, std::vector<int64_t>(c.dims.begin(), c.dims.end()));
      EXPECT_EQ(t.shape(), std::vector<int64_t>(c.dims.rbegin(), c.dims.rend()));
      EXPECT_EQ(t.bytes, c.bytes);
      EXPECT_EQ(t.offset % alignment, 0u);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % alignment, 0u);  // page-aligned map, aligned offsets
      EXPECT_EQ(std::string(static_cast<const char*>(t.data), t.bytes), pattern(c.bytes, ++seed));
      EXPECT_EQ(static_cast<const char*>(t.data) - static_cast<const char*>(f.tensors()[0].data),
                int64_t(t.offset - f.tensors()[0].offset));
      EXPECT_EQ(f.find_tensor(c.name), &t);
    }
    // A [3 x 2] matrix in GGUF's dims is 2 rows of 3: row-major shape [2, 3].
    const GgufTensor& e = f.get_tensor("token_embd.weight", {2, 3});
    float v[6];
    std::memcpy(v, e.data, sizeof v);
    EXPECT_EQ(std::memcmp(v, pattern(24, 1).data(), 24), 0);
    EXPECT_EQ(f.find_tensor("missing"), nullptr);
    expect_error([&] { f.get_tensor("missing", {1}); }, "tensor missing is missing");
    expect_error([&] { f.get_tensor("token_embd.weight", {3, 2}); },
                 {"tensor token_embd.weight shape = [2, 3] is invalid; allowed: [3, 2]"});
  }
}

TEST(gguf, MovedFileKeepsItsViews) {
  GgufFile a = read(tensors_file(32).bytes());
  const void* data = a.tensors()[3].data;
  const std::string_view arch = a.get_string("general.architecture");
  GgufFile b = std::move(a);
  EXPECT_EQ(b.tensors()[3].data, data);
  EXPECT_EQ(b.get_string("general.architecture").data(), arch.data());
  EXPECT_EQ(b.find("general.architecture")->as_string("x"), "llama");
}

// ---- Refusals ------------------------------------------------------------------------------------------------

void refused(const std::string& bytes, std::initializer_list<std::string> parts) {
  expect_error([&] { read(bytes); }, parts);
}

TEST(gguf, HeaderLiesAreRefusedByField) {
  refused("", {"m.gguf: magic = \"\" is invalid", "\"GGUF\""});
  expect_error([] { GgufFile::open("/nonexistent/m.gguf"); }, {"GGUF file = /nonexistent/m.gguf", "a readable regular file"});
  expect_error([] { GgufFile::open("/tmp"); }, {"GGUF file = /tmp", "a readable regular file"});
  const auto empty = std::filesystem::temp_directory_path() / ("rotary_gguf_empty_" + std::to_string(::getpid()));
  { std::ofstream(empty, std::ios::binary) << ""; }
  expect_error([&] { GgufFile::open(empty.string()); }, {empty.string() + ": magic = \"\" is invalid"});
  std::filesystem::remove(empty);
  refused("GGML\x03", {"magic = \"GGML\"", "not GGUF"});
  Builder b;
  b.kv("general.architecture", string_value("llama"));
  const std::string ok = b.bytes();
  EXPECT_NO_THROW(read(ok));
  for (const uint32_t v : {0u, 1u, 4u}) {
    Builder bad = b;
    bad.version = v;
    refused(bad.bytes(), {"version = " + std::to_string(v) + " is invalid; allowed: 2 or 3"});
  }
  Builder big = b;
  big.version = 0x03000000;  // a big-endian file's 3
  refused(big.bytes(), {"version = 50331648", "big-endian"});
  refused(ok.substr(0, 10), {"tensor count = cut off at byte 8", "complete file"});
  Builder kv = b;
  kv.n_kv = 1ull << 62;
  refused(kv.bytes(), {"metadata count = 4611686018427387904 is invalid", "14+ bytes each"});
  kv.n_kv = ~0ull;
  refused(kv.bytes(), {"metadata count = 18446744073709551615"});
  Builder tc = b;
  tc.n_tensors = (1ull << 63) + 5;
  refused(tc.bytes(), {"tensor count = 9223372036854775813 is invalid", "33+ bytes each"});
  Builder more = b;
  more.n_kv = 2;  // one more key than the file holds
  refused(more.bytes(), {"metadata key #1 = \"\"", "non-empty key"});  // the padding's zeros
  more.pad_end = false;
  refused(more.bytes(), {"metadata key #1 length = cut off at byte 69"});
}

TEST(gguf, MetadataLiesAreRefusedByField) {
  auto one = [](std::string_view key, const std::string& value) {
    Builder b;
    b.pad_end = false;  // the value is the last thing in the file
    b.kv(key, value);
    return b.bytes();
  };
  // A string length past the end of the file, in a value, a key and an array item.
  std::string past = one("general.name", tag(GgufType::String) + le<uint64_t>(1000) + "abc");
  refused(past, {"metadata general.name length = 1000 is invalid", "bytes left in the file", "truncated"});
  refused(one("general.name", tag(GgufType::String) + le<uint64_t>(~0ull)), {"metadata general.name length = 18446744073709551615"});
  {
    Builder b;
    b.pad_end = false;
    b.kvs.push_back(le<uint64_t>(1ull << 40) + "general.name");
    refused(b.bytes(), {"metadata key #0 length = 1099511627776 is invalid"});
  }
  refused(one("tokenizer.ggml.tokens", array_value(GgufType::String, 2, gstr("a") + le<uint64_t>(99) + "b")),
          {"metadata tokenizer.ggml.tokens[1] length = 99 is invalid"});
  // Counts that overflow or that the file cannot hold.
  refused(one("tokenizer.ggml.scores", array_value(GgufType::F32, 1ull << 62, items<float>({1.f}))),
          {"metadata tokenizer.ggml.scores array length = 4611686018427387904 is invalid", "items of float32"});
  refused(one("tokenizer.ggml.tokens", array_value(GgufType::String, ~0ull, gstr("a"))),
          {"tokenizer.ggml.tokens array length = 18446744073709551615", "items of string"});
  refused(one("x", array_value(GgufType::I32, 3, items<int32_t>({1, 2}))), {"metadata x array length = 3", "items of int32"});
  refused(one("x", tag(GgufType::U64) + "abc"), {"metadata x = cut off", "8 bytes needed, 3 left"});
  // Types.
  refused(one("x", le<uint32_t>(13) + "abcd"), {"metadata x value type = 13 is invalid", "0 to 12"});
  refused(one("x", array_value(GgufType(77), 1, "abcd")), {"metadata x array type = 77 is invalid"});
  refused(one("x", scalar<uint8_t>(GgufType::Bool, 2)), {"metadata x = 2 is invalid; allowed: 0 or 1"});
  refused(one("x", array_value(GgufType::Bool, 2, items<uint8_t>({0, 9}))), {"metadata x = 9 (item 1)", "0 or 1"});
  // Nesting.
  std::string nested = array_body(GgufType::I32, 0, "");
  for (int i = 0; i < 16; ++i) nested = array_body(GgufType::Array, 1, nested);
  refused(one("deep", tag(GgufType::Array) + nested), {"array nesting = 17 is invalid", "at most 16 arrays"});
  // Keys.
  {
    Builder b;
    b.kv("general.name", string_value("a")).kv("general.name", string_value("b"));
    refused(b.bytes(), {"metadata key #1 = \"general.name\" is invalid", "appear once", "also key #0"});
  }
  refused(one("", string_value("a")), {"metadata key #0 = \"\"", "a non-empty key"});
  // general.alignment: a uint32 power of two.
  refused(one("general.alignment", scalar<uint32_t>(GgufType::U32, 48)),
          {"metadata general.alignment = 48 is invalid; allowed: a power of two"});
  refused(one("general.alignment", scalar<uint32_t>(GgufType::U32, 0)), {"general.alignment = 0", "power of two"});
  refused(one("general.alignment", scalar<uint64_t>(GgufType::U64, 32)),
          {"metadata general.alignment type = uint64 is invalid; allowed: uint32"});
}

TEST(gguf, TensorLiesAreRefusedByField) {
  auto with = [](std::vector<uint64_t> dims, GgmlType type, size_t bytes) {
    Builder b;
    b.tensor("w", std::move(dims), type, pattern(bytes, 1));
    return b;
  };
  EXPECT_NO_THROW(read(with({64, 2}, GgmlType::Q4_0, 72).bytes()));
  refused(with({64, 2}, GgmlType::Q4_0, 71).bytes(),
          {"tensor w offset = 0 (+ 72 bytes of Q4_0 [64, 2]) is invalid", "inside the 71 bytes of the data section"});
  refused(with({}, GgmlType::F32, 4).bytes(), {"tensor w n_dims = 0 is invalid; allowed: 1 to 4"});
  refused(with({1, 1, 1, 1, 1}, GgmlType::F32, 4).bytes(), {"tensor w n_dims = 5", "1 to 4"});
  refused(with({4, 0}, GgmlType::F32, 4).bytes(), {"tensor w dims[1] = 0 is invalid; allowed: 1 to 2^63 - 1"});
  refused(with({1ull << 63}, GgmlType::F32, 4).bytes(), {"tensor w dims[0] = 9223372036854775808"});
  refused(with({1ull << 32, 1ull << 32}, GgmlType::F32, 4).bytes(),
          {"tensor w element count = [4294967296, 4294967296] (past 2^63)"});
  refused(with({1ull << 62}, GgmlType::F32, 4).bytes(), {"tensor w bytes = [4611686018427387904] F32 (past 2^63)"});
  refused(with({48}, GgmlType::Q8_0, 34).bytes(),
          {"tensor w dims[0] = 48 is invalid; allowed: a multiple of 32, the block size of Q8_0"});
  refused(with({4}, GgmlType(23), 4).bytes(), {"tensor w type = 23 (IQ4_XS) is invalid; allowed: one of F32 (0)", "Q4_K (12)", "BF16 (30)"});
  refused(with({4}, GgmlType(1000), 4).bytes(), {"tensor w type = 1000 (not a ggml type)", "Q6_K (14)"});
  Builder mis = with({4}, GgmlType::F32, 16);
  mis.tensors[0].offset = 16;
  refused(mis.bytes(), {"tensor w offset = 16 is invalid; allowed: a multiple of the alignment 32"});
  Builder far = with({4}, GgmlType::F32, 16);
  far.tensors[0].offset = 1ull << 63;
  refused(far.bytes(), {"tensor w offset = 9223372036854775808", "inside the 16 bytes"});
  Builder lie = with({4}, GgmlType::F32, 16);
  lie.tensors[0].offset = ~0ull << 5;  // aligned, and offset + bytes would wrap
  refused(lie.bytes(), {"tensor w offset = 18446744073709551584", "inside the 16 bytes"});
  // Overlap: two tensors at the same offset, or one inside another's bytes.
  Builder two;
  two.tensor("a", {16}, GgmlType::F32, pattern(64, 1)).tensor("b", {8}, GgmlType::F32, pattern(32, 2));
  EXPECT_NO_THROW(read(two.bytes()));
  two.tensors[1].offset = 32;
  refused(two.bytes(), {"tensor b offset = 32 (inside tensor a at [0, 64))", "ranges that do not overlap"});
  two.tensors[1].offset = 0;
  refused(two.bytes(), {"offset = 0 (inside tensor", "do not overlap"});
  Builder dup;
  dup.tensor("w", {4}, GgmlType::F32, pattern(16, 1)).tensor("w", {4}, GgmlType::F32, pattern(16, 2));
  refused(dup.bytes(), {"tensor #1 name = \"w\" is invalid", "appear once", "also tensor #0"});
  Builder unnamed = with({4}, GgmlType::F32, 16);
  unnamed.tensors[0].name = "";
  refused(unnamed.bytes(), {"tensor #0 name = \"\"", "non-empty name"});
  // Cut off anywhere in the tensor infos or the padding.
  const std::string ok = with({4, 2}, GgmlType::F32, 32).bytes();
  for (size_t n = 24; n < ok.size(); ++n) EXPECT_THROW(read(ok.substr(0, n)), Error) << n;
  refused(ok.substr(0, 40), {"tensor count = 1 is invalid", "33+ bytes each in the 16 bytes left"});
  refused(ok.substr(0, 60), {"tensor w offset = cut off at byte 57"});
  refused(ok.substr(0, ok.size() - 33), {"data section start", "padding after the tensor infos is cut off"});
}

TEST(gguf, EveryTruncationAndByteFlipIsReadOrRefused) {
  // Whatever a damaged file holds, the reader reads it or throws rotary::Error; what it reads lies inside the bytes.
  const std::string ok = tensors_file(32).bytes();
  for (size_t n = 0; n < ok.size(); n += 7) {
    try {
      read(ok.substr(0, n));
    } catch (const Error&) {
    }
  }
  for (size_t i = 0; i < ok.size() - 600; ++i) {
    std::string bad = ok;
    bad[i] = char(bad[i] ^ 0x80);
    try {
      const GgufFile f = read(bad);
      for (const GgufTensor& t : f.tensors()) ASSERT_LE(t.offset + t.bytes, bad.size() - f.data_offset()) << i;
    } catch (const Error&) {
    }
  }
}

// The fuzz target's seeds (fuzz/corpus/gguf, written by fuzz/gguf_seeds.py) are read whole.
TEST(gguf, FuzzSeedsStillRead) {
  const std::filesystem::path dir = std::filesystem::path(ROTARY_SOURCE_DIR) / "fuzz" / "corpus" / "gguf";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("bad_", 0) == 0) continue;  // refused on purpose
    SCOPED_TRACE(e.path().string());
    const GgufFile f = GgufFile::open(e.path().string());
    EXPECT_FALSE(f.metadata().empty());
    ++n;
  }
  EXPECT_GE(n, 2);
}

}  // namespace
}  // namespace rotary
