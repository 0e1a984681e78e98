// A GGUF file as a model (rotary_engine/gguf_model.h): the checkpoint fixtures written as GGUF files here (a small
// writer of the format, llama.cpp's tensor names, the q and k rows of llama models permuted as llama.cpp's converter
// permutes them, Llama 3.1's scaling as the rope_freqs tensor) and checked against the same fixture's directory -
// the same description as config.json, the same logits for the stored types, for bf16 and for Q8_0 against the
// directory's --weights q8 - and what open_gguf_model refuses, by key or tensor.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "expect_error.h"
#include "hf_fixtures.h"
#include "rotary/dtype.h"
#include "rotary/ggml_quants.h"
#include "rotary/gguf.h"
#include "rotary/linear.h"
#include "rotary/safetensors.h"
#include "rotary_engine/gguf_model.h"
#include "rotary_engine/hf_model.h"

namespace rotary::test {
namespace {

namespace fs = std::filesystem;
using engine::HfModelDescription;

// The GGUF format, version 3, as gguf-py writes it: metadata, tensor infos (dims innermost first), data aligned to
// 32 bytes.
class GgufWriter {
 public:
  void add_string(const std::string& key, const std::string& v) { header(key, GgufType::String), str(kv_, v); }
  void add_u32(const std::string& key, uint32_t v) { header(key, GgufType::U32), raw(kv_, &v, 4); }
  void add_f32(const std::string& key, float v) { header(key, GgufType::F32), raw(kv_, &v, 4); }
  // A tensor of row-major `shape` and its bytes.
  void add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& shape, std::string bytes) {
    tensors_.push_back({name, type, shape, std::move(bytes)});
  }
  void remove_tensor(const std::string& name) {
    std::erase_if(tensors_, [&](const Tensor& t) { return t.name == name; });
  }
  std::string bytes() const {
    std::string out = "GGUF";
    const uint32_t version = 3;
    const uint64_t n_tensors = tensors_.size();
    raw(out, &version, 4), raw(out, &n_tensors, 8), raw(out, &n_kv_, 8);
    out += kv_;
    uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
      str(out, t.name);
      const uint32_t n_dims = uint32_t(t.shape.size());
      raw(out, &n_dims, 4);
      for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) raw(out, &*d, 8);
      raw(out, &t.type, 4), raw(out, &offset, 8);
      offset += (t.bytes.size() + 31) / 32 * 32;
    }
    out.resize((out.size() + 31) / 32 * 32, '\0');
    for (const Tensor& t : tensors_) out += t.bytes, out.resize((out.size() + 31) / 32 * 32, '\0');
    return out;
  }

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  static void raw(std::string& o, const void* p, size_t n) { o.append(static_cast<const char*>(p), n); }
  static void str(std::string& o, const std::string& s) {
    const uint64_t n = s.size();
    raw(o, &n, 8), o += s;
  }
  void header(const std::string& key, GgufType type) {
    str(kv_, key), raw(kv_, &type, 4), ++n_kv_;
  }
  std::string kv_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

// How the fixture's matrices are written: as stored (their safetensors dtype), as bf16, or as Q8_0 (made by the
// engine's own quantize_q8, so that the file holds exactly the quants --weights q8 makes of the directory). The
// matrices the engine converts with --weights (every 2-D tensor but an untied embedding) take the type; vectors and
// an untied embedding stay as stored.
// Blocks: llama.cpp's blocks of fixture_gguf's `blocks` type (Q4_0, Q4_1, Q5_0, Q5_1: ggml_quantize, its quantizer's
// bytes); BlockValues: f32 tensors holding exactly the values those blocks decode to (ggml_dequantize_reference).
enum class Written { AsStored, Bf16, Q8_0, Blocks, BlockValues };

// ggml's order of a llama q or k matrix's rows (or bias) per head: the pairs (i, i + d/2) adjacent, as llama.cpp's
// converter writes them for its interleaved rope.
std::string permute_rows(const std::string& bytes, int64_t rows, int64_t heads) {
  const size_t row_bytes = bytes.size() / size_t(rows);
  const int64_t half = rows / heads / 2;
  std::string out(bytes.size(), '\0');
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t part = 0; part < 2; ++part) {
        const int64_t from = h * 2 * half + part * half + i, to = h * 2 * half + 2 * i + part;
        std::memcpy(&out[size_t(to) * row_bytes], &bytes[size_t(from) * row_bytes], row_bytes);
      }
  return out;
}

GgmlType ggml_of(DType t) {
  return t == DType::F32 ? GgmlType::F32 : t == DType::F16 ? GgmlType::F16 : GgmlType::BF16;
}

// The fixture `family` as a GGUF writer (the metadata llama.cpp's converter writes for it), matrices `written`
// (Blocks, BlockValues: as `blocks`, a 32-value block type - the fixtures' rows are 32 or 64 wide).
GgufWriter fixture_gguf(const std::string& family, Written written, GgmlType blocks_type = GgmlType::Q4_0) {
  const HfModelDescription d = engine::read_hf_model_file((kFixtures / family).string());
  const SafetensorsCheckpoint st = SafetensorsCheckpoint::open((kFixtures / family).string());
  const std::string arch = d.model_type == "qwen2" ? "qwen2" : "llama";
  const engine::Architecture& a = d.arch;
  GgufWriter w;
  w.add_string("general.architecture", arch);
  w.add_u32(arch + ".context_length", uint32_t(d.rope.max_position_embeddings));
  w.add_u32(arch + ".embedding_length", uint32_t(a.d_model));
  w.add_u32(arch + ".feed_forward_length", uint32_t(a.d_ff));
  w.add_u32(arch + ".block_count", uint32_t(a.n_layers));
  w.add_u32(arch + ".attention.head_count", uint32_t(a.n_heads));
  w.add_u32(arch + ".attention.head_count_kv", uint32_t(a.n_kv_heads));
  if (a.head_dim * a.n_heads != a.d_model) w.add_u32(arch + ".attention.key_length", uint32_t(a.head_dim));
  w.add_f32(arch + ".rope.freq_base", float(d.rope.base));
  w.add_f32(arch + ".attention.layer_norm_rms_epsilon", float(a.norm_eps));
  if (arch == "llama") w.add_u32(arch + ".rope.dimension_count", uint32_t(d.rope.rotary_dim_resolved()));
  if (d.rope.scaling == RopeScaling::Yarn) {
    w.add_string(arch + ".rope.scaling.type", "yarn");
    w.add_f32(arch + ".rope.scaling.factor", float(d.rope.factor));
    w.add_u32(arch + ".rope.scaling.original_context_length", uint32_t(d.rope.original_max_position_embeddings));
  }
  if (d.rope.scaling == RopeScaling::Llama3) {
    // llama.cpp's converter: the per-pair divisors of the unscaled frequencies, in float32.
    RopeSpec plain = d.rope;
    plain.scaling = RopeScaling::None;
    const std::vector<double> scaled = d.rope.freqs().inv_freq, unscaled = plain.freqs().inv_freq;
    std::string bytes;
    for (size_t i = 0; i < scaled.size(); ++i) {
      const float f = float(unscaled[i] / scaled[i]);
      bytes.append(reinterpret_cast<const char*>(&f), 4);
    }
    w.add_tensor("rope_freqs.weight", GgmlType::F32, {int64_t(scaled.size())}, bytes);
  }
  const std::vector<engine::HfTensorName> hf = engine::hf_tensor_names(d), gg = engine::gguf_tensor_names(d);
  for (size_t i = 0; i < hf.size(); ++i) {
    const SafetensorsTensor& t = st.get(hf[i].stored, hf[i].slot.shape);
    std::string bytes(static_cast<const char*>(t.data), t.bytes);
    GgmlType type = ggml_of(t.dtype);
    const int64_t rows = t.shape[0];
    const bool converted = t.shape.size() == 2 && (hf[i].slot.part != "embed" || a.tie_embeddings);
    if (converted && written == Written::Bf16) {
      std::string out(size_t(rows * t.shape[1] * 2), '\0');
      for (int64_t k = 0; k < rows * t.shape[1]; ++k) store_from_double(out.data(), DType::BF16, k, load_as_double(t.data, t.dtype, k));
      bytes = out, type = GgmlType::BF16;
    }
    if (converted && written == Written::Q8_0) {
      const int64_t cols = t.shape[1], blocks = rows * cols / kQ8Block;
      std::vector<int8_t> quants(size_t(rows * cols));
      std::vector<uint16_t> scales(static_cast<size_t>(blocks));
      quantize_q8(t.data, t.dtype, rows, cols, cols, quants.data(), scales.data(), 1);
      bytes.assign(size_t(blocks * 34), '\0');
      for (int64_t b = 0; b < blocks; ++b) {
        std::memcpy(&bytes[size_t(b * 34)], &scales[size_t(b)], 2);
        std::memcpy(&bytes[size_t(b * 34 + 2)], &quants[size_t(b * kQ8Block)], kQ8Block);
      }
      type = GgmlType::Q8_0;
    }
    if (converted && (written == Written::Blocks || written == Written::BlockValues)) {
      const int64_t cols = t.shape[1];
      std::vector<float> row(static_cast<size_t>(cols));
      std::string blocks(size_t(ggml_row_bytes(blocks_type, cols)), '\0'), out;
      std::vector<double> values(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) row[size_t(c)] = float(load_as_double(t.data, t.dtype, r * cols + c));
        ggml_quantize(blocks_type, row.data(), cols, blocks.data());
        if (written == Written::Blocks) {
          out += blocks;
          continue;
        }
        ggml_dequantize_reference(blocks_type, blocks.data(), cols, values.data());
        for (double v : values) {
          const float f = float(v);
          out.append(reinterpret_cast<const char*>(&f), 4);
        }
      }
      bytes = out, type = written == Written::Blocks ? blocks_type : GgmlType::F32;
    }
    const std::string& part = hf[i].slot.part;
    if (arch == "llama" && (part == "q" || part == "k"))
      bytes = permute_rows(bytes, rows, part == "q" ? a.n_heads : a.n_kv_heads);
    w.add_tensor(gg[i].stored, type, t.shape, bytes);
  }
  return w;
}

// The writer's bytes as a file of the test's temporary directory (removed with the directory).
std::string write_file(const GgufWriter& w, const std::string& name) {
  struct TempDir {
    fs::path path = fs::temp_directory_path() / ("rotary_test_gguf_model." + std::to_string(getpid()));
    TempDir() { fs::create_directories(path); }
    ~TempDir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const TempDir dir;
  const fs::path path = dir.path / name;
  std::ofstream(path, std::ios::binary) << w.bytes();
  return path.string();
}

const char* const kGgufFamilies[] = {"llama2", "llama3", "mistral", "qwen2"};
class GgufFixture : public ::testing::TestWithParam<const char*> {};

// The metadata gives config.json's architecture and rotation: every field, and the rotation's frequencies. Two
// differences, both llama.cpp's: a llama file's pairs are adjacent (its q and k rows permuted to match), and Llama
// 3.1's scaling is the file's float32 per-pair factors (the frequencies within float32 rounding of the factors;
// the trained context is then context_length, which is all the file says).
TEST_P(GgufFixture, DescriptionEqualsConfigJson) {
  const std::string family = GetParam();
  const HfModelDescription hf = engine::read_hf_model_file((kFixtures / family).string());
  const GgufFile file = GgufFile::open(write_file(fixture_gguf(family, Written::AsStored), family + ".gguf"));
  const HfModelDescription gg = engine::read_gguf_model(file);
  const engine::Architecture &a = hf.arch, &b = gg.arch;
  EXPECT_EQ(gg.model_type, family == "qwen2" ? "qwen2" : "llama");
  using A = engine::Architecture;
  for (auto [name, field] : {std::pair{"vocab_size", &A::vocab_size}, {"d_model", &A::d_model},
                             {"n_layers", &A::n_layers}, {"n_heads", &A::n_heads}, {"n_kv_heads", &A::n_kv_heads},
                             {"head_dim", &A::head_dim}, {"d_ff", &A::d_ff}, {"sliding_window", &A::sliding_window}})
    EXPECT_EQ(b.*field, a.*field) << name;
  for (auto [name, field] : {std::pair{"qkv_bias", &A::qkv_bias}, {"out_bias", &A::out_bias},
                             {"mlp_bias", &A::mlp_bias}, {"tie_embeddings", &A::tie_embeddings}})
    EXPECT_EQ(b.*field, a.*field) << name;
  EXPECT_EQ(b.norm, a.norm);
  EXPECT_EQ(b.mlp, a.mlp);
  EXPECT_EQ(b.norm_eps, double(float(a.norm_eps)));  // GGUF stores float32
  const RopeSpec &r = hf.rope, &s = gg.rope;
  EXPECT_EQ(s.layout, family == "qwen2" ? RopeLayout::HalfSplit : RopeLayout::Interleaved);
  EXPECT_EQ(s.head_dim, r.head_dim);
  EXPECT_EQ(s.rotary_dim_resolved(), r.rotary_dim_resolved());
  EXPECT_EQ(s.base, r.base);
  EXPECT_EQ(s.max_position_embeddings, r.max_position_embeddings);
  const std::vector<double> want = r.freqs().inv_freq, got = s.freqs().inv_freq;
  ASSERT_EQ(got.size(), want.size());
  if (r.scaling == RopeScaling::Llama3) {
    EXPECT_EQ(s.scaling, RopeScaling::Explicit);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], want[i] * 0x1p-23) << "pair " << i;
    EXPECT_EQ(gg.trained_context, r.max_position_embeddings);
  } else {
    EXPECT_EQ(s.scaling, r.scaling);
    EXPECT_EQ(s.factor, r.factor);
    EXPECT_EQ(s.original_max_position_embeddings, r.original_max_position_embeddings);
    EXPECT_EQ(s.yarn.beta_fast, r.yarn.beta_fast);
    EXPECT_EQ(s.yarn.beta_slow, r.yarn.beta_slow);
    EXPECT_EQ(s.attention_factor, r.attention_factor);
    EXPECT_EQ(got, want);
    EXPECT_EQ(s.freqs().attention_factor, r.freqs().attention_factor);
    EXPECT_EQ(gg.trained_context, hf.trained_context);
  }
}

// Logits of the fixture's stored tokens (a 5-token prompt, then one token at a time) through the directory and the
// GGUF file. The rotation: qwen2 runs the same layout on the same rows - the same bits; a llama file rotates the
// same numbers in adjacent pairs, and the attention sums q.k over the features in that order, so its logits agree to
// float32 rounding (the bound of two float32 implementations, kTolF32Pair); Llama 3.1's factors are float32 too.
// `tolerance` > 0: the two run different kernels whose roundings may move an 8-bit activation (q8 activations), so
// the logits agree within that relative error instead.
void expect_same_logits(const std::string& family, Written written, const engine::LoadOptions& dir_options,
                        const engine::LoadOptions& gguf_options, const std::string& name, double tolerance = 0) {
  const engine::HfModel dir = engine::open_hf_model((kFixtures / family).string(), dir_options);
  const engine::HfModel gguf = engine::open_model(write_file(fixture_gguf(family, written), name), gguf_options);
  const std::vector<int64_t> tokens = read_expected(kFixtures / family).tokens;
  const std::vector<double> want = engine_logits(dir.model, dir.description.positions(), tokens, 5);
  const std::vector<double> got = engine_logits(gguf.model, gguf.description.positions(), tokens, 5);
  ASSERT_EQ(got.size(), want.size());
  if (tolerance > 0) {
    EXPECT_LT(relative_error(got, want), tolerance) << name;
  } else if (family == "qwen2") {
    EXPECT_EQ(got, want) << name;
  } else {
    const double err = relative_error(got, want);
    EXPECT_LT(err, kTolF32Pair) << name;
  }
  // (Q8_0 runs in place as its blocks unless asked to convert; the same numbers as the directory's q8)
  EXPECT_EQ(gguf.model->matrix_format(), written == Written::Q8_0 && !gguf_options.weights ? WeightFormat::Q8_0
                                                                                            : dir.model->matrix_format())
      << name;
}

TEST_P(GgufFixture, StoredTypesGiveTheDirectorysLogits) {
  const std::string family = GetParam();
  expect_same_logits(family, Written::AsStored, {}, {}, family + "_stored.gguf");
}

TEST_P(GgufFixture, Bf16GivesTheDirectorysBf16Logits) {
  const std::string family = GetParam();
  expect_same_logits(family, Written::Bf16, {.weights = WeightFormat::BF16}, {}, family + "_bf16.gguf");
}

// Q8_0 blocks hold the engine's q8 numbers bit for bit: a file holding the quants quantize_q8 makes runs as the
// directory with --weights q8 (f32 activations: the same values). With q8 activations the file's blocks run the block
// kernels (an exact integer per 32-value unit, then scaled) and the directory's q8 rotary's own (a float per 4-value
// lane), which round differently, and a rounding can move a later 8-bit activation: the same model within that
// (BlocksOf32RunInPlaceAsTheirValues' bound). Files from llama.cpp's quantizer hold other quants
// where its rule differs (it rounds w / d against the unrounded scale, ours against the stored f16 one): the same
// file then runs llama.cpp's own numbers, which is the point of reading it.
TEST_P(GgufFixture, Q8_0GivesTheDirectorysQ8Logits) {
  const std::string family = GetParam();
  expect_same_logits(family, Written::Q8_0, {.weights = WeightFormat::Q8, .activations = ActivationFormat::F32},
                     {.activations = ActivationFormat::F32}, family + "_q8_0.gguf");
  expect_same_logits(family, Written::Q8_0, {.weights = WeightFormat::Q8}, {}, family + "_q8_0_act.gguf",
                     0.05);  // q8 activations (auto)
  // Asked for another format, Q8_0 is dequantized (each weight d x quant, exact) and converted.
  const engine::HfModel f32 = engine::open_model(write_file(fixture_gguf(family, Written::Q8_0), family + "_f.gguf"),
                                                 {.weights = WeightFormat::F32});
  EXPECT_EQ(f32.model->matrix_format(), WeightFormat::F32);
}

// Blocks of 32 values - Q4_0, and Q4_1, Q5_0, Q5_1, which llama-quantize's Q4_K_M / Q5_K_M write where a row is
// not whole 256-value super-blocks - run in place (WeightFormat::Q4_0 ...): with f32 activations each row is its
// blocks' exact values, so the logits equal bit for bit those of a file holding those values as f32; with q8
// activations (the integer products) they are within the activations' 8-bit rounding of them.
TEST_P(GgufFixture, BlocksOf32RunInPlaceAsTheirValues) {
  const std::string family = GetParam();
  for (const auto& [type, format] :
       {std::pair{GgmlType::Q4_0, WeightFormat::Q4_0}, std::pair{GgmlType::Q4_1, WeightFormat::Q4_1},
        std::pair{GgmlType::Q5_0, WeightFormat::Q5_0}, std::pair{GgmlType::Q5_1, WeightFormat::Q5_1}}) {
    const std::string name = family + "_" + weight_format_name(format);
    SCOPED_TRACE(name);
    const engine::HfModel blocks =
        engine::open_model(write_file(fixture_gguf(family, Written::Blocks, type), name + ".gguf"),
                           {.activations = ActivationFormat::F32});
    const engine::HfModel values =
        engine::open_model(write_file(fixture_gguf(family, Written::BlockValues, type), name + "_values.gguf"));
    const engine::HfModel blocks_q8 =
        engine::open_model(write_file(fixture_gguf(family, Written::Blocks, type), name + "b.gguf"),
                           {.activations = ActivationFormat::Q8});
    EXPECT_EQ(blocks.model->matrix_format(), format);
    EXPECT_EQ(values.model->matrix_format(), WeightFormat::F32);
    const std::vector<int64_t> tokens = read_expected(kFixtures / family).tokens;
    const std::vector<double> want = engine_logits(values.model, values.description.positions(), tokens, 5);
    EXPECT_EQ(engine_logits(blocks.model, blocks.description.positions(), tokens, 5), want);
    const std::vector<double> q8 = engine_logits(blocks_q8.model, blocks_q8.description.positions(), tokens, 5);
    ASSERT_EQ(q8.size(), want.size());
    EXPECT_LT(relative_error(q8, want), 0.05);
    EXPECT_GT(relative_error(q8, want), 0.0);  // the q8 activations did run (rounded x)
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GgufFixture, ::testing::ValuesIn(kGgufFamilies));

// A file as llama-quantize's Q4_K_M / Q5_K_M write one for a model whose width is not whole 256-value super-blocks
// (Qwen2.5-0.5B's 896): the tensors whose rows are d_model wide fall back to 32-value blocks - Q5_0 for Q4_K, Q5_1
// for Q5_K, Q8_0 for Q6_K - while ffn_down, whose rows are d_ff (whole super-blocks), stays Q4_K / Q6_K; norms and
// biases F32 (one of each F16 here). A qwen2 model of width 96 (3 blocks of 32) and d_ff 256, random weights; every
// 32-value type appears (Q4_0, Q4_1 and Q5_1 in layer 1). `as_values`: each block tensor written instead as the f32
// values its blocks decode to (ggml_dequantize_reference), the other tensors as they are.
GgufWriter mixed_gguf(bool as_values) {
  engine::HfModelDescription d;
  d.model_type = "qwen2";
  engine::Architecture& a = d.arch;
  a.vocab_size = 64, a.d_model = 96, a.n_layers = 2, a.n_heads = 2, a.n_kv_heads = 1, a.head_dim = 48, a.d_ff = 256;
  a.qkv_bias = true;
  GgufWriter w;
  w.add_string("general.architecture", "qwen2");
  w.add_u32("qwen2.context_length", 128);
  w.add_u32("qwen2.embedding_length", uint32_t(a.d_model));
  w.add_u32("qwen2.feed_forward_length", uint32_t(a.d_ff));
  w.add_u32("qwen2.block_count", uint32_t(a.n_layers));
  w.add_u32("qwen2.attention.head_count", uint32_t(a.n_heads));
  w.add_u32("qwen2.attention.head_count_kv", uint32_t(a.n_kv_heads));
  w.add_f32("qwen2.rope.freq_base", 10000.f);
  w.add_f32("qwen2.attention.layer_norm_rms_epsilon", 1e-6f);
  const std::map<std::string, GgmlType> types = {
      {"token_embd.weight", GgmlType::Q5_0},       {"output.weight", GgmlType::Q8_0},
      {"output_norm.weight", GgmlType::F16},
      {"blk.0.attn_q.weight", GgmlType::Q5_0},     {"blk.0.attn_k.weight", GgmlType::Q5_0},
      {"blk.0.attn_v.weight", GgmlType::Q8_0},     {"blk.0.attn_output.weight", GgmlType::Q5_0},
      {"blk.0.ffn_gate.weight", GgmlType::Q5_0},   {"blk.0.ffn_up.weight", GgmlType::Q5_0},
      {"blk.0.ffn_down.weight", GgmlType::Q6_K},   {"blk.0.attn_k.bias", GgmlType::F16},
      {"blk.1.attn_q.weight", GgmlType::Q5_1},     {"blk.1.attn_k.weight", GgmlType::Q4_1},
      {"blk.1.attn_v.weight", GgmlType::Q8_0},     {"blk.1.attn_output.weight", GgmlType::Q4_0},
      {"blk.1.ffn_gate.weight", GgmlType::Q5_1},   {"blk.1.ffn_up.weight", GgmlType::Q4_1},
      {"blk.1.ffn_down.weight", GgmlType::Q4_K}};
  std::mt19937 rng(896);
  std::normal_distribution<float> normal;
  for (const engine::HfTensorName& n : engine::gguf_tensor_names(d)) {
    const std::vector<int64_t>& shape = n.slot.shape;
    int64_t count = 1;
    for (int64_t s : shape) count *= s;
    const bool norm = n.slot.part == "attn_norm" || n.slot.part == "mlp_norm" || n.slot.part == "final_norm";
    const float scale = n.slot.part == "embed" ? 1.f : shape.size() == 2 ? 1.f / std::sqrt(float(shape[1])) : 0.05f;
    std::vector<float> x(static_cast<size_t>(count));
    for (float& v : x) v = (norm ? 1.f : 0.f) + scale * normal(rng);
    const auto it = types.find(n.stored);
    GgmlType type = it == types.end() ? GgmlType::F32 : it->second;
    std::string bytes(size_t(ggml_row_bytes(type, count)), '\0');
    ggml_quantize(type, x.data(), count, bytes.data());
    if (as_values && type != GgmlType::F32 && type != GgmlType::F16) {
      std::vector<double> values(static_cast<size_t>(count));
      ggml_dequantize_reference(type, bytes.data(), count, values.data());
      bytes.clear();
      for (double v : values) {
        const float f = float(v);
        bytes.append(reinterpret_cast<const char*>(&f), 4);
      }
      type = GgmlType::F32;
    }
    w.add_tensor(n.stored, type, shape, bytes);
  }
  return w;
}

// The mixed file loads and runs: every matrix in place in its own format (the model's matrix_format() is that of
// the first layer's q, Q5_0); with f32 activations its logits equal bit for bit those of the file of its blocks'
// values, with q8 activations (each format's integer products) they are within the activations' rounding of them.
TEST(GgufModel, MixedBlockFormatsAsLlamaQuantizeWritesThemLoadAndRun) {
  const std::string mixed = write_file(mixed_gguf(false), "mixed.gguf");
  const engine::HfModel blocks = engine::open_model(mixed, {.activations = ActivationFormat::F32});
  const engine::HfModel blocks_q8 = engine::open_model(mixed, {.activations = ActivationFormat::Q8});
  const engine::HfModel values =
      engine::open_model(write_file(mixed_gguf(true), "mixed_values.gguf"), {.activations = ActivationFormat::F32});
  EXPECT_EQ(blocks.model->matrix_format(), WeightFormat::Q5_0);
  EXPECT_EQ(values.model->matrix_format(), WeightFormat::F32);
  EXPECT_EQ(blocks.model->arch().d_ff, 256);
  const std::vector<int64_t> tokens = {3, 17, 42, 8, 63, 0, 25, 11};
  const std::vector<double> want = engine_logits(values.model, values.description.positions(), tokens, 5);
  EXPECT_EQ(engine_logits(blocks.model, blocks.description.positions(), tokens, 5), want);
  const std::vector<double> q8 = engine_logits(blocks_q8.model, blocks_q8.description.positions(), tokens, 5);
  ASSERT_EQ(q8.size(), want.size());
  for (double v : q8) ASSERT_TRUE(std::isfinite(v));
  EXPECT_LT(relative_error(q8, want), 0.05);
  EXPECT_GT(relative_error(q8, want), 0.0);
}

// A file with one thing changed from the qwen2 fixture's, opened: the error names the key or tensor.
void expect_refused(GgufWriter w, const std::string& name, std::initializer_list<std::string> parts) {
  const std::string path = write_file(w, name);
  expect_error([&] { engine::open_model(path); }, parts);
}

TEST(GgufModel, RefusesNamingTheKeyOrTensor) {
  {
    GgufWriter w = fixture_gguf("qwen2", Written::AsStored);
    w.add_string("general.architecture", "gptneox");  // a second key of that name: the reader refuses duplicates
    expect_refused(w, "dup.gguf", {"general.architecture"});
  }
  {
    // Every metadata key but the architecture, written as a file of another architecture.
    GgufWriter w;
    w.add_string("general.architecture", "gptneox");
    expect_refused(w, "arch.gguf", {"general.architecture", "\"gptneox\"", "llama, qwen2"});
  }
  {
    GgufWriter w;
    w.add_string("general.architecture", "qwen2");
    expect_refused(w, "missing.gguf", {"metadata qwen2.embedding_length", "missing"});
  }
  {
    GgufWriter w = fixture_gguf("llama2", Written::AsStored);
    w.add_string("llama.rope.scaling.type", "longrope");
    expect_refused(w, "scaling.gguf", {"llama.rope.scaling.type", "\"longrope\"", "none, linear, yarn"});
  }
  {
    GgufWriter w = fixture_gguf("qwen2", Written::AsStored);
    w.remove_tensor("blk.1.attn_q.weight");
    w.add_tensor("blk.1.attn_q.weight", GgmlType::F32, {16, 32}, std::string(16 * 32 * 4, '\0'));
    expect_refused(w, "shape.gguf", {"blk.1.attn_q.weight", "shape = [16, 32]", "[32, 32]"});
  }
  {
    GgufWriter w = fixture_gguf("qwen2", Written::AsStored);
    w.remove_tensor("blk.0.ffn_up.weight");
    w.add_tensor("blk.0.ffn_up.weight", GgmlType::I8, {64, 32}, std::string(64 * 32, '\0'));
    expect_refused(w, "type.gguf", {"tensor blk.0.ffn_up.weight.type = I8",
                                    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K"});
  }
  {
    GgufWriter w = fixture_gguf("qwen2", Written::AsStored);
    w.remove_tensor("blk.0.ffn_down.weight");
    expect_refused(w, "absent.gguf", {"blk.0.ffn_down.weight", "missing"});
  }
  {
    GgufWriter w = fixture_gguf("qwen2", Written::AsStored);
    w.add_tensor("blk.0.attn_q_norm.weight", GgmlType::F32, {16}, std::string(64, '\0'));
    expect_refused(w, "unused.gguf", {"tensors = blk.0.attn_q_norm.weight", "qwen2 model as its metadata describes"});
  }
  {
    GgufWriter w = fixture_gguf("qwen2", Written::AsStored);
    w.add_u32("qwen2.vocab_size", 65);
    expect_refused(w, "vocab.gguf", {"qwen2.vocab_size = 65", "token_embd.weight's rows, 64"});
  }
  {
    // A NaN scale in a Q8_0 block: refused by tensor and element, as a NaN weight of any other type.
    GgufWriter w = fixture_gguf("qwen2", Written::Q8_0);
    const std::string block_bytes(34 * 64, '\0');
    std::string bad = block_bytes;
    bad[34 * 3] = '\x00', bad[34 * 3 + 1] = '\x7e';  // f16 0x7e00: NaN
    w.remove_tensor("blk.0.ffn_gate.weight");
    w.add_tensor("blk.0.ffn_gate.weight", GgmlType::Q8_0, {64, 32}, bad);
    expect_refused(w, "nan.gguf", {"tensor blk.0.ffn_gate.weight", "elements 96..127", "non-finite f16 scale"});
  }
  // The 32-value formats' f16 fields likewise: Q5_0's d, and Q4_1's and Q5_1's min m (the second f16 of the block),
  // which is as much a part of every weight (d q + m) as d.
  for (const auto& [type, block_bytes, at, bits] :
       {std::tuple{GgmlType::Q5_0, 22, 0, uint16_t(0x7c00)}, std::tuple{GgmlType::Q4_1, 20, 2, uint16_t(0xfc00)},
        std::tuple{GgmlType::Q5_1, 24, 2, uint16_t(0x7e00)}, std::tuple{GgmlType::Q5_1, 24, 0, uint16_t(0x7c00)}}) {
    GgufWriter w = fixture_gguf("qwen2", Written::Blocks, type);
    std::string bad(size_t(block_bytes * 64), '\0');
    bad[size_t(block_bytes * 5 + at)] = char(bits & 0xff), bad[size_t(block_bytes * 5 + at + 1)] = char(bits >> 8);
    w.remove_tensor("blk.1.ffn_up.weight");
    w.add_tensor("blk.1.ffn_up.weight", type, {64, 32}, bad);
    SCOPED_TRACE(ggml_type_name(type) + " field at " + std::to_string(at));
    expect_refused(w, "nan_" + ggml_type_name(type) + ".gguf",
                   {"tensor blk.1.ffn_up.weight", "elements 160..191", "non-finite f16 scale"});
  }
}

// The one opener of a model path: a directory is a Hugging Face model, a *.gguf file a GGUF one.
TEST(GgufModel, OpenModelTakesADirectoryOrAGgufFile) {
  EXPECT_FALSE(engine::is_gguf_path((kFixtures / "qwen2").string()));
  const std::string path = write_file(fixture_gguf("qwen2", Written::AsStored), "open.gguf");
  EXPECT_TRUE(engine::is_gguf_path(path));
  EXPECT_EQ(engine::open_model(path).description.model_type, "qwen2");
  EXPECT_EQ(engine::open_model((kFixtures / "qwen2").string()).description.model_type, "qwen2");
}

}  // namespace
}  // namespace rotary::test
