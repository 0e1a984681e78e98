// The transformer: shapes, fused == plain (logits and parameter gradients, float64 and float32) for every encoding,
// the relative-position property of the RoPE family, causality, learned-position limits and overrides.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include <algorithm>
#include <cfloat>
#include <limits>

#include "model_cases.h"
#include "rotary/error.h"
#include "rotary/t5_bias.h"
#include "rotary_nn/attention.h"

namespace rotary::nn {
namespace {

using testing::all_cases;
using testing::Case;
using testing::small_config;

constexpr int64_t kBatch = 2, kSeq = 16;

Transformer make(ModelConfig c, bool fused, torch::ScalarType dtype) {
  c.fused = fused;
  torch::manual_seed(1234);  // same seed -> same weights whatever the encoding and path
  Transformer m(c);
  m->to(dtype);
  return m;
}

torch::Tensor tokens_for(const ModelConfig& c, int64_t seq = kSeq, uint64_t seed = 7) {
  torch::manual_seed(seed);
  return torch::randint(0, c.vocab_size, {kBatch, seq}, torch::kLong);
}

double max_abs(const torch::Tensor& t) { return t.abs().max().item<double>(); }
double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return max_abs(a.to(torch::kDouble) - b.to(torch::kDouble)); }

// Logits and every parameter gradient of loss = sum(logits * W), W fixed.
struct Result {
  torch::Tensor logits;
  std::vector<std::pair<std::string, torch::Tensor>> grads;
};

Result run(Transformer& m, const torch::Tensor& tokens) {
  m->zero_grad();
  const torch::Tensor logits = m->forward(tokens);
  torch::manual_seed(99);
  const torch::Tensor w = torch::randn(logits.sizes(), torch::kDouble).to(logits.scalar_type());
  (logits * w).sum().backward();
  Result r{logits.detach(), {}};
  for (const auto& p : m->named_parameters()) {
    EXPECT_TRUE(p.value().grad().defined()) << p.key() << " got no gradient";
    r.grads.emplace_back(p.key(), p.value().grad().detach().clone());
  }
  return r;
}

void shapes_and_finite_logits(const ModelConfig& c) {
  Transformer m = make(c, true, torch::kFloat);
  const torch::Tensor logits = m->forward(tokens_for(c));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{kBatch, kSeq, c.vocab_size}));
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
  auto params = m->named_parameters();
  EXPECT_EQ(params["block0.wk.weight"].sizes(), (std::vector<int64_t>{c.kv_heads() * c.head_dim(), c.d_model}));
  EXPECT_EQ(params.contains("lm_head.weight"), !c.tie_embeddings);
  EXPECT_EQ(params.contains("pos_emb.weight"), c.encoding.kind == EncodingKind::Learned);
  EXPECT_EQ(params.contains("ln_final.weight"), c.pre_norm);
}

// float64: both paths compute the same function with rounding ~1e-16 per operation and sums of at most a few
// hundred terms (measured: <= 2e-15 relative); 1e-10 leaves margin yet is far below any formula error (a wrong
// attention factor on ReRoPE's far scores shows up at ~1e-2). The 1e-14 floor is for gradients that are zero in
// exact arithmetic (the key bias without position encoding: softmax ignores a constant shift), where both paths
// return rounding noise of ~1e-17.
void fused_equals_plain_float64(const ModelConfig& c, int64_t seq = kSeq) {
  Transformer fused = make(c, true, torch::kDouble), plain = make(c, false, torch::kDouble);
  const torch::Tensor tokens = tokens_for(c, seq);
  const Result f = run(fused, tokens), p = run(plain, tokens);
  EXPECT_LE(max_diff(f.logits, p.logits), 1e-10 * max_abs(p.logits));
  ASSERT_EQ(f.grads.size(), p.grads.size());
  for (size_t i = 0; i < f.grads.size(); ++i) {
    ASSERT_EQ(f.grads[i].first, p.grads[i].first);
    EXPECT_LE(max_diff(f.grads[i].second, p.grads[i].second), 1e-10 * max_abs(p.grads[i].second) + 1e-14)
        << f.grads[i].first;
  }
}

// The scale a parameter's gradient is measured against: the largest gradient of its module (the parameter and its
// siblings, e.g. block0.wk.weight and block0.wk.bias), in the float64 truth. For most parameters that is about
// their own size; for one whose gradient is zero in exact arithmetic (the key bias wherever scores ignore a
// per-row shift: none, learned, sinusoidal, ALiBi, with or without log-n) it is the size of the terms that cancel
// into that zero, which is what the rounding noise of either path is proportional to.
double module_scale(const Result& truth, size_t i) {
  const std::string& name = truth.grads[i].first;
  const std::string module = name.substr(0, name.rfind('.') + 1);
  double scale = 0;
  for (const auto& [other, grad] : truth.grads)
    if (other.compare(0, module.size(), module) == 0 && other.find('.', module.size()) == std::string::npos)
      scale = std::max(scale, max_abs(grad));
  return scale;
}

// float32, the flash-attention way: the fused float32 model may differ from the float64 truth (the plain model in
// float64, same weights) by at most 3x what the plain float32 model itself gets wrong, plus a floor of 8 float32
// ulps of the scale of the quantity (the logits' largest value; a gradient's module scale, above). The floor is
// what keeps a gradient that is zero in exact arithmetic from comparing one rounding noise with three times
// another: on an AMD EPYC (AVX-512) the key bias of `none_logn` came out at 2.98e-8 fused against 0.87e-8 plain,
// both noise, while its module's scale is ~1e-1 (floor ~1e-7). Measured otherwise: <= 2.2x the plain error.
void fused_matches_plain_float32(const ModelConfig& c, int64_t seq = kSeq) {
  Transformer fused = make(c, true, torch::kFloat), plain = make(c, false, torch::kFloat);
  Transformer truth = make(c, false, torch::kDouble);
  const torch::Tensor tokens = tokens_for(c, seq);
  const Result f = run(fused, tokens), p = run(plain, tokens), t = run(truth, tokens);
  auto bound = [](const torch::Tensor& plain32, const torch::Tensor& ref, double scale) {
    return 3.0 * max_diff(plain32, ref) + 8.0 * FLT_EPSILON * scale;
  };
  EXPECT_LE(max_diff(f.logits, t.logits), bound(p.logits, t.logits, max_abs(t.logits)));
  for (size_t i = 0; i < f.grads.size(); ++i)
    EXPECT_LE(max_diff(f.grads[i].second, t.grads[i].second), bound(p.grads[i].second, t.grads[i].second, module_scale(t, i)))
        << f.grads[i].first << " (module scale " << module_scale(t, i) << ")";
}

// Where a gradient is zero in exact arithmetic, both paths must return ~0 on their own: at most 8 float32 ulps
// of the module's scale (the floor above), so the comparison cannot pass on two equally wrong paths. The float64
// truth shows which gradients are zero: below 1e-12 of the module scale (rounding there is ~1e-16).
void exact_zero_gradients_stay_zero_float32(const ModelConfig& c) {
  Transformer fused = make(c, true, torch::kFloat), plain = make(c, false, torch::kFloat);
  Transformer truth = make(c, false, torch::kDouble);
  const torch::Tensor tokens = tokens_for(c);
  const Result f = run(fused, tokens), p = run(plain, tokens), t = run(truth, tokens);
  int zeros = 0;
  for (size_t i = 0; i < t.grads.size(); ++i) {
    const double scale = module_scale(t, i);
    if (max_abs(t.grads[i].second) > 1e-12 * scale) continue;
    ++zeros;
    EXPECT_LE(max_abs(f.grads[i].second), 8.0 * FLT_EPSILON * scale) << "fused " << t.grads[i].first;
    EXPECT_LE(max_abs(p.grads[i].second), 8.0 * FLT_EPSILON * scale) << "plain " << t.grads[i].first;
  }
  // Softmax scores that ignore a per-row shift make every layer's key bias gradient zero: the check above ran.
  if (c.attention == AttentionKind::Softmax && !is_rotary(c.encoding.kind)) {
    EXPECT_GE(zeros, c.n_layers);
  }
}

// Changing token t changes no logit before t (and does change logits from t on: the test can fail).
void causal(const ModelConfig& c) {
  using torch::indexing::Slice;
  for (bool fused_path : {true, false}) {
    SCOPED_TRACE(fused_path ? "fused" : "plain");
    Transformer m = make(c, fused_path, torch::kDouble);
    torch::Tensor tokens = tokens_for(c);
    const torch::Tensor before = m->forward(tokens).detach();
    const int64_t t = 10;
    tokens.index_put_({Slice(), t}, (tokens.index({Slice(), t}) + 1) % c.vocab_size);
    const torch::Tensor after = m->forward(tokens).detach();
    EXPECT_LE(max_diff(before.index({Slice(), Slice(0, t)}), after.index({Slice(), Slice(0, t)})),
              1e-12 * max_abs(before));
    EXPECT_GT(max_diff(before.index({Slice(), Slice(t)}), after.index({Slice(), Slice(t)})), 1e-6);
  }
}

// One test per property, looping over every case in one process: a test process pays ~1 s to load libtorch, so
// one ctest per (property, case) pair would take minutes.
void for_every_case(void (*check)(const ModelConfig&)) {
  for (const Case& cs : all_cases()) {
    SCOPED_TRACE(cs.name);
    check(cs.config);
  }
}

// The two starts, parameter by parameter: gpt2 draws N(0, 0.02) everywhere; fan_in bounds a matrix by
// 1/sqrt(its inputs) (wq: d_model, fc_out: 4 d_model) and draws embeddings N(0, 1); both zero the biases and start
// the norms at identity. Sample moments of >= 1,600 draws: std within 15% (a 1e-6 failure chance at these sizes).
TEST(model, InitKindsDrawWhatTheyName) {
  for (InitKind init : kInitKinds) {
    ModelConfig c = small_config("learned");  // d_model 64, 2 kv heads of 16
    c.d_ff = 0, c.vocab_size = 40, c.tie_embeddings = false, c.init = init;
    torch::manual_seed(5);
    Transformer m(c);
    auto params = m->named_parameters();
    SCOPED_TRACE(std::string(init_kind_name(init)));
    auto expect_std = [](const torch::Tensor& w, double want, const std::string& name) {
      EXPECT_NEAR(w.std().item<double>(), want, 0.15 * want) << name;
    };
    const bool fan_in = init == InitKind::FanIn;
    for (const char* name : {"block0.wq.weight", "block1.wk.weight", "block0.wo.weight", "block0.fc_in.weight"}) {
      const torch::Tensor w = params[name];
      const double bound = 1.0 / std::sqrt(double(w.size(1)));
      expect_std(w, fan_in ? bound / std::sqrt(3.0) : 0.02, name);
      if (fan_in) {
        EXPECT_LE(max_abs(w), bound) << name;
      }
    }
    const torch::Tensor out = params["block0.fc_out.weight"];  // 4 d_model inputs: half the bound of wq's
    expect_std(out, fan_in ? 1.0 / std::sqrt(3.0 * 256) : 0.02, "fc_out");
    expect_std(params["lm_head.weight"], fan_in ? 1.0 / std::sqrt(3.0 * 64) : 0.02, "lm_head");
    expect_std(params["tok_emb.weight"], fan_in ? 1.0 : 0.02, "tok_emb");
    expect_std(params["pos_emb.weight"], fan_in ? 1.0 : 0.02, "pos_emb");
    EXPECT_EQ(max_abs(params["block0.wq.bias"]), 0.0);
    EXPECT_EQ(max_abs(params["block0.fc_out.bias"]), 0.0);
    EXPECT_TRUE(torch::equal(params["block0.ln_attn.weight"], torch::ones({64})));
    EXPECT_EQ(max_abs(params["block0.ln_attn.bias"]), 0.0);
  }
}

// A plain model moved to the fused kernels keeps its weights, dtype and mode, and computes the same logits.
TEST(model, OnAttentionPathKeepsTheWeights) {
  ModelConfig c = small_config("rope");
  Transformer plain = make(c, false, torch::kDouble);
  plain->eval();
  Transformer fused = on_attention_path(plain, true);
  EXPECT_TRUE(fused->config().fused);
  EXPECT_FALSE(fused->is_training());
  auto want = plain->named_parameters();
  for (const auto& p : fused->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), want[p.key()])) << p.key();
  const torch::Tensor tokens = tokens_for(c);
  const torch::Tensor a = plain->forward(tokens), b = fused->forward(tokens);
  EXPECT_EQ(b.scalar_type(), torch::kDouble);
  EXPECT_LE(max_diff(a, b), 1e-10 * max_abs(a));  // float64 rounding, as FusedEqualsPlainFloat64
}

// The cases above are 16 tokens: one tile of the fused kernels (64 keys). Here 150 tokens (three key tiles, a
// partial last one), with fan_in's larger scores: the key-value runs that train on the plain path and not on the
// fused one (docs/tasks.md) made this worth checking at their sizes.
TEST(model, FusedEqualsPlainAcrossTiles) {
  for (const char* kind : {"rope", "rerope"}) {
    SCOPED_TRACE(kind);
    ModelConfig c = small_config(kind);
    c.max_seq_len = 200, c.init = InitKind::FanIn, c.tie_embeddings = false;
    if (is_windowed(c.encoding.kind)) c.encoding.window = 40;
    fused_equals_plain_float64(c, 150);
    fused_matches_plain_float32(c, 150);
  }
}

TEST(every_kind, ShapesAndFiniteLogits) { for_every_case(shapes_and_finite_logits); }
TEST(every_kind, FusedEqualsPlainFloat64) {
  for_every_case([](const ModelConfig& c) { fused_equals_plain_float64(c); });
}
TEST(every_kind, FusedMatchesPlainFloat32) {
  for_every_case([](const ModelConfig& c) { fused_matches_plain_float32(c); });
}
TEST(every_kind, ExactZeroGradientsStayZeroFloat32) { for_every_case(exact_zero_gradients_stay_zero_float32); }
TEST(every_kind, Causal) { for_every_case(causal); }

// RoPE-family scores depend on pos_i - pos_j only (ReRoPE/Leaky ReRoPE clip or compress that same difference), so
// shifting every position leaves the logits unchanged; absolute encodings and log-n do change.
TEST(model, ShiftingPositionsLeavesRotaryLogitsUnchanged) {
  for (const Case& cs : all_cases()) {
    const ModelConfig& c = cs.config;
    // A performer with rope is relative only in expectation over its random draw: one fixed projection w is not
    // rotation-invariant, so phi(R(m) q) . phi(R(n) k) depends on m, n and not only on n - m.
    if (c.attention == AttentionKind::Performer && is_rotary(c.encoding.kind)) continue;
    const bool relative = is_rotary(c.encoding.kind) && c.encoding.logn_train_len == 0;
    const bool absolute = c.encoding.kind == EncodingKind::Learned || c.encoding.kind == EncodingKind::Sinusoidal || c.encoding.logn_train_len > 0;
    if (!relative && !absolute) continue;
    for (bool fused_path : {true, false}) {
      Transformer m = make(c, fused_path, torch::kDouble);
      const torch::Tensor tokens = tokens_for(c);
      const torch::Tensor pos = torch::arange(kSeq, torch::kLong).expand({kBatch, kSeq});
      const torch::Tensor a = m->forward(tokens, pos).detach(), b = m->forward(tokens, pos + 9).detach();
      if (relative) EXPECT_LE(max_diff(a, b), 1e-9 * max_abs(a)) << cs.name << (fused_path ? " fused" : " plain");
      else EXPECT_GT(max_diff(a, b), 1e-6) << cs.name << (fused_path ? " fused" : " plain");
    }
  }
}

// The fused == plain tests above would pass just as well with a second plain formulation on the fused side; this
// one fails unless fused linear attention really runs the core op (its autograd node is the op's C++ function).
// GQA (4 query heads, 2 kv heads) as in small_config.
// T5's bias, written out element by element: s_ij = q_i . k_j / sqrt(D) + bias[bucket(i - j), h], causal softmax.
TEST(t5, PlainAttentionAddsTheBiasOfEachPairsBucket) {
  const int64_t S = 21, H = 2, D = 8;
  EncodingConfig e;
  e.kind = EncodingKind::T5;
  e.t5_num_buckets = 8;
  e.t5_max_distance = 12;
  torch::manual_seed(3);
  const auto f64 = torch::kDouble;
  const torch::Tensor bias = torch::randn({8, H}, f64);
  const PositionContext pc = make_position_context(e, int(H), int(D), 0, bias);
  const torch::Tensor q = torch::randn({1, S, H, D}, f64), k = torch::randn({1, S, H, D}, f64),
                      v = torch::randn({1, S, H, D}, f64);
  const torch::Tensor pos = torch::arange(S, torch::kLong).unsqueeze(0) + 5;  // distances 0..20: every bucket
  const torch::Tensor got = softmax_attention_plain(q, k, v, pos, pos, pc);
  auto acc = [](const torch::Tensor& t) { return t.accessor<double, 4>(); };
  const auto qa = acc(q), ka = acc(k), va = acc(v), ga = acc(got);
  const auto ba = bias.accessor<double, 2>();
  double worst = 0;
  std::set<int> buckets_seen;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < S; ++i) {
      std::vector<double> s(size_t(i + 1));
      double m = -INFINITY, z = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qa[0][i][h][d] * ka[0][j][h][d];
        const int b = t5_relative_bucket(i + 5, j + 5, false, 8, 12);
        buckets_seen.insert(b);
        s[size_t(j)] = dot / std::sqrt(double(D)) + ba[b][h];
        m = std::max(m, s[size_t(j)]);
      }
      for (double& x : s) z += (x = std::exp(x - m));
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t j = 0; j <= i; ++j) o += s[size_t(j)] / z * va[0][j][h][d];
        worst = std::max(worst, std::fabs(o - ga[0][i][h][d]));
      }
    }
  EXPECT_LT(worst, 1e-12);
  EXPECT_EQ(buckets_seen.size(), 8u);  // every bucket took part
}

// The fused path really runs the core kernel for the score-bias kinds (its autograd node is the op's function),
// equals the plain path, and returns the T5 table's gradient through the op: float64, gaps in the positions so
// distances pass max_distance (the clamped last bucket).
TEST(t5, FusedAttentionRunsTheCoreOpWithTheTableGradient) {
  const int64_t S = 40, Hq = 4, Hkv = 2, D = 16;
  for (const char* kind : {"t5", "alibi"}) {
    SCOPED_TRACE(kind);
    EncodingConfig e;
    e.kind = parse_encoding_kind(kind, "kind");
    e.t5_num_buckets = 8;
    e.t5_max_distance = 12;
    torch::manual_seed(4);
    const torch::Tensor table = torch::randn({8, Hq}, torch::kDouble).requires_grad_();
    const PositionContext pc = make_position_context(e, int(Hq), int(D), 0, table);
    auto input = [&](int64_t h) { return torch::randn({2, S, h, D}, torch::kDouble).requires_grad_(); };
    const torch::Tensor q = input(Hq), k = input(Hkv), v = input(Hkv);
    const torch::Tensor pos = torch::arange(S, torch::kLong).expand({2, S}) * 2 + 1;
    const torch::Tensor w = torch::randn({2, S, Hq, D}, torch::kDouble);
    std::vector<torch::Tensor> grads[2];
    torch::Tensor out[2];
    for (int fused = 0; fused < 2; ++fused) {
      out[fused] = model_attention(q, k, v, pos, pc, AttentionKind::Softmax, fused == 1);
      std::vector<torch::Tensor> wrt = {q, k, v};
      if (e.kind == EncodingKind::T5) wrt.push_back(table);
      grads[fused] = torch::autograd::grad({(out[fused] * w).sum()}, wrt);
    }
    ASSERT_TRUE(out[1].grad_fn());
    EXPECT_NE(out[1].grad_fn()->name().find("AttentionFunction"), std::string::npos) << out[1].grad_fn()->name();
    EXPECT_LE(max_diff(out[1], out[0]), 1e-12 * max_abs(out[0]));
    for (size_t i = 0; i < grads[0].size(); ++i)
      EXPECT_LE(max_diff(grads[1][i], grads[0][i]), 1e-11 * max_abs(grads[0][i])) << "input " << i;
    if (e.kind == EncodingKind::T5) {
      EXPECT_GT(max_abs(grads[1].back()), 0.0);
    }
  }
}

TEST(t5, TheBiasTableIsOneParameterThatLearns) {
  ModelConfig c = testing::small_config("t5");
  Transformer m(c);
  int tables = 0;
  for (const auto& p : m->named_parameters()) tables += p.key().find("t5_bias") != std::string::npos;
  EXPECT_EQ(tables, 1);  // shared by the layers, as in T5
  const torch::Tensor tokens = torch::randint(0, c.vocab_size, {2, 16}, torch::kLong);
  m->forward(tokens).logsumexp(-1).sum().backward();
  const torch::Tensor g = m->named_parameters()["t5_bias"].grad();
  ASSERT_TRUE(g.defined());
  EXPECT_EQ(g.sizes(), (std::vector<int64_t>{c.encoding.t5_num_buckets, c.n_heads}));
  EXPECT_GT(g.abs().max().item<double>(), 0.0);
}

TEST(model, FusedLinearAttentionRunsTheCoreOp) {
  ModelConfig c = small_config("rope");
  c.attention = AttentionKind::Linear;
  const PositionContext pc = make_position_context(c.resolved_encoding(), c.n_heads, c.head_dim(), kSeq);
  torch::manual_seed(3);
  auto make_input = [&](int64_t heads) {
    return torch::randn({kBatch, kSeq, heads, c.head_dim()}, torch::kDouble).requires_grad_();
  };
  const torch::Tensor q = make_input(c.n_heads), k = make_input(c.kv_heads()), v = make_input(c.kv_heads());
  const torch::Tensor pos = torch::arange(kSeq, torch::kLong).expand({kBatch, kSeq}) * 3;
  const torch::Tensor fused = model_attention(q, k, v, pos, pc, AttentionKind::Linear, /*fused=*/true);
  const torch::Tensor plain = model_attention(q, k, v, pos, pc, AttentionKind::Linear, /*fused=*/false);
  ASSERT_TRUE(fused.grad_fn() && plain.grad_fn());
  EXPECT_NE(fused.grad_fn()->name().find("LinearAttentionFunction"), std::string::npos) << fused.grad_fn()->name();
  EXPECT_EQ(plain.grad_fn()->name().find("LinearAttentionFunction"), std::string::npos) << plain.grad_fn()->name();
  EXPECT_LE(max_diff(fused, plain), 1e-12 * max_abs(plain));
}

TEST(model, LearnedPositionsBeyondMaxSeqLenThrow) {
  const ModelConfig c = small_config("learned");
  Transformer m = make(c, true, torch::kFloat);
  const torch::Tensor tokens = tokens_for(c);
  const torch::Tensor pos = torch::arange(kSeq, torch::kLong).expand({kBatch, kSeq});
  EXPECT_NO_THROW(m->forward(tokens, pos + (c.max_seq_len - kSeq)));
  try {
    m->forward(tokens, pos + (c.max_seq_len - kSeq + 1));
    ADD_FAILURE() << "no error";
  } catch (const rotary::Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_seq_len = 40"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m->generate(std::vector<int64_t>(30, 1), 12, 0.0, -1, 0), rotary::Error);
  EXPECT_THROW(m->forward(tokens.to(torch::kInt)), rotary::Error);
  EXPECT_THROW(m->forward(tokens + c.vocab_size), rotary::Error);
}

// Overrides change results where they should and not where they should not (each on both paths).
torch::Tensor logits_of(Transformer& m, int64_t seq = kSeq) { return m->forward(tokens_for(m->config(), seq)).detach(); }
void expect_same(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  EXPECT_LE(max_diff(a, b), 1e-9 * max_abs(a)) << what;
}
void expect_differ(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  EXPECT_GT(max_diff(a, b), 1e-6) << what;
}

void rope_to_rerope(bool fused) {
  Transformer m = make(small_config("rope"), fused, torch::kDouble);
  const torch::Tensor rope = logits_of(m);
  EncodingOverride o;
  o.kind = EncodingKind::Rerope;
  o.window = kSeq;  // every distance < window: plain RoPE
  m->set_override(o);
  expect_same(rope, logits_of(m), "rerope, window >= length");
  o.window = 5;
  m->set_override(o);
  const torch::Tensor rerope5 = logits_of(m);
  expect_differ(rope, rerope5, "rerope, window 5");
  // The same weights trained with rerope(5) give the same logits: the override is the trained encoding.
  Transformer trained = make(small_config("rerope"), fused, torch::kDouble);
  expect_same(rerope5, logits_of(trained), "override == trained rerope");
  o.kind = EncodingKind::LeakyRerope;
  o.leaky_k = 1.0;  // k = 1: distances beyond the window grow by 1 per token again, i.e. RoPE
  m->set_override(o);
  expect_same(rope, logits_of(m), "leaky_rerope k = 1");
  o.leaky_k = 4.0;
  m->set_override(o);
  expect_differ(rope, logits_of(m), "leaky_rerope k = 4");
  m->set_override({});
  expect_same(rope, logits_of(m), "empty override restores");
}

void rope_scaling(bool fused) {
  Transformer m = make(small_config("rope"), fused, torch::kDouble);
  const torch::Tensor rope = logits_of(m), rope24 = logits_of(m, 24);
  EncodingOverride o;
  o.rope = RopeSpec{};  // the trained spec again
  m->set_override(o);
  expect_same(rope, logits_of(m), "default spec");
  o.rope->scaling = RopeScaling::Linear;
  o.rope->factor = 2;
  m->set_override(o);
  expect_differ(rope, logits_of(m), "linear x2");
  // Dynamic NTK: no change up to max_position_embeddings, new frequencies beyond (computed per forward length).
  o.rope->scaling = RopeScaling::Dynamic;
  o.rope->max_position_embeddings = kSeq;
  m->set_override(o);
  expect_same(rope, logits_of(m), "dynamic, length == max_position_embeddings");
  expect_differ(rope24, logits_of(m, 24), "dynamic, length > max_position_embeddings");
}

void logn_only_changes_positions_past_the_training_length(bool fused) {
  using torch::indexing::Slice;
  Transformer m = make(small_config("rerope"), fused, torch::kDouble);
  const torch::Tensor base = logits_of(m);
  EncodingOverride o;
  o.logn_train_len = 8;  // factor max(1, ln(pos + 1) / ln 8) = 1 for pos <= 7
  m->set_override(o);
  const torch::Tensor scaled = logits_of(m);
  expect_same(base.index({Slice(), Slice(0, 8)}), scaled.index({Slice(), Slice(0, 8)}), "pos < 8");
  expect_differ(base.index({Slice(), Slice(8)}), scaled.index({Slice(), Slice(8)}), "pos >= 8");
  o = {};
  o.kind = EncodingKind::Alibi;
  EXPECT_THROW(m->set_override(o), rotary::Error);
  EXPECT_EQ(m->active_encoding().logn_train_len, 8);  // a rejected override changes nothing
}

void on_both_paths(void (*check)(bool)) {
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "plain");
    check(fused);
  }
}

TEST(overrides, RopeToRerope) { on_both_paths(rope_to_rerope); }
TEST(overrides, RopeScaling) { on_both_paths(rope_scaling); }
TEST(overrides, LognOnlyChangesPositionsPastTheTrainingLength) {
  on_both_paths(logn_only_changes_positions_past_the_training_length);
}

}  // namespace
}  // namespace rotary::nn
