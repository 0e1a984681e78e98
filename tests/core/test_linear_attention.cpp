// rotary/linear_attention.h: the running-state forward/backward against the float64 materialised reference
// (causal and not, odd and zero lengths, packed batches, positions, partial rotation, both layouts, strided
// views, every storage dtype); the reference's gradients against float64 central differences; a worked
// two-token example computed here; bad input; guard zones.
//
// Tolerances (rms error relative to the reference's rms, in units of the storage type's unit roundoff u):
//  - f64 fast vs reference: the same sums in another order: 64 u (measured 2-5 u).
//  - f32 fast vs reference: fp32 running sums over <= N terms: u * sqrt(N) typical; the numerator can cancel
//    (rotated features have either sign) while the denominator cannot: 8 u sqrt(N) (measured 1-5 u, N <= 64).
//  - f16/bf16: inputs are the reference's inputs (already rounded); the output and gradients are rounded once
//    more (u) on top of fp32 arithmetic: 4 u.
//  - Central differences of the float64 reference with step h = 1e-5: truncation ~h^2 |f'''| / 6 plus rounding
//    ~u |f| / h, both ~1e-11 relative; allowed 1e-7 of the gradient's largest entry.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "harness.h"
#include "rotary/error.h"
#include "rotary/linear_attention.h"
#include "rotary/rope_spec.h"

namespace rotary {
namespace {

using test::dtype_eps;
using test::GuardedBuffer;
using test::nmse;

struct Case {
  DType dtype = DType::F32;
  bool causal = true;
  bool rotate = true;
  RopeLayout layout = RopeLayout::HalfSplit;
  int D = 16, rotary_dim = 16, Dv = 12;
  int64_t H = 2;
  std::vector<int64_t> lengths{37};
  bool positions = false;  // explicit positions with gaps (else index inside the sequence)
  int64_t pad = 0;         // extra elements after each head (strided views)
  double attention_factor = 1.0;
  uint64_t seed = 1;
};

std::string describe(const Case& c) {
  std::string s = std::string(dtype_name(c.dtype)) + (c.causal ? " causal" : " full") +
                  (c.rotate ? " rope" : " plain") + (c.layout == RopeLayout::Interleaved ? " interleaved" : " half") +
                  " D=" + std::to_string(c.D) + " r=" + std::to_string(c.rotary_dim) + " Dv=" + std::to_string(c.Dv) +
                  " lengths=";
  for (int64_t l : c.lengths) s += std::to_string(l) + ",";
  return s + (c.positions ? " positions" : "") + " pad=" + std::to_string(c.pad);
}

// Everything one call needs: buffers [tokens, H, row + pad] and the params pointing at them.
struct Problem {
  Case c;
  RopeFreqs freqs;
  int64_t tokens = 0;
  std::vector<int64_t> cu, pos;
  GuardedBuffer q, k, v, o, dout, dq, dk, dv;
  static int64_t n_tok(const Case& c) {
    int64_t t = 0;
    for (int64_t l : c.lengths) t += l;
    return t;
  }
  explicit Problem(const Case& cc)
      : c(cc),
        tokens(n_tok(cc)),
        q(cc.dtype, tokens * cc.H * (cc.D + cc.pad)),
        k(cc.dtype, tokens * cc.H * (cc.D + cc.pad)),
        v(cc.dtype, tokens * cc.H * (cc.Dv + cc.pad)),
        o(cc.dtype, tokens * cc.H * (cc.Dv + cc.pad)),
        dout(cc.dtype, tokens * cc.H * (cc.Dv + cc.pad)),
        dq(cc.dtype, tokens * cc.H * (cc.D + cc.pad)),
        dk(cc.dtype, tokens * cc.H * (cc.D + cc.pad)),
        dv(cc.dtype, tokens * cc.H * (cc.Dv + cc.pad)) {
    RopeSpec spec;
    spec.head_dim = c.D, spec.rotary_dim = c.rotary_dim, spec.layout = c.layout, spec.base = 100.0;
    freqs = spec.freqs();
    freqs.attention_factor = c.attention_factor;
    cu.push_back(0);
    for (int64_t l : c.lengths) cu.push_back(cu.back() + l);
    int64_t p = 3;
    for (int64_t t = 0; t < tokens; ++t) pos.push_back(p += 1 + int64_t((t * 7 + c.seed) % 3));
    // Inputs in [-2, 1.5): phi's two branches (x <= 0 and x > 0) both occur.
    test::fill_uniform(q, c.seed * 5 + 1, -2.0, 1.5);
    test::fill_uniform(k, c.seed * 5 + 2, -2.0, 1.5);
    test::fill_uniform(v, c.seed * 5 + 3);
    test::fill_uniform(dout, c.seed * 5 + 4);
  }
  HeadsView view(GuardedBuffer& b, int row) { return {b.data(), c.H, c.H * (row + c.pad), row + c.pad}; }
  LinearAttentionParams params() {
    LinearAttentionParams p;
    p.tokens = tokens, p.head_dim = c.D, p.value_dim = c.Dv, p.dtype = c.dtype;
    p.q = view(q, c.D), p.k = view(k, c.D), p.v = view(v, c.Dv), p.o = view(o, c.Dv);
    p.batch = int64_t(c.lengths.size());
    p.cu_seqlens = cu.data();
    p.positions = c.positions ? pos.data() : nullptr;
    p.causal = c.causal;
    p.freqs = c.rotate ? &freqs : nullptr;
    return p;
  }
  LinearAttentionGradParams grad_params() {
    LinearAttentionGradParams g;
    g.fwd = params();
    g.dout = view(dout, c.Dv), g.dq = view(dq, c.D), g.dk = view(dk, c.D), g.dv = view(dv, c.Dv);
    return g;
  }
  // Elements of a view of row length `row` (skipping the pads).
  std::vector<double> rows(const GuardedBuffer& b, int row) const {
    std::vector<double> x;
    for (int64_t i = 0; i < b.size(); ++i)
      if (i % (row + c.pad) < row) x.push_back(b.get(i));
    return x;
  }
};

double rms_err(const std::vector<double>& a, const std::vector<double>& ref) { return std::sqrt(nmse(a, ref)); }

double tolerance(const Case& c) {
  const double u = dtype_eps(c.dtype);
  int64_t n = 1;
  for (int64_t l : c.lengths) n = std::max(n, l);
  switch (c.dtype) {
    case DType::F64: return 64 * u;
    case DType::F32: return 8 * u * std::sqrt(double(n));
    default: return 4 * u;
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16})
    for (bool causal : {true, false}) {
      Case c;
      c.dtype = t, c.causal = causal, c.seed = out.size() + 1;
      out.push_back(c);
      c.layout = RopeLayout::Interleaved, c.D = 10, c.rotary_dim = 6, c.Dv = 7, c.H = 3;
      c.lengths = {1, 0, 17, 64, 5}, c.positions = true, c.pad = 3, c.attention_factor = 1.3, c.seed += 100;
      out.push_back(c);
      c.rotate = false, c.lengths = {9}, c.seed += 100;
      out.push_back(c);
    }
  return out;
}

TEST(LinearAttention, ForwardFastMatchesReference) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c));
    Problem fast(c), ref(c);
    linear_attention_forward(fast.params());
    linear_attention_forward_reference(ref.params());
    EXPECT_LE(rms_err(fast.rows(fast.o, c.Dv), ref.rows(ref.o, c.Dv)), tolerance(c));
    EXPECT_TRUE(fast.o.guards_intact());
    EXPECT_TRUE(ref.o.guards_intact());
  }
}

TEST(LinearAttention, BackwardFastMatchesReference) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c));
    Problem fast(c), ref(c);
    linear_attention_backward(fast.grad_params());
    linear_attention_backward_reference(ref.grad_params());
    EXPECT_LE(rms_err(fast.rows(fast.dq, c.D), ref.rows(ref.dq, c.D)), tolerance(c)) << "dq";
    EXPECT_LE(rms_err(fast.rows(fast.dk, c.D), ref.rows(ref.dk, c.D)), tolerance(c)) << "dk";
    EXPECT_LE(rms_err(fast.rows(fast.dv, c.Dv), ref.rows(ref.dv, c.Dv)), tolerance(c)) << "dv";
    for (GuardedBuffer* b : {&fast.dq, &fast.dk, &fast.dv, &ref.dq, &ref.dk, &ref.dv}) EXPECT_TRUE(b->guards_intact());
  }
}

// f32 against f64 on the same (f32-representable) inputs: the fp32 path loses only what fp32 arithmetic loses.
TEST(LinearAttention, F32MatchesF64) {
  Case c;
  c.lengths = {200}, c.positions = true;
  Case c64 = c;
  c64.dtype = DType::F64;
  Problem p32(c), p64(c64);
  for (int64_t i = 0; i < p32.q.size(); ++i) p64.q.set(i, p32.q.get(i)), p64.k.set(i, p32.k.get(i));
  for (int64_t i = 0; i < p32.v.size(); ++i) p64.v.set(i, p32.v.get(i)), p64.dout.set(i, p32.dout.get(i));
  linear_attention_forward(p32.params()), linear_attention_forward(p64.params());
  linear_attention_backward(p32.grad_params()), linear_attention_backward(p64.grad_params());
  EXPECT_LE(rms_err(p32.rows(p32.o, c.Dv), p64.rows(p64.o, c.Dv)), tolerance(c));
  EXPECT_LE(rms_err(p32.rows(p32.dq, c.D), p64.rows(p64.dq, c.D)), tolerance(c));
  EXPECT_LE(rms_err(p32.rows(p32.dk, c.D), p64.rows(p64.dk, c.D)), tolerance(c));
  EXPECT_LE(rms_err(p32.rows(p32.dv, c.Dv), p64.rows(p64.dv, c.Dv)), tolerance(c));
}

// loss = sum dout * o; its gradient by central differences of the float64 reference forward.
TEST(LinearAttention, GradientsMatchCentralDifferences) {
  for (bool causal : {true, false}) {
    Case c;
    c.dtype = DType::F64, c.causal = causal, c.D = 6, c.rotary_dim = 4, c.Dv = 5, c.H = 2, c.lengths = {4, 7};
    c.positions = true, c.attention_factor = 1.2, c.layout = RopeLayout::Interleaved;
    SCOPED_TRACE(describe(c));
    Problem pr(c), fast(c);
    linear_attention_backward_reference(pr.grad_params());
    linear_attention_backward(fast.grad_params());
    auto loss = [&]() {
      linear_attention_forward_reference(pr.params());
      double s = 0;
      for (int64_t i = 0; i < pr.o.size(); ++i) s += pr.o.get(i) * pr.dout.get(i);
      return s;
    };
    const double h = 1e-5;
    for (auto [in, grad, fgrad, name] :
         {std::tuple{&pr.q, &pr.dq, &fast.dq, "dq"}, std::tuple{&pr.k, &pr.dk, &fast.dk, "dk"},
          std::tuple{&pr.v, &pr.dv, &fast.dv, "dv"}}) {
      std::vector<double> fd(size_t(in->size()));
      for (int64_t i = 0; i < in->size(); ++i) {
        const double x = in->get(i);
        in->set(i, x + h);
        const double up = loss();
        in->set(i, x - h);
        const double down = loss();
        in->set(i, x);
        fd[size_t(i)] = (up - down) / (2 * h);
      }
      double scale = 0;
      for (double g : fd) scale = std::max(scale, std::fabs(g));
      EXPECT_LE(test::max_abs_diff(grad->to_double(), fd), 1e-7 * scale) << name << " reference";
      EXPECT_LE(test::max_abs_diff(fgrad->to_double(), fd), 1e-7 * scale) << name << " fast";
    }
  }
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

template <class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no rotary::Error; expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LinearAttention, BadInputNamesTheField) {
  Case c;
  c.lengths = {5, 6};
  Problem pr(c);
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
}

}  // namespace
}  // namespace rotary
