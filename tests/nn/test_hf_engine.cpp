// The torch-free engine (rotary_engine/model.h) on every fixture family (tests/data/hf_checkpoints): its logits
// against the float64 transcription of transformers (the nn model's own test) and against the nn float32 model
// under every position method the lab runs on checkpoints; through a prompt (fused attention) and one token at a
// time (the KV cache); with the weights as stored and converted to bf16 / f16 / f32 / q8; and what it refuses.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include "expect_error.h"
#include "rotary/safetensors.h"
#include "rotary_nn/hf_checkpoint.h"
#include "rotary_engine/generate.h"
#include "rotary_nn/hf_engine.h"

// Designated initializers that leave the other fields at their defaults ({.kind = ..., .window = 8}) are how these
// tests name a setting; GCC 12's -Wmissing-field-initializers reports each of them (GCC 14 no longer does).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif

namespace rotary::nn {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

const fs::path kFixtures = fs::path(ROTARY_SOURCE_DIR) / "tests/data/hf_checkpoints";
const char* kFamilies[] = {"llama2", "llama3", "mistral", "qwen2", "gpt_neox"};

struct Expected {
  std::vector<int64_t> tokens;
  std::map<std::string, std::vector<double>> logits;  // [S * V] float64 of the stored float32
};

Expected read_expected(const fs::path& dir) {
  const SafetensorsFile f = SafetensorsFile::open((dir / "expected.safetensors").string());
  Expected e;
  for (const SafetensorsTensor& t : f.tensors()) {
    std::vector<float> v(size_t(t.bytes / 4));
    std::memcpy(v.data(), t.data, t.bytes);
    if (t.name == "tokens") {
      for (float x : v) e.tokens.push_back(int64_t(x));
    } else {
      e.logits[t.name] = std::vector<double>(v.begin(), v.end());
    }
  }
  return e;
}

// max |a - b| / max |b| (the measure of the nn fixture test).
double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) err = std::max(err, std::fabs(a[i] - b[i])), scale = std::max(scale, std::fabs(b[i]));
  return err / scale;
}

// The two windowed methods the chunk tests run beside the checkpoint's own rope: ReRoPE w = 8, Leaky ReRoPE
// w = 6, k = 3.
struct ReropeVariants {
  EncodingConfig rerope, leaky;
};
ReropeVariants rerope_variants(const EncodingConfig& native) {
  ReropeVariants v{native, native};
  v.rerope.kind = EncodingKind::Rerope, v.rerope.window = 8;
  v.leaky.kind = EncodingKind::LeakyRerope, v.leaky.window = 6, v.leaky.leaky_k = 3;
  return v;
}

// Positions 0 .. S-1.
std::vector<int64_t> positions_from_zero(int64_t S) {
  std::vector<int64_t> pos(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) pos[size_t(i)] = i;
  return pos;
}

// Logits [S * V] from the engine: the first `prompt` tokens as one prompt, the rest one at a time.
std::vector<double> engine_logits(const HfEngineCheckpoint& c, const EncodingConfig& enc,
                                  const std::vector<int64_t>& tokens, int64_t prompt, DType kv = DType::F32,
                                  std::optional<engine::MemoryOptions> memory = std::nullopt,
                                  int64_t prefill_chunk = engine::SessionOptions{}.prefill_chunk,
                                  bool keep_caches = true, KvStorage kv_storage = KvStorage::Dtype) {
  engine::SessionOptions o;
  o.capacity = int64_t(tokens.size()), o.kv_dtype = kv, o.positions = engine_positions(enc), o.memory = memory;
  o.prefill_chunk = prefill_chunk, o.keep_caches = keep_caches, o.kv_storage = kv_storage;
  engine::Session s(c.model, o);
  const int64_t S = int64_t(tokens.size()), d = c.spec.config.d_model, V = c.spec.config.vocab_size;
  std::vector<int64_t> pos(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) pos[size_t(i)] = i;
  std::vector<float> hidden(size_t(S * d)), logits(size_t(S * V));
  s.forward(tokens.data(), pos.data(), prompt, hidden.data());
  for (int64_t t = prompt; t < S; ++t) s.forward(tokens.data() + t, pos.data() + t, 1, hidden.data() + t * d);
  s.logits(hidden.data(), S, logits.data());
  EXPECT_EQ(s.size(), S);
  return std::vector<double>(logits.begin(), logits.end());
}

std::vector<double> nn_logits(HfCheckpoint& c, const EncodingOverride& o, const std::vector<int64_t>& tokens) {
  torch::NoGradGuard no_grad;
  c.model->set_override(o);
  const torch::Tensor l = c.model->forward(torch::tensor(tokens).view({1, -1}))[0].to(torch::kDouble).contiguous();
  return std::vector<double>(l.data_ptr<double>(), l.data_ptr<double>() + l.numel());
}

// The float32 model's bound against the transcription (test_hf_checkpoint.cpp: float32 products and norms at
// 2^-24 relative, measured <= 7e-7 of the largest logit): 5e-6. Two float32 implementations differ by at most
// the sum of their errors: 1e-5.
constexpr double kTolF32 = 5e-6, kTolF32Pair = 1e-5;

class HfEngineFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(HfEngineFixture, LogitsMatchTheTranscriptionThroughAPromptAndTheCache) {
  const fs::path dir = kFixtures / GetParam();
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  const Expected e = read_expected(dir);
  const EncodingConfig enc = c.spec.config.resolved_encoding();
  const int64_t S = int64_t(e.tokens.size());
  for (int64_t prompt : {S, int64_t(1), S / 2}) {
    const std::vector<double> got = engine_logits(c, enc, e.tokens, prompt);
    EXPECT_LT(relative_error(got, e.logits.at("logits")), kTolF32) << "prompt " << prompt;
  }
  if (e.logits.count("logits_rerope_w8")) {
    EncodingConfig rerope = enc;
    rerope.kind = EncodingKind::Rerope, rerope.window = 8;
    for (int64_t prompt : {S, S / 2})
      EXPECT_LT(relative_error(engine_logits(c, rerope, e.tokens, prompt), e.logits.at("logits_rerope_w8")), kTolF32)
          << "rerope w8, prompt " << prompt;
  }
}

// A prompt run chunk by chunk inside each layer (prefill_chunk: each chunk's queries against every key before them)
// gives bitwise the logits of the prompt as one chunk: every row's attention runs over the same key blocks, and a
// product's row does not depend on the rows beside it. With ReRoPE, Leaky ReRoPE, a bf16 cache and a memory (whose
// chunks the layer chunks then hold whole).
TEST_P(HfEngineFixture, APromptInChunksGivesTheWholePromptsLogitsBitwise) {
  const fs::path dir = kFixtures / GetParam();
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  const Expected e = read_expected(dir);
  const EncodingConfig native = c.spec.config.resolved_encoding();
  const auto [rerope, leaky] = rerope_variants(native);
  const int64_t S = int64_t(e.tokens.size());
  engine::MemoryOptions memory;
  memory.window = 4, memory.top_k = 3, memory.chunk = 2;
  struct Run {
    const char* name;
    const EncodingConfig* enc;
    DType kv;
    std::optional<engine::MemoryOptions> memory;
  };
  for (const Run& r : {Run{"native", &native, DType::F32, std::nullopt}, Run{"rerope", &rerope, DType::F32, std::nullopt},
                       Run{"leaky", &leaky, DType::F32, std::nullopt}, Run{"kv bf16", &native, DType::BF16, std::nullopt},
                       Run{"memory", &native, DType::F32, memory}}) {
    const std::vector<double> whole = engine_logits(c, *r.enc, e.tokens, S, r.kv, r.memory, S);
    for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(7)})
      EXPECT_EQ(engine_logits(c, *r.enc, e.tokens, S, r.kv, r.memory, chunk), whole)
          << r.name << ", prefill_chunk " << chunk << " of " << S << " tokens";
  }
}

// A one-pass session (keep_caches false: how `rotary perplexity` scores a window) gives bitwise the logits of a
// session that keeps its caches - each chunk attends over the same keys, taken from the layer's scratch either way
// - with every position method, a bf16 cache's rounding and any prefill chunk; it counts exactly the KV cache's
// bytes less, refuses a second forward() until clear(), and refuses a memory (which is a cache).
TEST_P(HfEngineFixture, AOnePassSessionGivesTheSameLogitsWithoutACache) {
  const fs::path dir = kFixtures / GetParam();
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  const Expected e = read_expected(dir);
  const EncodingConfig native = c.spec.config.resolved_encoding();
  const auto [rerope, leaky] = rerope_variants(native);
  const int64_t S = int64_t(e.tokens.size());
  for (const EncodingConfig* enc : std::initializer_list<const EncodingConfig*>{&native, &rerope, &leaky})
    for (DType kv : {DType::F32, DType::BF16})
      for (int64_t chunk : {S, int64_t(5)})
        EXPECT_EQ(engine_logits(c, *enc, e.tokens, S, kv, std::nullopt, chunk, false),
                  engine_logits(c, *enc, e.tokens, S, kv, std::nullopt, chunk, true))
            << "method " << (enc == &native ? "native" : enc == &rerope ? "rerope" : "leaky") << ", kv "
            << dtype_name(kv) << ", prefill_chunk " << chunk;
  // One token is a pass too (no cache to decode from: it runs as a prompt of one).
  const std::vector<int64_t> first(e.tokens.begin(), e.tokens.begin() + 1);
  EXPECT_EQ(engine_logits(c, native, first, 1, DType::F32, std::nullopt, 512, false),
            engine_logits(c, native, first, 1, DType::F32, std::nullopt, 512, true));

  engine::SessionOptions o;
  o.capacity = S, o.positions = engine_positions(native), o.keep_caches = false;
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
    const EncodingConfig enc = ref.model->active_encoding();
    EXPECT_LT(relative_error(engine_logits(c, enc, e.tokens, S), want), kTolF32Pair) << m.name << ", one prompt";
    // Dynamic NTK's frequencies follow the length, so decoding differs from a full forward by definition (as in
    // transformers): the nn model's own decoder is the reference there.
    std::vector<double> decoded = want;
    if (m.o.rope && m.o.rope->scaling == RopeScaling::Dynamic) {
      torch::NoGradGuard no_grad;
      const torch::Tensor l = ref.model->decode_logits(e.tokens, 3).to(torch::kDouble).contiguous();
      decoded.assign(l.data_ptr<double>(), l.data_ptr<double>() + l.numel());
      EXPECT_GT(relative_error(decoded, want), 1e-3) << "the dynamic case must exercise a change of frequencies";
    }
    EXPECT_LT(relative_error(engine_logits(c, enc, e.tokens, 3), decoded), kTolF32Pair) << m.name << ", 3 + 1 at a time";
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
    const EncodingConfig enc = c.spec.config.resolved_encoding();
    expect_close_to_float32(engine_logits(c, enc, e.tokens, 4), want, V, storage_roundoff(f),
                            std::string("weights ") + weight_format_name(f));
  }
  {  // bf16 weights with bf16 activations: the bf16 dot products through a prompt and the cache
    const HfEngineCheckpoint b = load_hf_engine(dir.string(), {.weights = WeightFormat::BF16,
                                                               .activations = ActivationFormat::BF16});
    EXPECT_EQ(b.model->activations(), ActivationFormat::BF16);
    const std::vector<double> got = engine_logits(b, b.spec.config.resolved_encoding(), e.tokens, 4);
    expect_close_to_float32(got, want, V, std::hypot(0x1p-8, 0x1p-9), "bf16 weights, bf16 activations");
    const HfEngineCheckpoint w = load_hf_engine(dir.string(), {.weights = WeightFormat::BF16});
    EXPECT_NE(got, engine_logits(w, w.spec.config.resolved_encoding(), e.tokens, 4)) << "activations not rounded";
  }
  {  // q8 weights with q8 activations: the int8 dot products through a prompt and the cache
    const HfEngineCheckpoint q = load_hf_engine(dir.string(), {.weights = WeightFormat::Q8,
                                                               .activations = ActivationFormat::Q8});
    EXPECT_EQ(q.model->activations(), ActivationFormat::Q8);
    const std::vector<double> got = engine_logits(q, q.spec.config.resolved_encoding(), e.tokens, 4);
    expect_close_to_float32(got, want, V, std::hypot(0x1p-7, 0x1p-7), "q8 weights, q8 activations");
    const HfEngineCheckpoint w = load_hf_engine(dir.string(), {.weights = WeightFormat::Q8});
    EXPECT_NE(got, engine_logits(w, w.spec.config.resolved_encoding(), e.tokens, 4)) << "activations not quantized";
  }
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  const EncodingConfig enc = c.spec.config.resolved_encoding();
  for (DType kv : {DType::BF16, DType::F16})
    expect_close_to_float32(engine_logits(c, enc, e.tokens, 4, kv), want, V, storage_roundoff(weight_format_of(kv)),
                            std::string("kv cache ") + dtype_name(kv));
  // A q8 cache (KvStorage::Q8): the tokens after the 4-token prompt read keys and values quantized in q8
  // blocks (u = 2^-7, as above), with ReRoPE too (its near keys turned after widening).
  const ReropeVariants variants = rerope_variants(enc);
  for (const EncodingConfig* method : {&enc, &variants.rerope, &variants.leaky}) {
    const std::string what = "kv cache q8, " + std::string(encoding_kind_name(method->kind));
    const std::vector<double> got = engine_logits(c, *method, e.tokens, 4, DType::F32, std::nullopt,
                                                  engine::SessionOptions{}.prefill_chunk, true, KvStorage::Q8);
    if (method == &enc) expect_close_to_float32(got, want, V, storage_roundoff(WeightFormat::Q8), what);
    const std::vector<double> f32_cache = engine_logits(c, *method, e.tokens, 4);
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
  EXPECT_TRUE(engine::generate(again, prompt, {.max_new = 12, .stop_id = greedy.front()}).empty());
}

// A retrieval memory behind the caches (SessionOptions::memory): with every memory row retrieved, window + memory
// is attention over all the tokens, so the logits equal the transcription's - policy exact under the checkpoint's
// RoPE, policy rerope under ReRoPE (every memory key past the window sits at distance w, as ReRoPE puts it) - through
// chunked prompts (chunks of 3 and 5, the window 4..8 tokens) and one token at a time. The merge adds one fp32
// log-sum-exp per query, so the float32 bound stands. The window alone (top_k 0) and retrieved keys left unrotated
// (policy none) must differ, or the check would not see the memory.
TEST_P(HfEngineFixture, AMemoryWithEveryRowRetrievedEqualsTheFullForward) {
  const fs::path dir = kFixtures / GetParam();
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  const Expected e = read_expected(dir);
  const EncodingConfig enc = c.spec.config.resolved_encoding();
  const int64_t S = int64_t(e.tokens.size());
  const std::vector<double>& want = e.logits.at("logits");
  auto memory = [](MemoryPolicy policy, int64_t window, int top_k, int64_t chunk) {
    engine::MemoryOptions m;
    m.policy = policy, m.window = window, m.top_k = top_k, m.chunk = chunk;
    return m;
  };
  for (int64_t chunk : {3, 5})
    for (int64_t prompt : {S, S / 2, int64_t(1)}) {
      const engine::MemoryOptions all = memory(MemoryPolicy::Exact, 4, 1 << 20, chunk);
      EXPECT_LT(relative_error(engine_logits(c, enc, e.tokens, prompt, DType::F32, all), want), kTolF32)
          << "exact, chunk " << chunk << ", prompt " << prompt;
    }
  // Memory stats: every token past the first window's worth retrieved, all of the memory's mass counted.
  engine::SessionOptions o;
  o.capacity = S, o.positions = engine_positions(enc), o.memory = memory(MemoryPolicy::Exact, 4, 1 << 20, 3);
  engine::Session s(c.model, o);
  std::vector<int64_t> pos(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) pos[size_t(i)] = i;
  s.forward(e.tokens.data(), pos.data(), S, nullptr);
  const engine::MemoryStats stats = s.memory_stats();
  EXPECT_EQ(s.size(), S);
  EXPECT_GE(stats.memory_tokens, S - 8);  // the window keeps 4..8 tokens
  EXPECT_GT(stats.retrieving_queries, 0);
  EXPECT_GT(stats.memory_mass, 0.0);
  EXPECT_LE(stats.memory_mass, 1.0);

  const double window_only = relative_error(engine_logits(c, enc, e.tokens, S, DType::F32,
                                                          memory(MemoryPolicy::Exact, 4, 0, 3)), want);
  EXPECT_GT(window_only, 1e-3) << "the window alone must differ from full attention";
  const double unrotated = relative_error(engine_logits(c, enc, e.tokens, S, DType::F32,
                                                        memory(MemoryPolicy::NoRotation, 4, 1 << 20, 3)), want);
  EXPECT_GT(unrotated, 1e-3) << "retrieved keys left unrotated must differ from full attention";
  if (e.logits.count("logits_rerope_w8")) {
    EncodingConfig rerope = enc;
    rerope.kind = EncodingKind::Rerope, rerope.window = 8;
    for (int64_t prompt : {S, int64_t(2)})
      EXPECT_LT(relative_error(engine_logits(c, rerope, e.tokens, prompt, DType::F32,
                                             memory(MemoryPolicy::Rerope, 8, 1 << 20, 5)),
                               e.logits.at("logits_rerope_w8")),
                kTolF32)
          << "rerope, prompt " << prompt;
  }
  // Greedy generation through the memory equals generation without one.
  const std::vector<int64_t> prompt(e.tokens.begin(), e.tokens.begin() + 11);
  engine::SessionOptions plain;
  plain.capacity = 11 + 12, plain.positions = engine_positions(enc);
  engine::SessionOptions with_memory = plain;
  with_memory.memory = memory(MemoryPolicy::Exact, 4, 1 << 20, 0);
  engine::Session a(c.model, plain), b(c.model, with_memory);
  int64_t prompt_calls = 0;
  EXPECT_EQ(engine::generate(b, prompt, {.max_new = 12, .on_prompt = [&](int64_t, int64_t) { ++prompt_calls; }}),
            engine::generate(a, prompt, {.max_new = 12}));
  EXPECT_EQ(prompt_calls, 3);  // 11 prompt tokens, a window's worth (4) per call
}

// The memory's top-k through the page search (MemoryOptions::search, rotary/memory_pages.h): certified, by tokens
// and by keys, it retrieves the exact scan's rows, so the logits are the exact scan's (the same rows scored by the
// same kernel: within float32 reordering, 1e-6), at top-3 of a memory of up to 20 rows per layer and head; with
// every row, the transcription's. The stats count the search's work against the scan's (the scan: exactly 1).
TEST_P(HfEngineFixture, PageSearchRetrievesTheExactScansRows) {
  const fs::path dir = kFixtures / GetParam();
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  const Expected e = read_expected(dir);
  const EncodingConfig enc = c.spec.config.resolved_encoding();
  const int64_t S = int64_t(e.tokens.size());
  auto memory = [](int top_k, std::optional<MemoryPagesConfig> search) {
    engine::MemoryOptions m;
    m.window = 4, m.top_k = top_k, m.chunk = 3, m.search = search;
    return m;
  };
  const std::vector<double> scan = engine_logits(c, enc, e.tokens, S / 2, DType::F32, memory(3, std::nullopt));
  EXPECT_GT(relative_error(scan, e.logits.at("logits")), 1e-4) << "top-3 of the memory must differ from all of it";
  for (PageGrouping g : {PageGrouping::Tokens, PageGrouping::Keys})
    for (int64_t page_size : {1, 2, 5}) {
      const MemoryPagesConfig certified{.page_size = page_size, .pages_read = 0, .grouping = g};
      EXPECT_LT(relative_error(engine_logits(c, enc, e.tokens, S / 2, DType::F32, memory(3, certified)), scan), 1e-6)
          << page_grouping_name(g) << ", pages of " << page_size;
      EXPECT_LT(relative_error(engine_logits(c, enc, e.tokens, S / 2, DType::F32, memory(1 << 20, certified)),
                               e.logits.at("logits")),
                kTolF32)
          << page_grouping_name(g) << ", every row";
    }
  engine::SessionOptions o;
  o.capacity = S, o.positions = engine_positions(enc);
  std::vector<int64_t> pos(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) pos[size_t(i)] = i;
  for (bool paged : {false, true}) {
    o.memory = memory(3, paged ? std::optional<MemoryPagesConfig>(MemoryPagesConfig{.page_size = 2, .pages_read = 1})
                               : std::nullopt);
    engine::Session s(c.model, o);
    s.forward(e.tokens.data(), pos.data(), S, nullptr);
    const double share = s.memory_stats().scored_share;
    if (paged) {
      EXPECT_GT(share, 0.0);
    } else {
      EXPECT_EQ(share, 1.0);
    }
  }
  engine::SessionOptions bad = o;
  bad.memory->search = MemoryPagesConfig{.page_size = 0};
  expect_error([&] { engine::Session(c.model, bad); }, "memory_pages.page_size = 0");
}

// A search the caller supplies (MemoryOptions::search_factory: the lab's FAISS indexes) proposes the rows that
// memory_attention then scores: one that proposes every row gives the full forward's logits, one that finds none
// gives the window alone's; each layer's search is synced before it is asked, and its work reaches scored_share.
TEST_P(HfEngineFixture, ACallersSearchProposesTheRowsTheMemoryAttends) {
  const fs::path dir = kFixtures / GetParam();
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  const Expected e = read_expected(dir);
  const EncodingConfig enc = c.spec.config.resolved_encoding();
  const int64_t S = int64_t(e.tokens.size());
  struct Proposing final : engine::MemorySearch {
    const KvMemory& memory;
    bool all;
    int64_t* syncs;
    int64_t synced = 0;
    Proposing(const KvMemory& m, bool every_row, int64_t* count) : memory(m), all(every_row), syncs(count) {}
    void sync() override { ++*syncs, synced = memory.size(); }
    double candidates(const MemoryAttentionParams& p, int64_t* out) override {
      EXPECT_EQ(synced, memory.size()) << "asked before sync()";
      const int64_t per_query = p.top_k, queries = p.tokens * p.q.heads;
      for (int64_t i = 0; i < queries * per_query; ++i) out[i] = all && i % per_query < memory.size() ? i % per_query : -1;
      return 7.0 * double(queries);
    }
  };
  int64_t syncs = 0;
  auto memory = [&](int top_k, bool every_row) {
    engine::MemoryOptions m;
    m.window = 4, m.top_k = top_k, m.chunk = 3;
    m.search_factory = [&syncs, every_row](const KvMemory& mem) {
      return std::make_unique<Proposing>(mem, every_row, &syncs);
    };
    return m;
  };
  EXPECT_LT(relative_error(engine_logits(c, enc, e.tokens, S / 2, DType::F32, memory(1 << 20, true)),
                           e.logits.at("logits")),
            kTolF32);
  EXPECT_GT(syncs, 0);
  engine::MemoryOptions window_alone;
  window_alone.window = 4, window_alone.top_k = 0, window_alone.chunk = 3;
  const std::vector<double> alone = engine_logits(c, enc, e.tokens, S / 2, DType::F32, window_alone);
  EXPECT_GT(relative_error(alone, e.logits.at("logits")), 1e-4) << "the window alone must differ from all of it";
  EXPECT_LT(relative_error(engine_logits(c, enc, e.tokens, S / 2, DType::F32, memory(3, false)), alone), 1e-6);

  engine::SessionOptions o;
  o.capacity = S, o.positions = engine_positions(enc), o.memory = memory(3, true);
  {
    engine::Session s(c.model, o);
    std::vector<int64_t> pos(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; ++i) pos[size_t(i)] = i;
    s.forward(e.tokens.data(), pos.data(), S, nullptr);
    const double share = s.memory_stats().scored_share;  // 7 vectors per (token, head) against a scan of every row
    EXPECT_GT(share, 0.0);
    EXPECT_LT(share, 1.0);
  }
  engine::SessionOptions bad = o;
  bad.memory->search = MemoryPagesConfig{.page_size = 2};
  expect_error([&] { engine::Session(c.model, bad); }, {"memory.search_factory", "one search per memory"});
  bad = o, bad.memory->search_factory = [](const KvMemory&) { return std::unique_ptr<engine::MemorySearch>(); };
  const std::vector<int64_t> pos = positions_from_zero(S);
  expect_error([&] { engine::Session(c.model, bad).forward(e.tokens.data(), pos.data(), S, nullptr); },
               {"memory.search_factory", "a MemorySearch"});
}

// Session options `o` (capacity: every token) over tokens [0, first), saved to `ctx` (save_context) and continued in
// a session opened from it with a capacity of the rest (the capacity given counts the tokens after the context):
// the opened session holds `first` tokens, goes on at `first`, and gives the rest of the tokens the hidden states -
// bit for bit - and memory the session that went on gives them. Returns those hidden states.
std::vector<float> expect_context_continues(const HfEngineCheckpoint& c, const std::vector<int64_t>& tokens,
                                            const engine::SessionOptions& o, int64_t first, const std::string& ctx) {
  const int64_t S = int64_t(tokens.size()), d = c.spec.config.d_model;
  const std::vector<int64_t> pos = positions_from_zero(S);
  std::vector<float> stayed(size_t((S - first) * d)), opened(stayed.size());
  engine::Session a(c.model, o);
  a.forward(tokens.data(), pos.data(), first, nullptr);
  a.save_context(ctx);
  a.forward(tokens.data() + first, pos.data() + first, S - first, stayed.data());
  engine::SessionOptions small = o;
  small.capacity = S - first;
  engine::Session b(c.model, small);
  b.open_context(ctx);
  EXPECT_EQ(b.size(), first);
  EXPECT_EQ(b.next_position(), first);
  EXPECT_EQ(b.capacity(), S);
  b.forward(tokens.data() + first, pos.data() + first, S - first, opened.data());
  EXPECT_EQ(opened, stayed);
  EXPECT_EQ(b.memory_stats().memory_tokens, a.memory_stats().memory_tokens);
  return opened;
}

// A session with a memory saved after part of a sequence (save_context) and continued in another session
// (open_context) gives the rest of the sequence the bits the session that went on gives it, and that one sequence
// through one session gives (the chunks fall at the same places); generate() after a context goes on from it;
// what does not fit is refused by name.
TEST_P(HfEngineFixture, ASavedContextGoesOnAsTheSessionThatStayed) {
  const fs::path dir = kFixtures / GetParam();
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  const Expected e = read_expected(dir);
  const EncodingConfig enc = c.spec.config.resolved_encoding();
  const int64_t S = int64_t(e.tokens.size()), first = 9, d = c.spec.config.d_model;  // first: whole chunks of 3
  const std::string ctx = ::testing::TempDir() + "/rotary_ctx_" + GetParam() + "_" + std::to_string(::getpid());
  engine::SessionOptions o;
  o.capacity = S, o.positions = engine_positions(enc);
  o.memory = engine::MemoryOptions{.window = 4, .top_k = 3, .chunk = 3};
  const std::vector<int64_t> pos = positions_from_zero(S);
  std::vector<float> whole(size_t(S * d));
  engine::Session one(c.model, o);
  one.forward(e.tokens.data(), pos.data(), S, whole.data());
  const std::vector<float> opened = expect_context_continues(c, e.tokens, o, first, ctx);
  EXPECT_EQ(opened, std::vector<float>(whole.begin() + first * d, whole.end()));
  engine::SessionOptions small = o;
  small.capacity = S - first;

  // generate() after a context: the rest of the prompt, then new tokens, as one session over the whole prompt.
  const std::vector<int64_t> rest(e.tokens.begin() + first, e.tokens.end()), all(e.tokens.begin(), e.tokens.end());
  o.capacity = S + 4;
  engine::Session g1(c.model, o);
  const std::vector<int64_t> want = engine::generate(g1, all, {.max_new = 4});
  small.capacity = S - first + 4;
  engine::Session g2(c.model, small);
  g2.open_context(ctx);
  EXPECT_EQ(engine::generate(g2, rest, {.max_new = 4}), want);

  // Refused: a session that holds tokens, one without a memory (whose files are the KV caches'), other settings
  // (the files' fingerprint or layout).
  expect_error([&] { g2.open_context(ctx); }, {"open_context", "an empty session"});
  engine::SessionOptions plain = o;
  plain.memory.reset();
  expect_error([&] { engine::Session(c.model, plain).open_context(ctx); }, {ctx + "/context.json", "saved with a memory"});
  expect_error([&] { engine::Session(c.model, plain).save_context(ctx); }, {"save_context", "an empty session"});
  expect_error([&] { engine::Session(c.model, o).save_context(ctx); }, {"save_context", "an empty session"});
  EncodingConfig rerope = enc;
  rerope.kind = EncodingKind::Rerope, rerope.window = 3;
  engine::SessionOptions other = o;
  other.positions = engine_positions(rerope);
  expect_error([&] { engine::Session(c.model, other).open_context(ctx); },
                 {ctx + "/context.json", "saved with", "the same positions, cache and memory settings"});
  other = o, other.memory->storage = DType::BF16;
  expect_error([&] { engine::Session(c.model, other).open_context(ctx); },
                 {ctx + "/context.json", "saved with", "the same positions, cache and memory settings"});
  std::filesystem::remove_all(ctx);
}

// A search that keeps what it built (MemorySearch::save / open): save_context hands each layer's search the path
// layer<i>.search once the caches are written, and a search that keeps nothing leaves no file (an earlier save's
// is removed, so no stale search of other rows survives); open_context hands the new session's searches the files
// the manifest names, before their first sync, and no path when it names none. Here each search keeps the
// memory's size at the save, checked when read back.
TEST_P(HfEngineFixture, ASearchKeepsWhatItBuiltInASavedContext) {
  const fs::path dir = kFixtures / GetParam();
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  const Expected e = read_expected(dir);
  const EncodingConfig enc = c.spec.config.resolved_encoding();
  const int64_t S = int64_t(e.tokens.size()), first = 9, layers = c.spec.config.n_layers;
  const std::string ctx = ::testing::TempDir() + "/rotary_sctx_" + GetParam() + "_" + std::to_string(::getpid());
  struct Calls {
    std::vector<std::string> saved, opened;
    int64_t read_back = 0;  // opens that found their file, the memory's size as saved
  };
  struct Keeping final : engine::MemorySearch {
    const KvMemory& memory;
    bool keep;
    Calls* calls;
    bool synced = false;
    Keeping(const KvMemory& m, bool k, Calls* cs) : memory(m), keep(k), calls(cs) {}
    void sync() override { synced = true; }
    double candidates(const MemoryAttentionParams& p, int64_t* out) override {
      std::fill(out, out + p.tokens * p.q.heads * p.top_k, int64_t(-1));
      return 0.0;
    }
    void save(const std::string& path) override {
      if (!keep) return;
      calls->saved.push_back(path);
      std::ofstream(path) << memory.size();
    }
    void open(const std::string& path) override {
      calls->opened.push_back(path);
      EXPECT_FALSE(synced) << "opened after a sync";
      std::ifstream in(path);
      int64_t rows = -1;
      if (!(in >> rows)) return;
      EXPECT_EQ(rows, memory.size()) << path;
      ++calls->read_back;
    }
  };
  auto options = [&](bool keep, Calls* calls) {
    engine::SessionOptions o;
    o.capacity = S, o.positions = engine_positions(enc);
    o.memory = engine::MemoryOptions{.window = 4, .top_k = 3, .chunk = 3};
    o.memory->search_factory = [keep, calls](const KvMemory& m) { return std::make_unique<Keeping>(m, keep, calls); };
    return o;
  };
  std::vector<std::string> files;
  for (int64_t i = 0; i < layers; ++i) files.push_back(ctx + "/layer" + std::to_string(i) + ".search");
  const std::vector<int64_t> pos = positions_from_zero(S);
  Calls saving, opening;
  {
    engine::Session a(c.model, options(true, &saving));
    a.forward(e.tokens.data(), pos.data(), first, nullptr);
    a.save_context(ctx);
  }
  EXPECT_EQ(saving.saved, files);
  engine::Session b(c.model, options(true, &opening));
  b.open_context(ctx);
  EXPECT_EQ(opening.opened, files);
  EXPECT_EQ(opening.read_back, layers);
  b.forward(e.tokens.data() + first, pos.data() + first, S - first, nullptr);  // goes on after what it read
  // Saved again by a search that keeps nothing: no search file is left; opened, its searches find none.
  Calls plain, after;
  {
    engine::Session a(c.model, options(false, &plain));
    a.forward(e.tokens.data(), pos.data(), first, nullptr);
    a.save_context(ctx);
  }
  for (const std::string& f : files) EXPECT_FALSE(std::filesystem::exists(f)) << f;
  engine::Session(c.model, options(true, &after)).open_context(ctx);
  EXPECT_TRUE(after.opened.empty());  // the manifest names no search file: the searches build as usual
  EXPECT_EQ(after.read_back, 0);
  std::filesystem::remove_all(ctx);
}

// A session without a memory saved after its prompt (its KV caches, KvCache::save) and continued in another session
// gives the tokens after it the bits the session that went on gives them - f32, bf16 and q8 caches, RoPE and
// ReRoPE - and generate() after the context the tokens of one session over the whole prompt. Refused: a one-pass
// session (no caches), a context saved with another cache storage or method (named by its file).
TEST_P(HfEngineFixture, ASavedKvCacheContextGoesOnAsTheSessionThatStayed) {
  const fs::path dir = kFixtures / GetParam();
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  const Expected e = read_expected(dir);
  const EncodingConfig enc = c.spec.config.resolved_encoding();
  const ReropeVariants variants = rerope_variants(enc);
  const int64_t S = int64_t(e.tokens.size()), first = 7;
  const std::string ctx = ::testing::TempDir() + "/rotary_kvctx_" + GetParam() + "_" + std::to_string(::getpid());
  const std::vector<int64_t> pos = positions_from_zero(S);
  struct Run {
    const EncodingConfig* method;
    DType dtype;
    KvStorage storage;
  };
  for (const Run& r : {Run{&enc, DType::F32, KvStorage::Dtype}, Run{&enc, DType::BF16, KvStorage::Dtype},
                       Run{&variants.rerope, DType::F32, KvStorage::Q8}}) {
    SCOPED_TRACE(std::string(encoding_kind_name(r.method->kind)) + " kv " + dtype_name(r.dtype) + " " +
                 kv_storage_name(r.storage));
    engine::SessionOptions o;
    o.capacity = S, o.positions = engine_positions(*r.method), o.kv_dtype = r.dtype, o.kv_storage = r.storage;
    expect_context_continues(c, e.tokens, o, first, ctx);
    engine::SessionOptions small = o;
    small.capacity = S - first;

    const std::vector<int64_t> rest(e.tokens.begin() + first, e.tokens.end());
    o.capacity = S + 3, small.capacity = S - first + 3;
    engine::Session g1(c.model, o);
    g1.forward(e.tokens.data(), pos.data(), first, nullptr);
    const std::vector<int64_t> want = engine::generate(g1, rest, {.max_new = 3});
    engine::Session g2(c.model, small);
    g2.open_context(ctx);
    EXPECT_EQ(engine::generate(g2, rest, {.max_new = 3}), want);

    engine::SessionOptions other = small;
    other.kv_storage = r.storage == KvStorage::Q8 ? KvStorage::Dtype : KvStorage::Q8, other.kv_dtype = DType::F32;
    expect_error([&] { engine::Session(c.model, other).open_context(ctx); },
                 {ctx + "/context.json", "saved with", "the same positions, cache and memory settings"});
    other = small, other.positions = engine_positions(r.method == &enc ? variants.leaky : enc);
    expect_error([&] { engine::Session(c.model, other).open_context(ctx); },
                 {ctx + "/context.json", "saved with", "the same positions, cache and memory settings"});
    other = small, other.keep_caches = false;
    expect_error([&] { engine::Session(c.model, other).open_context(ctx); }, {"open_context", "keep_caches = false"});
  }
  std::filesystem::remove_all(ctx);
}

// A saved context is one unit (issue 48): its manifest, written last, names every file with its size and content
// hash and the model by content; each layer file carries the save's id and its layer in its fingerprint; a save holds
// a lock, removes the earlier manifest first and every earlier file after. Each case below was accepted before, and
// continued with rows of another session, another layer or another model.
TEST(HfEngine, ASavedContextIsOneUnit) {
  const fs::path dir = kFixtures / "llama3";
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  const Expected e = read_expected(dir);
  const int64_t S = int64_t(e.tokens.size());
  ASSERT_GE(c.spec.config.n_layers, 2);
  const std::string base = ::testing::TempDir() + "/rotary_unit_" + std::to_string(::getpid());
  const std::string ctx = base + "/ctx", other_ctx = base + "/other";
  engine::SessionOptions o;
  o.capacity = S, o.positions = engine_positions(c.spec.config.resolved_encoding());
  const std::vector<int64_t> pos = positions_from_zero(S);
  auto save = [&](const std::string& where, int64_t n, int64_t offset) {
    engine::Session s(c.model, o);
    s.forward(e.tokens.data() + offset, pos.data(), n, nullptr);
    s.save_context(where);
  };
  auto open = [&](const std::string& where) {
    engine::SessionOptions small = o;
    small.capacity = 4;
    engine::Session s(c.model, small);
    s.open_context(where);
    return s.size();
  };
  auto copy = [](const std::string& from, const std::string& to) {
    fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  };
  save(ctx, 6, 0);
  save(other_ctx, 6, 1);  // the same length, other tokens: every file has the same size as ctx's
  EXPECT_EQ(open(ctx), 6);
  ASSERT_TRUE(fs::exists(ctx + "/context.json"));

  // A layer file of another save (a re-save killed between two layers' renames, two saves at once): refused by the
  // manifest's content hash; with the manifest rewritten to match, by the file's own fingerprint (its save id).
  copy(other_ctx + "/layer1.kv", ctx + "/layer1.kv");
  expect_error([&] { open(ctx); }, {ctx + "/layer1.kv", "content hash", "context.json"});
  copy(other_ctx + "/context.json", ctx + "/context.json");
  expect_error([&] { open(ctx); }, {ctx + "/layer0.kv", "content hash"});
  copy(other_ctx + "/layer0.kv", ctx + "/layer0.kv");
  EXPECT_EQ(open(ctx), 6);  // all of the other save now: one unit again

  // Swapped layers, with a manifest that records the swap: each file knows its layer.
  save(ctx, 6, 0);
  fs::rename(ctx + "/layer0.kv", ctx + "/swap"), fs::rename(ctx + "/layer1.kv", ctx + "/layer0.kv");
  fs::rename(ctx + "/swap", ctx + "/layer1.kv");
  expect_error([&] { open(ctx); }, {ctx + "/layer0.kv", "content hash"});
  {
    std::ifstream in(ctx + "/context.json");
    std::string manifest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const size_t a = manifest.find("\"layer0.kv\""), b = manifest.find("\"layer1.kv\"");
    ASSERT_NE(a, std::string::npos);
    ASSERT_NE(b, std::string::npos);
    manifest.replace(a, 11, "\"layer1.kv\""), manifest.replace(b, 11, "\"layer0.kv\"");
    std::ofstream(ctx + "/context.json", std::ios::trunc) << manifest;
  }
  expect_error([&] { open(ctx); }, {ctx + "/layer0.kv", "fingerprint"});

  // A save that did not finish leaves no manifest: nothing of it, nor of the save before, is read.
  save(ctx, 6, 0);
  fs::remove(ctx + "/context.json");
  expect_error([&] { open(ctx); }, {"open_context " + ctx, "no context.json", "whose save finished"});

  // A save of the other kind removes the earlier one's files: a KV-cache save leaves no layer<i>.memory / .window,
  // and a leftover temporary file of a killed writer goes too.
  {
    engine::SessionOptions m = o;
    m.memory = engine::MemoryOptions{.window = 4, .top_k = 3, .chunk = 3};
    engine::Session s(c.model, m);
    s.forward(e.tokens.data(), pos.data(), 9, nullptr);
    s.save_context(ctx);
  }
  ASSERT_TRUE(fs::exists(ctx + "/layer0.memory"));
  std::ofstream(ctx + "/layer0.kv.tmp.999999") << "left by a killed save";
  std::ofstream(ctx + "/notes.txt") << "the user's own file";
  save(ctx, 6, 0);
  EXPECT_FALSE(fs::exists(ctx + "/layer0.memory"));
  EXPECT_FALSE(fs::exists(ctx + "/layer0.window"));
  EXPECT_FALSE(fs::exists(ctx + "/layer0.kv.tmp.999999"));
  EXPECT_TRUE(fs::exists(ctx + "/notes.txt"));  // not a context's file: left alone
  {
    engine::SessionOptions m = o;
    m.memory = engine::MemoryOptions{.window = 4, .top_k = 3, .chunk = 3};
    expect_error([&] { engine::Session(c.model, m).open_context(ctx); }, {"context.json", "saved without a memory"});
  }

  // A symlink loop in place of a layer file: refused by name (was an uncaught filesystem error).
  fs::remove(ctx + "/layer1.kv");
  fs::create_symlink("layer1.kv", ctx + "/layer1.kv");
  expect_error([&] { open(ctx); }, {ctx + "/layer1.kv", "Too many levels of symbolic links"});

  // Two saves at once: the second is refused while the first holds the lock (held here by hand), naming its pid.
  save(ctx, 6, 0);
  {
    const int fd = ::open((ctx + "/context.lock").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
    ASSERT_EQ(::ftruncate(fd, 0), 0);
    ASSERT_EQ(::write(fd, "4242\n", 5), 5);
    expect_error([&] { save(ctx, 6, 0); }, {"save_context " + ctx, "pid 4242"});
    expect_error([&] { open(ctx); }, {"open_context " + ctx, "pid 4242"});
    ::close(fd);
  }
  EXPECT_EQ(open(ctx), 6);

  // A save onto a regular file, or of a session that could never be saved, is refused by check_save_context - which
  // the command line calls before the prompt is read.
  std::ofstream(base + "/file") << "x";
  expect_error([&] { engine::Session(c.model, o).check_save_context(base + "/file"); }, {"save_context dir", base + "/file"});
  engine::SessionOptions unl = o;
  unl.memory = engine::MemoryOptions{.policy = MemoryPolicy::Unlimiformer, .window = 4, .top_k = 3, .chunk = 3};
  expect_error([&] { engine::Session(c.model, unl).check_save_context(base + "/u"); }, {"save_context", "unlimiformer"});
  fs::remove_all(base);
}

// A context is bound to the weights by content: a model whose embedding rows are the same but another layer's
// weights differ (a fine-tune) is refused, as is the same model converted to another format; the same weights
// read from another copy give the same weights_hash.
TEST(HfEngine, ASavedContextIsBoundToTheWeightsByContent) {
  const fs::path dir = kFixtures / "llama2";
  const HfModelSpec spec = hf_model_spec_file(dir.string());
  const engine::Architecture arch = spec.arch;
  std::vector<std::vector<float>> stored;  // every slot's values, deterministic
  for (const engine::TensorSlot& slot : engine::tensor_slots(arch)) {
    int64_t n = 1;
    for (int64_t d : slot.shape) n *= d;
    std::vector<float>& v = stored.emplace_back(size_t(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = slot.name.ends_with("norm.weight") ? 1.0f : 0.02f * float((i * 7919 + int64_t(stored.size()) * 31) % 101 - 50) / 50.0f;
  }
  auto lookup = [&](const std::vector<std::vector<float>>& values) {
    return [&, values_ptr = &values](const std::string& name) {
      const std::vector<engine::TensorSlot> slots = engine::tensor_slots(arch);
      for (size_t i = 0; i < slots.size(); ++i)
        if (slots[i].name == name) return engine::StoredTensor{DType::F32, (*values_ptr)[i].data(), slots[i].shape};
      throw Error("rotary: no tensor " + name);
    };
  };
  std::vector<std::vector<float>> tuned = stored, copied = stored;
  const std::vector<engine::TensorSlot> slots = engine::tensor_slots(arch);
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i].name == "layers.1.down.weight") tuned[i][3] += 0.01f;  // one weight of one layer
  const auto base = engine::Model::load(arch, lookup(stored), {}, nullptr);
  const auto same = engine::Model::load(arch, lookup(copied), {}, nullptr);
  const auto fine_tuned = engine::Model::load(arch, lookup(tuned), {}, nullptr);
  const auto q8 = engine::Model::load(arch, lookup(stored), {.weights = WeightFormat::Q8}, nullptr);
  EXPECT_EQ(base->weights_hash(), same->weights_hash());
  EXPECT_NE(base->weights_hash(), fine_tuned->weights_hash());
  EXPECT_EQ(base->weights_hash(), q8->weights_hash());  // the stored weights; the format is checked on its own

  const std::string ctx = ::testing::TempDir() + "/rotary_bound_" + std::to_string(::getpid());
  engine::SessionOptions o;
  o.capacity = 8, o.positions = engine_positions(spec.config.resolved_encoding());
  const int64_t ids[4] = {1, 2, 3, 4}, pos[4] = {0, 1, 2, 3};
  {
    engine::Session s(base, o);
    s.forward(ids, pos, 4, nullptr);
    s.save_context(ctx);
  }
  engine::Session(same, o).open_context(ctx);
  expect_error([&] { engine::Session(fine_tuned, o).open_context(ctx); }, {ctx + "/context.json", "other weights"});
  expect_error([&] { engine::Session(q8, o).open_context(ctx); }, {ctx + "/context.json", "saved with weights f32", "--weights"});
  fs::remove_all(ctx);
}

// --weights f16 of a finite weight past f16's range: refused at load naming the tensor, the element and the limit
// (was: converted to Inf, then refused at the logits as if the checkpoint's weights were not finite).
TEST(HfEngine, AWeightPastF16sRangeIsRefusedAtConversion) {
  const fs::path dir = kFixtures / "llama2";
  const engine::Architecture arch = hf_model_spec_file(dir.string()).arch;
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

INSTANTIATE_TEST_SUITE_P(Families, HfEngineFixture, ::testing::ValuesIn(kFamilies));

// A memory's settings that cannot run are refused by name when the session is made.
TEST(HfEngine, RefusesMemorySettingsByName) {
  const fs::path dir = kFixtures / "llama2";
  const HfEngineCheckpoint c = load_hf_engine(dir.string());
  engine::SessionOptions o;
  o.capacity = 32, o.positions = engine_positions(c.spec.config.resolved_encoding());
  o.memory = engine::MemoryOptions{.window = 4};
  engine::Session ok(c.model, o);
  engine::SessionOptions bad = o;
  bad.kv_dtype = DType::BF16;
  expect_error([&] { engine::Session(c.model, bad); }, {"kv_dtype = bf16", "f32 with a memory"});
  bad.kv_dtype = DType::F32, bad.kv_storage = KvStorage::Q8;
  expect_error([&] { engine::Session(c.model, bad); }, {"kv_storage = q8", "dtype with a memory"});
  bad = o, bad.memory->top_k = -1;
  expect_error([&] { engine::Session(c.model, bad); }, "memory.top_k = -1");
  bad = o, bad.memory->chunk = -2;
  expect_error([&] { engine::Session(c.model, bad); }, "memory.chunk = -2");
  bad = o, bad.memory->window = 0;
  expect_error([&] { engine::Session(c.model, bad); }, "window = 0");
  bad = o, bad.memory->storage = DType::F64;
  expect_error([&] { engine::Session(c.model, bad); }, "f64");
  bad = o, bad.positions.rope.scaling = RopeScaling::Dynamic, bad.positions.rope.factor = 2;
  bad.positions.rope.max_position_embeddings = 16;
  expect_error([&] { engine::Session(c.model, bad); }, {"positions.rope.scaling = dynamic", "do not change"});
  bad = o, bad.positions.mode = PositionMode::Rerope, bad.positions.window = 8, bad.memory->policy = MemoryPolicy::Rerope;
  expect_error([&] { engine::Session(c.model, bad); }, "window");  // the ReRoPE window 8 > the memory's window 4
}

// What the engine refuses, each by name, before any work: tensors that do not fit the architecture, and sessions
// and tokens that do not fit the session.
TEST(HfEngine, RefusesBadTensorsAndBadInputByName) {
  const fs::path dir = kFixtures / "llama2";
  const HfModelSpec spec = hf_model_spec_file(dir.string());
  const engine::Architecture arch = spec.arch;
  const HfEngineCheckpoint good = load_hf_engine(dir.string());
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
  // q8 activations need q8 matrices, which only a conversion at load makes.
  expect_error([&] { engine::Model::load(arch, lookup_with("", {}), {.weights = WeightFormat::BF16, .activations = ActivationFormat::Q8}, nullptr); },
               {"activations = q8 with weights converted to bf16", "--weights q8"});
  expect_error([&] { engine::Model::load(arch, lookup_with("", {}), {.weights = std::nullopt, .activations = ActivationFormat::Q8}, nullptr); },
               {"activations = q8 with weights as stored", "--weights q8"});

  engine::SessionOptions o;
  o.capacity = 8, o.positions = engine_positions(spec.config.resolved_encoding());
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
}  // namespace rotary::nn
