// rotary extrapolate and rotary decay: the identities the methods must satisfy on a model (at the training length
// every factor-based method is plain RoPE; ReRoPE with a window past every distance and Leaky ReRoPE with k = 1
// are plain RoPE; and each one does change the logits past L), the decoded scoring of dynamic NTK (each token
// with the frequencies of its own length), the windows, bad input, and RoFormer's bound against a hand
// computation.
#include <gtest/gtest.h>

#include <cmath>

#include "experiments/decay.h"
#include "experiments/extrapolate_eval.h"
#include "experiments/extrapolate_methods.h"
#include "rotary/error.h"

namespace rotary::experiments {
namespace {

constexpr int64_t kL = 16;  // the "training length" of the untrained test model

nn::Transformer small_model(int vocab = 29, int layers = 2) {
  nn::ModelConfig c;
  c.vocab_size = vocab;
  c.d_model = 32;
  c.n_layers = layers;
  c.n_heads = 2;  // head dim 16: the fused kernel's smallest
  c.encoding.kind = nn::EncodingKind::Rope;
  torch::manual_seed(99);
  nn::Transformer m(c);
  m->to(torch::kDouble);
  m->eval();
  return m;
}

torch::Tensor random_tokens(int64_t seq, int vocab = 29) {
  torch::manual_seed(5);
  return torch::randint(0, vocab, {2, seq}, torch::kLong);
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

Method method(const std::string& name, bool logn = false, int64_t window = 0, double k = 0) {
  Method m;
  m.name = name;
  m.logn = logn;
  m.window = window;
  m.leaky_k = k;
  return m;
}

torch::Tensor logits_with(nn::Transformer& m, const Method& meth, int64_t test_len, const torch::Tensor& tokens) {
  m->set_override(method_override(meth, m->config().resolved_encoding(), kL, test_len));
  torch::NoGradGuard no_grad;
  return m->forward(tokens);
}

TEST(extrapolate_methods, AtTheTrainingLengthEveryFactorMethodIsPlainRope) {
  nn::Transformer m = small_model();
  const torch::Tensor tokens = random_tokens(kL);
  const torch::Tensor rope = logits_with(m, method("rope"), kL, tokens);
  for (const char* name : {"pi", "ntk", "ntk_mixed", "dynamic", "yarn"})
    for (bool logn : {false, true}) {
      SCOPED_TRACE(std::string(name) + (logn ? " + log n" : ""));
      EXPECT_LE(max_diff(logits_with(m, method(name, logn), kL, tokens), rope), 1e-12);
    }
  // ... and past L each of them changes something (so the identity above can fail).
  const torch::Tensor long_tokens = random_tokens(4 * kL);
  const torch::Tensor rope_long = logits_with(m, method("rope"), 4 * kL, long_tokens);
  for (const char* name : {"pi", "ntk", "ntk_mixed", "dynamic", "yarn"}) {
    SCOPED_TRACE(name);
    EXPECT_GT(max_diff(logits_with(m, method(name), 4 * kL, long_tokens), rope_long), 1e-6);
  }
}

TEST(extrapolate_methods, ReropeWithTheWindowPastEveryDistanceAndLeakyWithK1ArePlainRope) {
  nn::Transformer m = small_model();
  const torch::Tensor tokens = random_tokens(kL), long_tokens = random_tokens(4 * kL);
  const torch::Tensor rope = logits_with(m, method("rope"), kL, tokens);
  const torch::Tensor rope_long = logits_with(m, method("rope"), 4 * kL, long_tokens);
  EXPECT_LE(max_diff(logits_with(m, method("rerope", false, kL), kL, tokens), rope), 1e-12);
  EXPECT_LE(max_diff(logits_with(m, method("leaky_rerope", false, 4, 1.0), 4 * kL, long_tokens), rope_long), 1e-10);
  EXPECT_GT(max_diff(logits_with(m, method("rerope", false, kL / 2), 4 * kL, long_tokens), rope_long), 1e-6);
  EXPECT_GT(max_diff(logits_with(m, method("leaky_rerope", false, 4, 8.0), 4 * kL, long_tokens), rope_long), 1e-6);
  // log n leaves positions < L alone and changes those past it.
  using torch::indexing::Slice;
  const torch::Tensor logn = logits_with(m, method("rope", true), 4 * kL, long_tokens);
  EXPECT_LE(max_diff(logn.index({Slice(), Slice(0, kL)}), rope_long.index({Slice(), Slice(0, kL)})), 1e-12);
  EXPECT_GT(max_diff(logn.index({Slice(), Slice(kL)}), rope_long.index({Slice(), Slice(kL)})), 1e-6);
}

TEST(extrapolate_methods, OverrideFieldsFollowTheTestLength) {
  nn::Transformer m = small_model();
  const nn::EncodingConfig trained = m->config().resolved_encoding();
  const nn::EncodingOverride pi = method_override(method("pi"), trained, 128, 1024);
  EXPECT_EQ(pi.rope->scaling, RopeScaling::Linear);
  EXPECT_DOUBLE_EQ(pi.rope->factor, 8.0);
  const nn::EncodingOverride yarn = method_override(method("yarn", true), trained, 128, 512);
  EXPECT_DOUBLE_EQ(yarn.rope->factor, 4.0);
  EXPECT_EQ(yarn.rope->original_max_position_embeddings, 128);
  EXPECT_EQ(*yarn.logn_train_len, 128);
  const nn::EncodingOverride dyn = method_override(method("dynamic"), trained, 128, 1024);
  EXPECT_EQ(dyn.rope->max_position_embeddings, 128);
  EXPECT_EQ(*dyn.logn_train_len, 0);
  EXPECT_EQ(method("leaky_rerope", true, 64, 16).key(), "leaky_rerope_w64_k16_logn");
  EXPECT_EQ(method("rerope", true, 64).label(false), "ReRoPE-w64-log n†");
  EXPECT_EQ(method("rerope", true, 64).label(true), "ReRoPE-w64-log n");
}

TEST(extrapolate_methods, BadInputNamesTheField) {
  nn::Transformer m = small_model();
  const nn::EncodingConfig trained = m->config().resolved_encoding();
  auto message = [&](const Method& meth, const nn::EncodingConfig& enc) {
    try {
      method_override(meth, enc, 128, 1024);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message(method("rerope2"), trained).find("method = rerope2 is invalid; allowed: native, rope, pi"), std::string::npos);
  EXPECT_NE(message(method("rerope", false, 0), trained).find("window = 0"), std::string::npos);
  EXPECT_NE(message(method("rerope", false, 129), trained).find("window = 129"), std::string::npos);
  EXPECT_NE(message(method("leaky_rerope", false, 64, 0.5), trained).find("leaky_k = 0.5"), std::string::npos);
  nn::EncodingConfig roper = trained;
  roper.kind = nn::EncodingKind::Roper;
  EXPECT_NE(message(method("rope"), roper).find("encoding.kind = roper"), std::string::npos);
}

// On a checkpoint with its own scaling (Llama 3.1's llama3): native keeps it, the factor methods replace it
// (starting from the unscaled frequencies), and rerope keeps it under its window.
TEST(extrapolate_methods, ACheckpointsOwnScalingIsKeptOrReplaced) {
  nn::Transformer m = small_model();
  nn::EncodingConfig scaled = m->config().resolved_encoding();
  scaled.rope.scaling = RopeScaling::Llama3;
  scaled.rope.factor = 8;
  scaled.rope.original_max_position_embeddings = 64;
  const nn::EncodingOverride native = method_override(method("native"), scaled, 64, 256);
  EXPECT_FALSE(native.rope.has_value());
  EXPECT_FALSE(native.kind.has_value());
  const nn::EncodingOverride rope = method_override(method("rope"), scaled, 64, 256);
  ASSERT_TRUE(rope.rope.has_value());
  EXPECT_EQ(rope.rope->scaling, RopeScaling::None);
  EXPECT_EQ(rope.rope->base, scaled.rope.base);
  const nn::EncodingOverride yarn = method_override(method("yarn"), scaled, 64, 256);
  EXPECT_EQ(yarn.rope->scaling, RopeScaling::Yarn);
  EXPECT_EQ(yarn.rope->factor, 4.0);
  const nn::EncodingOverride rerope = method_override(method("rerope", true, 32), scaled, 64, 256);
  EXPECT_EQ(rerope.rope->scaling, RopeScaling::Llama3);
  EXPECT_EQ(*rerope.window, 32);
  EXPECT_EQ(*rerope.logn_train_len, 64);
}

TEST(extrapolate_windows, PlainIsTheRowsEndAndRepeatedTilesTheLastL) {
  std::vector<int32_t> row(33);
  for (int i = 0; i < 33; ++i) row[i] = 100 + i;
  const std::vector<int32_t> plain = make_window(row, 16, 8, WindowMode::Plain);
  ASSERT_EQ(plain.size(), 17u);
  EXPECT_EQ(plain.front(), 116);
  EXPECT_EQ(plain.back(), 132);
  const std::vector<int32_t> rep = make_window(row, 16, 8, WindowMode::Repeated);
  ASSERT_EQ(rep.size(), 17u);
  for (size_t t = 0; t < rep.size(); ++t) EXPECT_EQ(rep[t], 125 + static_cast<int>(t % 8)) << t;
  EXPECT_THROW(make_window(row, 40, 8, WindowMode::Plain), Error);
}

// Dynamic NTK is scored by decoding: target t is predicted with the frequencies for length t + 1, i.e. exactly
// as the full forward of the prefix [0, t] would. Recomputed here prefix by prefix on a one-layer model (with more
// layers the cached keys and values of deeper layers were computed at the earlier lengths, as in any cached
// generation, so the prefix forward is not the reference there).
TEST(extrapolate_scoring, DecodedDynamicNtkPredictsEachTokenWithItsOwnLength) {
  nn::Transformer m = small_model(29, 1);
  const int64_t T = 2 * kL;
  m->set_override(method_override(method("dynamic"), m->config().resolved_encoding(), kL, T));
  std::vector<std::vector<int32_t>> rows(2, std::vector<int32_t>(static_cast<size_t>(T) + 1));
  for (size_t r = 0; r < 2; ++r)
    for (size_t t = 0; t <= static_cast<size_t>(T); ++t) rows[r][t] = static_cast<int32_t>((t * 7 + r * 3 + t * t) % 29);
  const WindowScore decoded = score_windows(m, rows, T, kL, WindowMode::Plain, /*decode=*/true, 2);
  const WindowScore full = score_windows(m, rows, T, kL, WindowMode::Plain, /*decode=*/false, 2);
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (const auto& row : rows)
    for (int64_t t = T - kL; t < T; ++t) {
      const torch::Tensor prefix = torch::tensor(std::vector<int64_t>(row.begin(), row.begin() + t + 1)).view({1, -1});
      const torch::Tensor last = m->forward(prefix)[0][t].to(torch::kDouble);  // [V]
      sum += (torch::logsumexp(last, 0) - last[row[t + 1]]).item<double>();
    }
  EXPECT_NEAR(decoded.loss, sum / (2.0 * kL), 1e-9);
  EXPECT_EQ(decoded.tokens, 2 * kL);
  EXPECT_GT(std::abs(decoded.loss - full.loss), 1e-9);  // the full window uses the frequencies for T throughout
  EXPECT_TRUE(std::isnan(decoded.loss_by_position[0]));
  EXPECT_FALSE(std::isnan(full.loss_by_position[0]));
}

// B(d) for head dim 4, base 10000: pairs theta = (1, 0.01); |S_1| = 1, |S_2| = |e^{id} + e^{0.01 id}| =
// 2 |cos(0.495 d)|, so B(d) = (1 + 2 |cos(0.495 d)|) / 2.
TEST(extrapolate_decay, BoundMatchesTheHandComputation) {
  RopeSpec s;
  s.head_dim = 4;
  const std::vector<double> b = decay_bound(s.freqs(), 50);
  ASSERT_EQ(b.size(), 51u);
  for (int d = 0; d <= 50; ++d) EXPECT_NEAR(b[d], (1 + 2 * std::abs(std::cos(0.495 * d))) / 2, 1e-12) << d;
}

TEST(extrapolate_decay, ScalingChangesTheBound) {
  RopeSpec s;
  s.head_dim = 64;
  const std::vector<double> plain = decay_bound(s.freqs(), 200);
  EXPECT_NEAR(plain[0], (32 + 1) / 2.0, 1e-12);  // every S_j = j at distance 0: mean of 1..32
  RopeSpec linear = s;
  linear.scaling = RopeScaling::Linear;
  linear.factor = 2;
  const std::vector<double> pi = decay_bound(linear.freqs(), 200);
  for (int d = 0; d <= 100; ++d) EXPECT_NEAR(pi[2 * d], plain[d], 1e-9) << d;  // PI: distance 2d turns as d did
  RopeSpec yarn = s;
  yarn.scaling = RopeScaling::Yarn;
  yarn.factor = 4;
  yarn.original_max_position_embeddings = 64;
  const RopeFreqs yf = yarn.freqs();
  EXPECT_NEAR(decay_bound(yf, 0)[0], yf.attention_factor * yf.attention_factor * 16.5, 1e-12);
}

TEST(extrapolate_decay, MeasuredAttentionSumsToOneAndRejectsRerope) {
  nn::Transformer m = small_model(35);
  m->to(torch::kFloat);
  lab::TaskOptions one_pair;
  one_pair.kv_pairs = 1;  // 23 characters: a row of 24 holds one problem
  const std::unique_ptr<lab::Task> task = lab::make_task("kv_retrieval", one_pair);
  const int S = 24;
  const MeasuredDecay d = measure_decay(m, *task, 3, S, 40, 256, 1);
  ASSERT_EQ(d.context_prob.size(), static_cast<size_t>(S));
  ASSERT_EQ(d.abs_score.size(), 41u);
  EXPECT_EQ(d.layers, 2);
  double total = 0;  // each query's probabilities sum to 1: sum_d p(d) * (S - d) queries at distance d = S
  for (int k = 0; k < S; ++k) total += d.context_prob[k] * (S - k);
  EXPECT_NEAR(total, S, 1e-6);
  for (size_t k = 0; k < d.abs_score.size(); ++k) EXPECT_GE(d.abs_score[k] + 1e-12, std::abs(d.mean_score[k]));
  nn::EncodingOverride o;
  o.kind = nn::EncodingKind::Rerope;
  o.window = 4;
  m->set_override(o);
  EXPECT_THROW(measure_decay(m, *task, 3, S, 40, 256, 1), Error);
}

}  // namespace
}  // namespace rotary::experiments
