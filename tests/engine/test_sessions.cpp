// The torch-free engine (rotary_engine/model.h) on every fixture family (tests/data/hf_checkpoints), opened by
// engine::open_hf_model: its logits against the float64 transcription of transformers through a prompt (fused
// attention) and one token at a time (the KV cache), with the checkpoint's RoPE and ReRoPE; a prompt in chunks and a
// one-pass session bitwise equal to the whole prompt; and what Model::load and a session refuse. The comparisons
// with the nn float32 model are tests/nn/test_hf_engine.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "expect_error.h"
#include "hf_fixtures.h"
#include "rotary/ggml_quants.h"
#include "rotary_engine/hf_model.h"

namespace rotary::test {
namespace {

namespace fs = std::filesystem;


TEST_P(HfEngineFixture, LogitsMatchTheTranscriptionThroughAPromptAndTheCache) {
  const fs::path dir = kFixtures / GetParam();
  const engine::HfModel c = engine::open_hf_model(dir.string());
  const Expected e = read_expected(dir);
  const engine::PositionMethod native = c.description.positions();
  const int64_t S = int64_t(e.tokens.size());
  for (int64_t prompt : {S, int64_t(1), S / 2}) {
    const std::vector<double> got = engine_logits(c.model, native, e.tokens, prompt);
    EXPECT_LT(relative_error(got, e.logits.at("logits")), kTolF32) << "prompt " << prompt;
  }
  if (e.logits.count("logits_rerope_w8")) {
    const engine::PositionMethod rerope = rerope_at(native, 8);
    for (int64_t prompt : {S, S / 2})
      EXPECT_LT(relative_error(engine_logits(c.model, rerope, e.tokens, prompt), e.logits.at("logits_rerope_w8")),
                kTolF32)
          << "rerope w8, prompt " << prompt;
  }
}

// A prompt run chunk by chunk inside each layer (prefill_chunk: each chunk's queries against every key before them)
// gives bitwise the logits of the prompt as one chunk: every row's attention runs over the same key blocks, and a
// product's row does not depend on the rows beside it. With ReRoPE, Leaky ReRoPE, a bf16 cache and a memory (whose
// chunks the layer chunks then hold whole).
TEST_P(HfEngineFixture, APromptInChunksGivesTheWholePromptsLogitsBitwise) {
  const fs::path dir = kFixtures / GetParam();
  const engine::HfModel c = engine::open_hf_model(dir.string());
  const Expected e = read_expected(dir);
  const engine::PositionMethod native = c.description.positions();
  const auto [rerope, leaky] = rerope_variants(native);
  const int64_t S = int64_t(e.tokens.size());
  engine::MemoryOptions memory;
  memory.window = 4, memory.top_k = 3, memory.chunk = 2;
  struct Run {
    const char* name;
    const engine::PositionMethod* positions;
    DType kv;
    std::optional<engine::MemoryOptions> memory;
  };
  for (const Run& r : {Run{"native", &native, DType::F32, std::nullopt}, Run{"rerope", &rerope, DType::F32, std::nullopt},
                       Run{"leaky", &leaky, DType::F32, std::nullopt}, Run{"kv bf16", &native, DType::BF16, std::nullopt},
                       Run{"memory", &native, DType::F32, memory}}) {
    const std::vector<double> whole = engine_logits(c.model, *r.positions, e.tokens, S, r.kv, r.memory, S);
    for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(7)})
      EXPECT_EQ(engine_logits(c.model, *r.positions, e.tokens, S, r.kv, r.memory, chunk), whole)
          << r.name << ", prefill_chunk " << chunk << " of " << S << " tokens";
  }
}

// A one-pass session (keep_caches false: how `rotary perplexity` scores a window) gives bitwise the logits of a
// session that keeps its caches - each chunk attends over the same keys, taken from the layer's scratch either way
// - with every position method, a bf16 cache's rounding and any prefill chunk; it counts exactly the KV cache's
// bytes less, refuses a second forward() until clear(), and refuses a memory (which is a cache).
TEST_P(HfEngineFixture, AOnePassSessionGivesTheSameLogitsWithoutACache) {
  const fs::path dir = kFixtures / GetParam();
  const engine::HfModel c = engine::open_hf_model(dir.string());
  const Expected e = read_expected(dir);
  const engine::PositionMethod native = c.description.positions();
  const auto [rerope, leaky] = rerope_variants(native);
  const int64_t S = int64_t(e.tokens.size());
  for (const engine::PositionMethod* method : std::initializer_list<const engine::PositionMethod*>{&native, &rerope, &leaky})
    for (DType kv : {DType::F32, DType::BF16})
      for (int64_t chunk : {S, int64_t(5)})
        EXPECT_EQ(engine_logits(c.model, *method, e.tokens, S, kv, std::nullopt, chunk, false),
                  engine_logits(c.model, *method, e.tokens, S, kv, std::nullopt, chunk, true))
            << "method " << (method == &native ? "native" : method == &rerope ? "rerope" : "leaky") << ", kv "
            << dtype_name(kv) << ", prefill_chunk " << chunk;
  // One token is a pass too (no cache to decode from: it runs as a prompt of one).
  const std::vector<int64_t> first(e.tokens.begin(), e.tokens.begin() + 1);
  EXPECT_EQ(engine_logits(c.model, native, first, 1, DType::F32, std::nullopt, 512, false),
            engine_logits(c.model, native, first, 1, DType::F32, std::nullopt, 512, true));

  engine::SessionOptions o;
  o.capacity = S, o.positions = native, o.keep_caches = false;
  engine::SessionOptions kept = o;
  kept.keep_caches = true;
  const engine::Architecture& a = c.model->arch();
  // kv_cache.h's rows: each half of the rotary pairs and the unrotated rest padded to 16 floats
  const int64_t rotary = o.positions.rope.rotary_dim > 0 ? o.positions.rope.rotary_dim : a.head_dim;
  auto pad = [](int64_t x) { return (x + 15) / 16 * 16; };
  const int64_t row = 2 * pad(rotary / 2) + pad(a.head_dim - rotary);
  EXPECT_EQ(engine::Session::bytes_needed(*c.model, kept, S) - engine::Session::bytes_needed(*c.model, o, S),
            a.n_layers * 2 * a.n_kv_heads * S * row * 4);
  engine::Session s(c.model, o);
  const std::vector<int64_t> pos = positions_from_zero(S);
  s.forward(e.tokens.data(), pos.data(), S / 2, nullptr);
  EXPECT_EQ(s.size(), S / 2);
  expect_error([&] { s.forward(e.tokens.data() + S / 2, pos.data() + S / 2, 1, nullptr); },
               {"keep_caches = false", "one forward() call per clear()"});
  s.clear();
  EXPECT_EQ(s.size(), 0);
  s.forward(e.tokens.data(), pos.data(), S, nullptr);
  EXPECT_EQ(s.size(), S);
  o.memory = engine::MemoryOptions{.window = 4};
  expect_error([&] { engine::Session(c.model, o); }, {"keep_caches = false", "true with a memory"});
}

INSTANTIATE_TEST_SUITE_P(Families, HfEngineFixture, ::testing::ValuesIn(kFamilies));

// --weights f16 of a finite weight past f16's range: refused at load naming the tensor, the element and the limit
// (was: converted to Inf, then refused at the logits as if the checkpoint's weights were not finite).
// --weights q4_k and the other block formats convert at load to the bytes llama.cpp's quantizer writes: a model whose
// matrices are converted computes, bit for bit, what a model given ggml_quantize's blocks as stored computes (the
// head's logits here: every matrix goes through the same conversion). Unset activations follow the weights: q8 for
// block formats and q8, f32 for a float matrix among them; rows that are not whole blocks are refused by tensor.
TEST(EngineLoad, WeightsConvertedToBlockFormatsAreLlamaCppsBytesAndTakeQ8Activations) {
  engine::Architecture arch;
  arch.vocab_size = 48, arch.d_model = 256, arch.n_layers = 1, arch.n_heads = 2, arch.n_kv_heads = 1;
  arch.head_dim = 128, arch.d_ff = 256;
  const std::vector<engine::TensorSlot> slots = engine::tensor_slots(arch);
  std::vector<std::vector<float>> values;
  for (const engine::TensorSlot& slot : slots) {
    int64_t n = 1;
    for (int64_t d : slot.shape) n *= d;
    std::vector<float>& v = values.emplace_back(size_t(n));
    for (int64_t i = 0; i < n; ++i)
      v[size_t(i)] = slot.name.ends_with("norm.weight") ? 1.0f
                                                        : 0.05f * float((i * 7919 + int64_t(values.size()) * 31) % 97 - 48) / 48.0f;
  }
  const std::vector<float> hidden = [&] {
    std::vector<float> h(size_t(3 * arch.d_model));
    for (size_t i = 0; i < h.size(); ++i) h[i] = float(int(i * 37 % 23) - 11) / 7.0f;
    return h;
  }();
  const auto head_logits = [&](const engine::Model& m) {
    std::vector<float> out(size_t(3 * arch.vocab_size));
    m.logits(hidden.data(), 3, out.data(), 1);
    return out;
  };
  const auto floats = [&](const std::string& name) {
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].name == name) return engine::StoredTensor{DType::F32, values[i].data(), slots[i].shape};
    throw Error("rotary: no tensor " + name);
  };
  for (WeightFormat f : {WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q5_0, WeightFormat::Q5_1,
                         WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K}) {
    SCOPED_TRACE(weight_format_name(f));
    // The same matrices as llama.cpp's blocks, as a GGUF file would store them (1-D tensors stay f32).
    std::vector<std::vector<uint8_t>> blocks(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].shape.size() != 2) continue;
      const int64_t rows = slots[i].shape[0], cols = slots[i].shape[1];
      blocks[i].resize(size_t(rows * weight_row_bytes(f, cols)));
      for (int64_t r = 0; r < rows; ++r)
        ggml_quantize(ggml_type_of(f), values[i].data() + r * cols, cols, blocks[i].data() + r * weight_row_bytes(f, cols));
    }
    const auto as_blocks = [&](const std::string& name) {
      for (size_t i = 0; i < slots.size(); ++i)
        if (slots[i].name == name) {
          if (blocks[i].empty()) return engine::StoredTensor{DType::F32, values[i].data(), slots[i].shape};
          return engine::StoredTensor{DType::F32, blocks[i].data(), slots[i].shape, "", f};
        }
      throw Error("rotary: no tensor " + name);
    };
    for (std::optional<ActivationFormat> a : {std::optional<ActivationFormat>(), std::optional(ActivationFormat::F32)}) {
      const auto converted = engine::Model::load(arch, floats, {.weights = f, .activations = a}, nullptr);
      const auto stored = engine::Model::load(arch, as_blocks, {.activations = a}, nullptr);
      EXPECT_EQ(converted->matrix_format(), f);
      EXPECT_EQ(converted->activations(), a.value_or(ActivationFormat::Q8));
      EXPECT_EQ(stored->activations(), a.value_or(ActivationFormat::Q8));
      const std::vector<float> got = head_logits(*converted), want = head_logits(*stored);
      EXPECT_EQ(got, want);
    }
  }
  // Unset activations: q8 for --weights q8, f32 for float weights as stored or converted.
  EXPECT_EQ(engine::Model::load(arch, floats, {.weights = WeightFormat::Q8}, nullptr)->activations(), ActivationFormat::Q8);
  EXPECT_EQ(engine::Model::load(arch, floats, {}, nullptr)->activations(), ActivationFormat::F32);
  EXPECT_EQ(engine::Model::load(arch, floats, {.weights = WeightFormat::BF16}, nullptr)->activations(), ActivationFormat::F32);
  // Rows that are not whole blocks: refused naming the tensor, its row length and the block.
  engine::Architecture narrow = arch;
  narrow.d_model = 96, narrow.head_dim = 48, narrow.d_ff = 80;
  std::vector<float> zeros(size_t(narrow.vocab_size * 256), 0.0f);
  const auto narrow_lookup = [&](const std::string& name) {
    for (const engine::TensorSlot& s : engine::tensor_slots(narrow))
      if (s.name == name) return engine::StoredTensor{DType::F32, zeros.data(), s.shape};
    throw Error("rotary: no tensor " + name);
  };
  expect_error([&] { engine::Model::load(narrow, narrow_lookup, {.weights = WeightFormat::Q4_K}, nullptr); },
               {"rows of 96 weights to convert to q4_k", "whole number of q4_k blocks (256 weights"});
  expect_error([&] { engine::Model::load(narrow, narrow_lookup, {.weights = WeightFormat::Q4_0}, nullptr); },
               {"rows of 80 weights to convert to q4_0", "(32 weights"});
}

TEST(HfEngine, AWeightPastF16sRangeIsRefusedAtConversion) {
  const fs::path dir = kFixtures / "llama2";
  const engine::Architecture arch = engine::read_hf_model_file(dir.string()).arch;
  std::vector<float> zeros(size_t(arch.vocab_size * arch.d_model), 0.0f), big = zeros;
  big[37] = 70000.0f;
  auto lookup = [&](const std::string& name) {
    for (const engine::TensorSlot& s : engine::tensor_slots(arch))
      if (s.name == name)
        return engine::StoredTensor{DType::F32, name == "layers.0.up.weight" ? big.data() : zeros.data(), s.shape,
                                    name == "layers.0.up.weight" ? "model.layers.0.mlp.up_proj.weight" : ""};
    throw Error("rotary: no tensor " + name);
  };
  expect_error([&] { engine::Model::load(arch, lookup, {.weights = WeightFormat::F16}, nullptr); },
               {"tensor model.layers.0.mlp.up_proj.weight = element 37 (row 1, column 5) = 70000", "65504"});
  big[37] = 65504.0f;  // the largest f16: kept
  EXPECT_NO_THROW(engine::Model::load(arch, lookup, {.weights = WeightFormat::F16}, nullptr));
}

// What the engine refuses, each by name, before any work: tensors that do not fit the architecture, and sessions
// and tokens that do not fit the session.
TEST(HfEngine, RefusesBadTensorsAndBadInputByName) {
  const fs::path dir = kFixtures / "llama2";
  const engine::HfModelDescription spec = engine::read_hf_model_file(dir.string());
  const engine::Architecture arch = spec.arch;
  const engine::HfModel good = engine::open_hf_model(dir.string());
  std::vector<float> zeros(size_t(arch.vocab_size * arch.d_model), 0.0f);
  auto lookup_with = [&](const std::string& bad, engine::StoredTensor t) {
    return [&, bad, t](const std::string& name) {
      if (name == bad) return t;
      // Every other slot: zeros of its shape (the check under test is on `bad`).
      for (const engine::TensorSlot& s : engine::tensor_slots(arch))
        if (s.name == name) return engine::StoredTensor{DType::F32, zeros.data(), s.shape};
      throw Error("rotary: no tensor " + name);
    };
  };
  expect_error([&] { engine::Model::load(arch, lookup_with("layers.1.k.weight", {DType::F32, zeros.data(), {7, 32}, ""}), {}, nullptr); },
               {"tensor layers.1.k.weight.shape = [7, 32]", "allowed: [32, 32]"});
  expect_error([&] { engine::Model::load(arch, lookup_with("layers.0.up.weight", {DType::F32, nullptr, {64, 32}, ""}), {}, nullptr); },
               "tensor layers.0.up.weight.data = null");
  expect_error([&] { engine::Model::load(arch, [](const std::string& n) -> engine::StoredTensor { throw Error("rotary: no tensor " + n); }, {}, nullptr); },
               "no tensor embed");
  engine::Architecture odd = arch;
  odd.n_kv_heads = 3;
  expect_error([&] { engine::Model::load(odd, lookup_with("", {}), {}, nullptr); }, "n_kv_heads = 3");
  // A NaN weight is refused by tensor and element, in place and before a conversion alike.
  std::vector<float> nan_q = zeros;
  nan_q[5] = std::nanf("");
  for (std::optional<WeightFormat> f : {std::optional<WeightFormat>(), std::optional<WeightFormat>(WeightFormat::Q8)})
    expect_error([&] { engine::Model::load(arch, lookup_with("layers.0.q.weight", {DType::F32, nan_q.data(), {32, 32}, "q_proj"}), {.weights = f}, nullptr); },
                 {"tensor q_proj = non-finite (element 5 is nan)", "finite weights"});
  // bf16 activations need bf16 matrices: refused before a conversion to another format, and for f32 as stored
  // (before reading any weight: the lookup's dtypes).
  expect_error([&] { engine::Model::load(arch, lookup_with("", {}), {.weights = WeightFormat::Q8, .activations = ActivationFormat::BF16}, nullptr); },
               {"activations = bf16 with weights converted to q8", "bf16 weights throughout"});
  expect_error([&] { engine::Model::load(arch, lookup_with("", {}), {.weights = std::nullopt, .activations = ActivationFormat::BF16}, nullptr); },
               {"activations = bf16 with tensor ", "stored as f32", "--weights bf16"});
  // q8 activations need q8 matrices: a conversion at load makes them, and a GGUF file's Q8_0 blocks are them.
  expect_error([&] { engine::Model::load(arch, lookup_with("", {}), {.weights = WeightFormat::BF16, .activations = ActivationFormat::Q8}, nullptr); },
               {"activations = q8 with weights converted to bf16", "--weights q8"});
  expect_error([&] { engine::Model::load(arch, lookup_with("", {}), {.weights = std::nullopt, .activations = ActivationFormat::Q8}, nullptr); },
               {"activations = q8 with tensor ", "stored as f32", "--weights q8"});

  engine::SessionOptions o;
  o.capacity = 8, o.positions = spec.positions();
  engine::SessionOptions bad = o;
  bad.kv_dtype = DType::F64;
  expect_error([&] { engine::Session(good.model, bad); }, "kv_dtype = f64");
  bad = o, bad.kv_storage = KvStorage(7);
  expect_error([&] { engine::Session(good.model, bad); }, {"kv_storage = 7", "dtype, q8"});
  bad = o, bad.kv_storage = KvStorage::Q8, bad.kv_dtype = DType::BF16;
  expect_error([&] { engine::Session(good.model, bad); }, {"kv_dtype = bf16", "f32 with kv_storage q8"});
  bad = o, bad.capacity = 0;
  expect_error([&] { engine::Session(good.model, bad); }, "capacity = 0");
  bad = o, bad.positions.rope.head_dim = 8;
  expect_error([&] { engine::Session(good.model, bad); }, "positions.rope.head_dim = 8");
  engine::Session s(good.model, o);
  std::vector<float> hidden(size_t(9 * arch.d_model));
  const int64_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, pos[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  expect_error([&] { s.forward(ids, pos, 9, hidden.data()); }, "tokens = 9 is invalid; allowed: <= the session's capacity = 8");
  const int64_t big = arch.vocab_size;
  expect_error([&] { s.forward(&big, pos, 1, hidden.data()); }, "tokens[0] = " + std::to_string(big));
  s.forward(ids, pos, 3, hidden.data());
  expect_error([&] { s.forward(ids, pos + 2, 1, hidden.data()); }, "positions[0] = 2 is invalid; allowed: > 2");
  EXPECT_EQ(s.size(), 3);  // nothing appended by the refused calls
  s.forward(ids, pos + 3, 1, hidden.data());
  EXPECT_EQ(s.size(), 4);
}

}  // namespace
}  // namespace rotary::test
