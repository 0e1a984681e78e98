// The torch-free engine (rotary_engine/model.h) against the nn float32 model on every fixture family
// (tests/data/hf_checkpoints): every position method the lab runs on checkpoints; the weights converted to bf16 /
// f16 / f32 / q8 and half-precision and q8 caches within their rounding; greedy generation. The engine's own tests -
// against the float64 transcription of transformers, its memory, saved contexts and refusals - are the torch-free
// suite tests/engine (tests/engine/hf_fixtures.h: the fixtures and helpers both use).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "../engine/hf_fixtures.h"
#include "rotary_engine/generate.h"
#include "rotary_nn/hf_checkpoint.h"
#include "rotary_nn/hf_engine.h"

namespace rotary::nn {
namespace {

using test::HfEngineFixture;

namespace fs = std::filesystem;
using test::engine_logits;
using test::Expected;
using test::kFamilies;
using test::kFixtures;
using test::kTolF32Pair;
using test::read_expected;
using test::relative_error;

std::vector<double> nn_logits(HfCheckpoint& c, const EncodingOverride& o, const std::vector<int64_t>& tokens) {
  torch::NoGradGuard no_grad;
  c.model->set_override(o);
  const torch::Tensor l = c.model->forward(torch::tensor(tokens).view({1, -1}))[0].to(torch::kDouble).contiguous();
  return std::vector<double>(l.data_ptr<double>(), l.data_ptr<double>() + l.numel());
}


// Every position method of `rotary perplexity` against the nn float32 model with the same override.
TEST_P(HfEngineFixture, EveryPositionMethodMatchesTheNnModel) {
  const fs::path dir = kFixtures / GetParam();
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  HfCheckpoint ref = load_hf_checkpoint(dir.string());
  const Expected e = read_expected(dir);
  const int64_t S = int64_t(e.tokens.size());
  const RopeSpec trained = ref.model->active_encoding().rope;
  auto scaled = [&](RopeScaling s, double factor) {
    RopeSpec r = trained;
    r.scaling = s, r.factor = factor, r.attention_factor.reset();
    if (r.max_position_embeddings == 0) r.max_position_embeddings = S / 2;
    if (s == RopeScaling::Dynamic) r.max_position_embeddings = S / 4;  // so the length matters inside the run
    if (s == RopeScaling::Yarn && r.original_max_position_embeddings == 0) r.original_max_position_embeddings = S / 2;
    return r;
  };
  struct Method {
    const char* name;
    EncodingOverride o;
  };
  std::vector<Method> methods = {{"native", {}}};
  methods.push_back({"rerope", {.kind = EncodingKind::Rerope, .window = 8}});
  methods.push_back({"leaky_rerope", {.kind = EncodingKind::LeakyRerope, .window = 6, .leaky_k = 4}});
  methods.push_back({"logn", {.logn_train_len = 12}});
  methods.push_back({"rerope_logn", {.kind = EncodingKind::Rerope, .window = 5, .logn_train_len = 12}});
  methods.push_back({"pi", {.rope = scaled(RopeScaling::Linear, 2)}});
  methods.push_back({"ntk", {.rope = scaled(RopeScaling::NtkFixed, 3)}});
  methods.push_back({"yarn", {.rope = scaled(RopeScaling::Yarn, 4)}});
  methods.push_back({"dynamic", {.rope = scaled(RopeScaling::Dynamic, 2)}});
  for (const Method& m : methods) {
    const std::vector<double> want = nn_logits(ref, m.o, e.tokens);
    const engine::PositionMethod positions = engine_positions(ref.model->active_encoding());
    EXPECT_LT(relative_error(engine_logits(c.model, positions, e.tokens, S), want), kTolF32Pair)
        << m.name << ", one prompt";
    // Dynamic NTK's frequencies follow the length, so decoding differs from a full forward by definition (as in
    // transformers): the nn model's own decoder is the reference there.
    std::vector<double> decoded = want;
    if (m.o.rope && m.o.rope->scaling == RopeScaling::Dynamic) {
      torch::NoGradGuard no_grad;
      const torch::Tensor l = ref.model->decode_logits(e.tokens, 3).to(torch::kDouble).contiguous();
      decoded.assign(l.data_ptr<double>(), l.data_ptr<double>() + l.numel());
      EXPECT_GT(relative_error(decoded, want), 1e-3) << "the dynamic case must exercise a change of frequencies";
    }
    EXPECT_LT(relative_error(engine_logits(c.model, positions, e.tokens, 3), decoded), kTolF32Pair)
        << m.name << ", 3 + 1 at a time";
  }
}

// Stored values rounded once more - weights converted at load, or keys and values in a half-precision cache -
// move the logits against the float32 model in proportion to the storage's unit roundoff u: each rounding is a
// relative error <= u (rms u / sqrt3), and the logits' error adds such perturbations of the ~10 matrix products
// and the cached keys of the path in quadrature (first order). Measured on the five fixtures: 1.5-2.5 u of the
// largest logit for bf16 and f16 (weights and cache alike). q8's step is a block's max / 127: for weights whose
// block max is a few times their rms that is ~2x bf16's rms error, so it counts as u = 2^-7 (measured 1.7e-2 to
// 2.7e-2 = 2.2-3.5 u, f16 block scales). Allowed: 8 u. Greedy tokens must agree wherever the float32 logits' top two are
// further apart than twice that bound (where they are closer, either token is within rounding). bf16 activations
// (every product's input rounded to bf16, u = 2^-9, on bf16 weights) add one more such perturbation per product:
// u = hypot(2^-8, 2^-9) for the two together; q8 activations (each input quantized per block of 32 like q8
// weights, on q8 weights) u = hypot(2^-7, 2^-7).
double storage_roundoff(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return 0x1p-24;
    case WeightFormat::F16: return 0x1p-11;
    case WeightFormat::BF16: return 0x1p-8;
    case WeightFormat::Q8: return 0x1p-7;
  }
  return 1;
}

// Checks the bound above and the greedy tokens of every position of S x V logits.
void expect_close_to_float32(const std::vector<double>& got, const std::vector<double>& want, int64_t V, double u,
                             const std::string& what) {
  const double bound = std::max(8 * u, kTolF32Pair);
  const double err = relative_error(got, want);
  EXPECT_LT(err, bound) << what;
  std::printf("%s: %.1e of the largest logit (bound %.1e)\n", what.c_str(), err, bound);  // docs/engine.md's table
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  const int64_t S = int64_t(want.size()) / V;
  int64_t compared = 0;
  for (int64_t t = 0; t < S; ++t) {
    const auto row = want.begin() + t * V, grow = got.begin() + t * V;
    std::vector<double> sorted(row, row + V);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    if (sorted[0] - sorted[1] <= 2 * bound * scale) continue;
    ++compared;
    EXPECT_EQ(std::max_element(grow, grow + V) - grow, std::max_element(row, row + V) - row)
        << what << ": greedy token at position " << t;
  }
  EXPECT_GT(compared, 0) << what << ": no position had a clear greedy token";
}

TEST_P(HfEngineFixture, ConvertedWeightsAndHalfPrecisionCachesStayWithinTheirRounding) {
  const fs::path dir = kFixtures / GetParam();
  const Expected e = read_expected(dir);
  HfCheckpoint ref = load_hf_checkpoint(dir.string());
  const std::vector<double> want = nn_logits(ref, {}, e.tokens);
  const int64_t V = ref.spec.config.vocab_size;
  for (WeightFormat f : {WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16, WeightFormat::Q8}) {
    const HfEngineCheckpoint c = load_hf_engine(dir.string(), {.weights = f});
    EXPECT_EQ(c.model->matrix_format(), f);
    const engine::PositionMethod positions = engine_positions(c.spec.config.resolved_encoding());
    expect_close_to_float32(engine_logits(c.model, positions, e.tokens, 4), want, V, storage_roundoff(f),
                            std::string("weights ") + weight_format_name(f));
  }
  {  // bf16 weights with bf16 activations: the bf16 dot products through a prompt and the cache
    const HfEngineCheckpoint b = load_hf_engine(dir.string(), {.weights = WeightFormat::BF16,
                                                               .activations = ActivationFormat::BF16});
    EXPECT_EQ(b.model->activations(), ActivationFormat::BF16);
    const engine::PositionMethod positions = engine_positions(b.spec.config.resolved_encoding());
    const std::vector<double> got = engine_logits(b.model, positions, e.tokens, 4);
    expect_close_to_float32(got, want, V, std::hypot(0x1p-8, 0x1p-9), "bf16 weights, bf16 activations");
    const HfEngineCheckpoint w = load_hf_engine(dir.string(), {.weights = WeightFormat::BF16});
    EXPECT_NE(got, engine_logits(w.model, positions, e.tokens, 4)) << "activations not rounded";
  }
  {  // q8 weights with q8 activations: the int8 dot products through a prompt and the cache
    const HfEngineCheckpoint q = load_hf_engine(dir.string(), {.weights = WeightFormat::Q8,
                                                               .activations = ActivationFormat::Q8});
    EXPECT_EQ(q.model->activations(), ActivationFormat::Q8);
    const engine::PositionMethod positions = engine_positions(q.spec.config.resolved_encoding());
    const std::vector<double> got = engine_logits(q.model, positions, e.tokens, 4);
    expect_close_to_float32(got, want, V, std::hypot(0x1p-7, 0x1p-7), "q8 weights, q8 activations");
    const HfEngineCheckpoint w = load_hf_engine(dir.string(), {.weights = WeightFormat::Q8,
                                                               .activations = ActivationFormat::F32});
    EXPECT_NE(got, engine_logits(w.model, positions, e.tokens, 4)) << "activations not quantized";
    // Unset, the activations follow q8 weights: the same bits as q8 activations asked for.
    const HfEngineCheckpoint a = load_hf_engine(dir.string(), {.weights = WeightFormat::Q8});
    EXPECT_EQ(got, engine_logits(a.model, positions, e.tokens, 4)) << "q8 weights without q8 activations by default";
  }
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  const engine::PositionMethod native = engine_positions(c.spec.config.resolved_encoding());
  for (DType kv : {DType::BF16, DType::F16})
    expect_close_to_float32(engine_logits(c.model, native, e.tokens, 4, kv), want, V, storage_roundoff(weight_format_of(kv)),
                            std::string("kv cache ") + dtype_name(kv));
  // A q8 cache (KvStorage::Q8): the tokens after the 4-token prompt read keys and values quantized in q8
  // blocks (u = 2^-7, as above), with ReRoPE too (its near keys turned after widening).
  const test::ReropeVariants variants = test::rerope_variants(native);
  for (const engine::PositionMethod* method : {&native, &variants.rerope, &variants.leaky}) {
    const std::string what = "kv cache q8, " + std::string(test::position_mode_name(method->mode));
    const std::vector<double> got = engine_logits(c.model, *method, e.tokens, 4, DType::F32, std::nullopt,
                                                  engine::SessionOptions{}.prefill_chunk, true, KvStorage::Q8);
    if (method == &native) expect_close_to_float32(got, want, V, storage_roundoff(WeightFormat::Q8), what);
    const std::vector<double> f32_cache = engine_logits(c.model, *method, e.tokens, 4);
    EXPECT_LT(relative_error(got, f32_cache), 8 * storage_roundoff(WeightFormat::Q8)) << what;
    EXPECT_NE(got, f32_cache) << what << ": nothing quantized";
  }
}

// The engine's sampling loop against the nn model's generate(): the same greedy tokens; sampling reproducible by
// seed and confined to sample_vocab.
TEST_P(HfEngineFixture, GreedyGenerationEqualsTheNnModelAndSamplingKeepsItsRange) {
  const fs::path dir = kFixtures / GetParam();
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  HfCheckpoint ref = load_hf_checkpoint(dir.string());
  const Expected e = read_expected(dir);
  const std::vector<int64_t> prompt(e.tokens.begin(), e.tokens.begin() + 5);
  engine::SessionOptions o;
  o.capacity = 5 + 12, o.positions = engine_positions(c.spec.config.resolved_encoding());
  engine::Session s(c.model, o);
  const std::vector<int64_t> greedy = engine::generate(s, prompt, {.max_new = 12});
  EXPECT_EQ(greedy, ref.model->generate(prompt, 12, 0.0, -1, 0));
  auto sample = [&](uint64_t seed, int64_t vocab) {
    engine::Session fresh(c.model, o);
    return engine::generate(fresh, prompt, {.max_new = 12, .temperature = 1.5, .seed = seed, .sample_vocab = vocab});
  };
  const std::vector<int64_t> a = sample(7, 0), b = sample(7, 0), other = sample(8, 0), low = sample(7, 10);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);  // 12 draws at temperature 1.5 over 64+ ids: equal sequences would be a broken sampler
  for (int64_t t : low) EXPECT_LT(t, 10);
  // Stops at stop_id (the first greedy token), which is not returned.
  engine::Session again(c.model, o);
  EXPECT_TRUE(engine::generate(again, prompt, {.max_new = 12, .stop_ids = {greedy.front()}}).empty());
}

INSTANTIATE_TEST_SUITE_P(Families, HfEngineFixture, ::testing::ValuesIn(kFamilies));

}  // namespace
}  // namespace rotary::nn
