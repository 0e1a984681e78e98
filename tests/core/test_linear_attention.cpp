// rotary/linear_attention.h beyond the kernel-vs-reference comparisons (those, and the central differences, are
// the linear_attention op cases: cases_linear_attention.cpp, run by core_test_ops): fp32 against fp64 on the same
// inputs, a worked two-token example computed here, and bad input. Tolerances: the harness's LinearAttention
// bound (tolerance() in op_harness.cpp; docs/linear-attention.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cases_linear_attention.h"
#include "expect.h"
#include "rotary/error.h"
#include "rotary/linear_attention.h"
#include "rotary/rope_spec.h"

namespace rotary {
namespace {

using test::expect_error;
using test::LinearCaseSpec;
using test::LinearProblem;

// The rms error relative to the reference's rms allowed for a case (the harness's LinearAttention bound).
double tolerance(const LinearCaseSpec& c) {
  int64_t n = 1;
  for (int64_t l : c.lengths) n = std::max(n, l);
  return std::sqrt(test::tolerance(test::Quantity::LinearAttention, {.dtype = c.dtype, .longest_sequence = n}).bound);
}

// f32 against f64 on the same (f32-representable) inputs: the fp32 path loses only what fp32 arithmetic loses.
TEST(LinearAttention, F32MatchesF64) {
  LinearCaseSpec c;
  c.lengths = {200}, c.positions = true;
  LinearCaseSpec c64 = c;
  c64.dtype = DType::F64;
  LinearProblem p32(c), p64(c64);
  for (auto in : {&LinearProblem::q, &LinearProblem::k, &LinearProblem::v, &LinearProblem::dout})
    for (int64_t i = 0; i < (p32.*in)->size(); ++i) (p64.*in)->set(i, (p32.*in)->get(i));
  linear_attention_forward(p32.params()), linear_attention_forward(p64.params());
  linear_attention_backward(p32.grad_params()), linear_attention_backward(p64.grad_params());
  EXPECT_LE(test::rms_error(p32.gather(*p32.o, c.Dv), p64.gather(*p64.o, c.Dv)), tolerance(c));
  EXPECT_LE(test::rms_error(p32.gather(*p32.dq, c.D), p64.gather(*p64.dq, c.D)), tolerance(c));
  EXPECT_LE(test::rms_error(p32.gather(*p32.dk, c.D), p64.gather(*p64.dk, c.D)), tolerance(c));
  EXPECT_LE(test::rms_error(p32.gather(*p32.dv, c.Dv), p64.gather(*p64.dv, c.Dv)), tolerance(c));
}

// Two tokens, D = 2 (one pair, inv_freq 1), written out by hand: token 1 (causal) sees keys 0 and 1,
// numerator (R(p1) phi(q1)) . (R(pn) phi(kn)) = phi(q1) . R(pn - p1) phi(kn), denominator unrotated.
TEST(LinearAttention, WorkedTwoTokenExample) {
  RopeFreqs f;
  f.head_dim = 2, f.rotary_dim = 2, f.layout = RopeLayout::Interleaved, f.inv_freq = {1.0};
  const double q[2][2] = {{0.3, -0.4}, {0.5, 1.2}}, k[2][2] = {{-0.7, 0.2}, {0.9, -1.5}}, v[2] = {2.0, -3.0};
  const int64_t pos[2] = {5, 9};
  std::vector<double> qb(&q[0][0], &q[0][0] + 4), kb(&k[0][0], &k[0][0] + 4), vb(v, v + 2), ob(2);
  LinearAttentionParams p;
  p.tokens = 2, p.head_dim = 2, p.value_dim = 1, p.dtype = DType::F64, p.positions = pos, p.freqs = &f;
  p.q = {qb.data(), 1, 2, 2}, p.k = {kb.data(), 1, 2, 2}, p.v = {vb.data(), 1, 1, 1}, p.o = {ob.data(), 1, 1, 1};
  auto ph = [](double x) { return x > 0 ? x + 1 : std::exp(x); };
  const double q1[2] = {ph(q[1][0]), ph(q[1][1])};
  double num = 0, den = 0;
  for (int n = 0; n < 2; ++n) {
    const double k0 = ph(k[n][0]), k1 = ph(k[n][1]), a = double(pos[n] - pos[1]);
    num += (q1[0] * (k0 * std::cos(a) - k1 * std::sin(a)) + q1[1] * (k0 * std::sin(a) + k1 * std::cos(a))) * v[n];
    den += q1[0] * k0 + q1[1] * k1;
  }
  for (auto fn : {linear_attention_forward, linear_attention_forward_reference}) {
    ob = {0, 0};
    fn(p);
    EXPECT_NEAR(ob[1], num / den, 1e-14);
    EXPECT_NEAR(ob[0], v[0], 1e-14);  // one key, both turned by R(5): numerator = denominator * v_0
  }
}

TEST(LinearAttention, BadInputNamesTheField) {
  LinearCaseSpec c;
  c.lengths = {5, 6};
  LinearProblem pr(c);
  LinearAttentionParams p = pr.params();
  p.head_dim = 0;
  expect_error([&] { linear_attention_forward(p); }, "head_dim");
  p = pr.params();
  p.dtype = DType(9);
  expect_error([&] { linear_attention_forward(p); }, "dtype");
  p = pr.params();
  pr.cu[2] = 10;
  expect_error([&] { linear_attention_forward(p); }, "cu_seqlens[batch]");
  pr.cu[2] = 11;
  p = pr.params();
  p.k.heads = 1;
  expect_error([&] { linear_attention_forward(p); }, "k.heads");
  p = pr.params();
  p.v.token_stride = 4;
  expect_error([&] { linear_attention_forward(p); }, "v.token_stride");
  p = pr.params();
  p.o.data = nullptr;
  expect_error([&] { linear_attention_forward(p); }, "o.data");
  RopeFreqs other = pr.freqs;
  other.head_dim = 8, other.rotary_dim = 8, other.inv_freq.resize(4);
  p = pr.params();
  p.freqs = &other;
  expect_error([&] { linear_attention_forward(p); }, "freqs->head_dim");
  p = pr.params();
  p.cu_seqlens = nullptr;
  expect_error([&] { linear_attention_forward(p); }, "batch");
  LinearAttentionGradParams g = pr.grad_params();
  g.dk.data = nullptr;
  expect_error([&] { linear_attention_backward(g); }, "dk.data");
  g = pr.grad_params();
  g.dout.heads = 5;
  expect_error([&] { linear_attention_backward_reference(g); }, "dout.heads");
  p = pr.params();
  p.feature_map = FeatureMap(7);
  expect_error([&] { linear_attention_forward(p); }, "feature_map");
  expect_error([] { parse_feature_map("elu"); }, "feature_map");
  EXPECT_EQ(parse_feature_map("identity"), FeatureMap::Identity);
  EXPECT_EQ(parse_feature_map(feature_map_name(FeatureMap::EluPlusOne)), FeatureMap::EluPlusOne);
}

// The identity map takes the caller's features, which must be positive: a zero or negative value in q or k is
// refused naming the tensor, the token, head and feature (the normaliser could reach 0); NaN passes as NaN.
TEST(LinearAttention, IdentityFeaturesMustBePositive) {
  LinearCaseSpec c;
  c.feature_map = FeatureMap::Identity, c.lengths = {4, 3}, c.H = 2;
  LinearProblem pr(c);
  const HeadsView kv = pr.view(*pr.k, c.D);
  pr.k->set(5 * kv.token_stride + 1 * kv.head_stride + 3, -0.5);
  expect_error([&] { linear_attention_forward(pr.params()); }, {"k = ", "token 5, head 1, feature 3"});
  expect_error([&] { linear_attention_backward_reference(pr.grad_params()); }, "token 5, head 1, feature 3");
  pr.k->set(5 * kv.token_stride + 1 * kv.head_stride + 3, 0.0);
  expect_error([&] { linear_attention_forward(pr.params()); }, "> 0 with feature_map = identity");
  pr.k->set(5 * kv.token_stride + 1 * kv.head_stride + 3, std::nan(""));
  linear_attention_forward(pr.params());
  const std::vector<double> o = pr.gather(*pr.o, c.Dv);
  EXPECT_TRUE(std::isnan(o[size_t((5 * c.H + 1) * c.Dv)]));  // token 5, head 1 sees key 5
  EXPECT_FALSE(std::isnan(o[size_t((4 * c.H + 1) * c.Dv)]));  // token 4 starts the second sequence, before it
}

}  // namespace
}  // namespace rotary
