// The Performer (attention = performer, FAVOR+): the random projection's orthogonality, the feature map against the
// formula in float64, the approximation of softmax attention improving with more features, gradients of the fused
// path against central differences, memory linear in the sequence length, redraws, and the settings it refuses.
// fused == plain, causality and decode == forward run for the performer cases of model_cases.h with every kind.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <vector>

#include "expect_error.h"
#include "model_cases.h"
#include "rotary/error.h"
#include "rotary_nn/attention.h"

namespace rotary::nn {
namespace {

using rotary::test::expect_error;
using torch::indexing::Slice;

at::Generator generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

double max_abs(const torch::Tensor& t) { return t.abs().max().item<double>(); }

// Rows of one block of head_dim rows are orthogonal; the lengths are those of N(0, I_d) rows (chi(d): mean
// sqrt(2) Gamma((d+1)/2) / Gamma(d/2) = 3.94 for d = 16).
TEST(performer, ProjectionBlocksAreOrthogonalWithGaussianRowLengths) {
  const int64_t d = 16, m = 40;  // blocks of 16, 16 and 8 rows
  const torch::Tensor w = draw_performer_projection(m, d, generator(3)).to(torch::kDouble);
  ASSERT_EQ(w.sizes(), (std::vector<int64_t>{m, d}));
  for (int64_t start : {0, 16, 32}) {
    const torch::Tensor b = w.index({Slice(start, std::min(start + d, m))});
    const torch::Tensor gram = torch::matmul(b, b.t());
    const torch::Tensor off = gram - torch::diag(torch::diagonal(gram));
    EXPECT_LE(max_abs(off), 1e-5 * max_abs(gram)) << "block at row " << start;  // float32 storage
  }
  // Across blocks the rows are independent, not orthogonal: some pair must be far from it.
  EXPECT_GT(max_abs(torch::matmul(w.index({Slice(0, 16)}), w.index({Slice(16, 32)}).t())), 1.0);
  const torch::Tensor many = draw_performer_projection(4096, d, generator(4)).to(torch::kDouble).norm(2, -1);
  const double expect = std::sqrt(2.0) * std::exp(std::lgamma((d + 1) / 2.0) - std::lgamma(d / 2.0));
  // Mean of 4096 chi(16) lengths: standard deviation of one ~0.70, of the mean ~0.011; 0.05 is 4.5 of those.
  EXPECT_NEAR(many.mean().item<double>(), expect, 0.05);
  // Another seed gives another draw; the same seed the same.
  EXPECT_TRUE(torch::equal(draw_performer_projection(m, d, generator(3)), draw_performer_projection(m, d, generator(3))));
  EXPECT_FALSE(torch::equal(draw_performer_projection(m, d, generator(3)), draw_performer_projection(m, d, generator(5))));
}

// performer_features against its formula written out in float64 scalars: phi_i = m^-1/2 (exp(w_i.x' - |x'|^2/2 - c)
// + eps), x' = x d^-1/4, c = max_i w_i.x' for a query, max(0, max_i |w_i|^2/2 - 60) for a key.
TEST(performer, FeaturesFollowTheFormula) {
  const int64_t d = 16, m = 24;
  // A projection with one long row, so the key's cap applies: |w_0|^2/2 = 72 > 60.
  torch::Tensor w = draw_performer_projection(m, d, generator(7)).to(torch::kDouble);
  w.index_put_({0}, w.index({0}) / w.index({0}).norm() * 12.0);
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({3, d}, torch::kDouble);
  for (bool query : {true, false}) {
    const torch::Tensor f = performer_features(x, w, query);
    ASSERT_EQ(f.sizes(), (std::vector<int64_t>{3, m}));
    double key_shift = 0;
    for (int64_t i = 0; i < m; ++i) key_shift = std::max(key_shift, w[i].pow(2).sum().item<double>() / 2 - 60);
    ASSERT_GT(key_shift, 0);
    for (int64_t r = 0; r < 3; ++r) {
      std::vector<double> u(static_cast<size_t>(m));
      double sq = 0;
      for (int64_t j = 0; j < d; ++j) sq += std::pow(x[r][j].item<double>() * std::pow(d, -0.25), 2);
      double umax = -1e300;
      for (int64_t i = 0; i < m; ++i) {
        double dot = 0;
        for (int64_t j = 0; j < d; ++j) dot += w[i][j].item<double>() * x[r][j].item<double>() * std::pow(d, -0.25);
        u[size_t(i)] = dot;
        umax = std::max(umax, dot);
      }
      const double c = query ? umax : key_shift;
      for (int64_t i = 0; i < m; ++i) {
        const double want = (std::exp(u[size_t(i)] - sq / 2 - c) + kPerformerEps) / std::sqrt(double(m));
        EXPECT_NEAR(f[r][i].item<double>(), want, 1e-13 * want) << (query ? "query" : "key") << " row " << r;
      }
    }
  }
}

// FAVOR+ estimates softmax attention; its error falls like m^-1/2 until the eps floor's bias (~1e-2 here). Plain
// forms, no position encoding, float64, q and k of moderate size (|x'|^2 ~ 1, where the estimator's variance is
// small). Measured on this draw (relative L2 error of the output): 0.30 at m = 16, 0.17 at 64, 0.070 at 256, 0.048
// at 1024, 0.031 at 4096. The bounds - below 0.05 at 4096, and 4096 at least 4x better than 16 (the m^-1/2 law
// alone would give 16x) - leave room for rounding and another platform's libm, not for a kernel that estimates
// something else (then the error stops falling with m).
TEST(performer, ApproximatesSoftmaxAttentionBetterWithMoreFeatures) {
  ModelConfig c = testing::small_config("none");
  const int64_t B = 1, S = 12, H = 2, D = 16;
  const PositionContext pc = make_position_context(c.resolved_encoding(), int(H), int(D), S);
  torch::manual_seed(11);
  const torch::Tensor q = torch::randn({B, S, H, D}, torch::kDouble) * 0.5;
  const torch::Tensor k = torch::randn({B, S, H, D}, torch::kDouble) * 0.5;
  const torch::Tensor v = torch::randn({B, S, H, D}, torch::kDouble);
  const torch::Tensor pos = torch::arange(S, torch::kLong).view({1, S});
  const torch::Tensor exact = softmax_attention_plain(q, k, v, pos, pos, pc);
  auto error_with = [&](int64_t m) {
    const torch::Tensor w = draw_performer_projection(m, D, generator(21)).to(torch::kDouble);
    const torch::Tensor approx = linear_attention_plain(q, k, v, pos, pos, pc, AttentionKind::Performer, w);
    return (approx - exact).norm().item<double>() / exact.norm().item<double>();
  };
  const double coarse = error_with(16), fine = error_with(4096);
  EXPECT_LT(fine, 0.05);
  EXPECT_LT(fine * 4, coarse);
}

// Gradients of the fused performer (rope op, features, the core's identity-feature linear attention backward) in
// float64 against central differences of the same function: relative 1e-6 of the largest gradient (differences
// with h = 1e-6 are accurate to ~1e-9 here).
TEST(performer, FusedGradientsMatchFiniteDifferences) {
  ModelConfig c = testing::small_config("rope");
  c.attention = AttentionKind::Performer;
  const int64_t B = 1, S = 6, Hq = 2, Hkv = 1, D = 16, m = 12;
  const PositionContext pc = make_position_context(c.resolved_encoding(), int(Hq), int(D), S);
  const torch::Tensor w = draw_performer_projection(m, D, generator(5)).to(torch::kDouble);
  torch::manual_seed(2);
  torch::Tensor q = (torch::randn({B, S, Hq, D}, torch::kDouble) * 0.7).requires_grad_();
  torch::Tensor k = (torch::randn({B, S, Hkv, D}, torch::kDouble) * 0.7).requires_grad_();
  torch::Tensor v = torch::randn({B, S, Hkv, D}, torch::kDouble).requires_grad_();
  const torch::Tensor pos = torch::tensor({3, 4, 6, 7, 11, 12}, torch::kLong).view({1, S});
  const torch::Tensor weight = torch::randn({B, S, Hq, D}, torch::kDouble);
  auto loss = [&](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& cv) {
    return (model_attention(a, b, cv, pos, pc, AttentionKind::Performer, /*fused=*/true, w) * weight).sum();
  };
  loss(q, k, v).backward();
  torch::NoGradGuard no_grad;
  for (auto [x, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    const torch::Tensor grad = x->grad().clone();
    torch::Tensor numeric = torch::zeros_like(grad);
    torch::Tensor flat = x->detach().view({-1}), nflat = numeric.view({-1});
    const double h = 1e-6;
    for (int64_t e = 0; e < flat.numel(); ++e) {
      const double keep = flat[e].item<double>();
      flat[e] = keep + h;
      const double up = loss(q.detach(), k.detach(), v.detach()).item<double>();
      flat[e] = keep - h;
      const double down = loss(q.detach(), k.detach(), v.detach()).item<double>();
      flat[e] = keep;
      nflat[e] = (up - down) / (2 * h);
    }
    EXPECT_LE(max_abs(grad - numeric), 1e-6 * max_abs(numeric)) << name;
  }
}

// Memory linear in N: forward and backward of the fused performer at N = 2^17 tokens. Anything N x N would need
// 2^34 floats (64 GiB) and throw; the features are N x m (m = 44: 23 MB).
TEST(performer, FusedRunsAtSequenceLengthsNoQuadraticBufferFits) {
  ModelConfig c = testing::small_config("rope");
  c.attention = AttentionKind::Performer;
  const int64_t N = int64_t(1) << 17, D = 16;
  const PositionContext pc = make_position_context(c.resolved_encoding(), 1, int(D), N);
  const torch::Tensor w = draw_performer_projection(44, D, generator(9));
  torch::manual_seed(3);
  torch::Tensor q = torch::randn({1, N, 1, D}).requires_grad_(), k = torch::randn({1, N, 1, D}).requires_grad_();
  torch::Tensor v = torch::randn({1, N, 1, D}).requires_grad_();
  const torch::Tensor pos = torch::arange(N, torch::kLong).view({1, N});
  const torch::Tensor out = model_attention(q, k, v, pos, pc, AttentionKind::Performer, /*fused=*/true, w);
  out.sum().backward();
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
  for (const torch::Tensor* x : {&q, &k, &v}) EXPECT_TRUE(torch::isfinite(x->grad()).all().item<bool>());
  EXPECT_GT(max_abs(k.grad()), 0.0);
}

// Redraws: every layer gets new features, the same for the same seed (ranks and resumed runs agree), other for
// another; the projection is a buffer, so it is saved with the model, and no parameter.
TEST(performer, RedrawIsDeterministicPerSeedAndPerLayer) {
  ModelConfig c = testing::small_config("rope");
  c.attention = AttentionKind::Performer;
  torch::manual_seed(1);
  Transformer a(c);
  torch::manual_seed(2);
  Transformer b(c);
  auto proj = [](Transformer& t, const char* layer) { return t->named_buffers()[std::string(layer) + ".performer_proj"]; };
  EXPECT_FALSE(torch::equal(proj(a, "block0"), proj(b, "block0")));
  EXPECT_EQ(proj(a, "block0").sizes(), (std::vector<int64_t>{44, 16}));
  EXPECT_FALSE(a->named_parameters().contains("block0.performer_proj"));
  const torch::Tensor before = proj(a, "block0").clone();
  a->redraw_performer_features(77);
  b->redraw_performer_features(77);
  EXPECT_FALSE(torch::equal(before, proj(a, "block0")));
  EXPECT_TRUE(torch::equal(proj(a, "block0"), proj(b, "block0")));
  EXPECT_TRUE(torch::equal(proj(a, "block1"), proj(b, "block1")));
  EXPECT_FALSE(torch::equal(proj(a, "block0"), proj(a, "block1")));
  b->redraw_performer_features(78);
  EXPECT_FALSE(torch::equal(proj(a, "block0"), proj(b, "block0")));
}

TEST(performer, SettingsItCannotUseAreRefusedNamingTheField) {
  ModelConfig c = testing::small_config("alibi");
  c.attention = AttentionKind::Performer;
  expect_error([&] { c.validate(); }, {"encoding.kind", "attention = performer"});
  c = testing::small_config("rope");
  c.attention = AttentionKind::Performer;
  c.encoding.logn_train_len = 8;
  expect_error([&] { c.validate(); }, "encoding.logn_train_len");
  c = testing::small_config("rope");
  c.performer_features = 8;  // softmax attention has no features
  expect_error([&] { c.validate(); }, "performer_features");
  c.performer_features = 0;
  c.performer_redraw = 5;
  expect_error([&] { c.validate(); }, "performer_redraw");
  c = testing::small_config("rope");
  c.attention = AttentionKind::Performer;
  c.performer_features = 1025;
  expect_error([&] { c.validate(); }, "performer_features");
  c.performer_features = 0, c.d_model = 1024, c.n_heads = 4, c.n_kv_heads = 0;  // head_dim 256: 256 ln 256 = 1420
  expect_error([&] { c.validate(); }, {"performer_features = 1420", "set performer_features"});
  c.performer_features = 512;
  c.validate();
  // Stored configs: the performer's settings only for the performer.
  const nlohmann::json j = c;
  EXPECT_EQ(j.at("performer_features"), 512);
  EXPECT_FALSE(nlohmann::json(testing::small_config("rope")).contains("performer_features"));
  ModelConfig back = j.get<ModelConfig>();
  EXPECT_EQ(back.performer_features, 512);
  EXPECT_EQ(back.attention, AttentionKind::Performer);
}

}  // namespace
}  // namespace rotary::nn
