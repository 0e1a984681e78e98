// Fused attention (every rotary position mode) against the float64 materialised reference, ggml
// test-backend-ops style: a table of cases (mode x head dim x GQA x causal x packed sequences x dtype x memory
// layout), guard zones and view gaps, NaN/Inf parity, gradients (kernel backward against the reference
// backward, and the float64 kernel against central finite differences of the reference forward), identities
// between modes, and bad input.
//
// Tolerances (NMSE = sum (x - ref)^2 / sum ref^2 against the float64 reference):
//   f16 / bf16 storage: the output is rounded once to the storage type, a relative error uniform in
//     [-eps, eps] (eps = unit roundoff) whose mean square is eps^2/3; the fp32 arithmetic before it is ~1e4x
//     smaller. We allow eps^2 (3x that mean) for outputs, 4 eps^2 for gradients (they also see the rounding
//     of o through D_i = do . o, amplified where dP - D cancels).
//   f32 / f64 storage: the error of the arithmetic itself - a few ulps from the rotations, ~sqrt(D) from the
//     dot products, ~log2(n) from the online-softmax rescales and weighted sums: a per-element relative error
//     of order 10 eps. We allow (64 eps)^2 for outputs and (256 eps)^2 for gradients (the backward subtracts
//     nearly equal numbers in dP - D). Any real defect (one wrong angle, one missing key) shows as >1e-6.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attention_cases.h"
#include "harness.h"
#include "rotary/attention.h"
#include "rotary/error.h"
#include "simd_targets.h"

namespace rotary::test {
namespace {

// Angles are formed as pos * inv_freq in float64: an absolute error of ~|pos| eps64 rad that fp32 results
// never see (it is far below eps32) but F64 results do, so the F64 budget grows with the largest position.
double angle_term(int64_t max_pos) { return 4.0 * double(max_pos) * dtype_eps(DType::F64); }

double tol_forward(DType t, int64_t max_pos = 0) {
  const double e = dtype_eps(t);
  if (t == DType::F16 || t == DType::BF16) return e * e;
  const double rel = 64 * e + angle_term(max_pos);
  return rel * rel;
}
double tol_backward(DType t, int64_t max_pos = 0) {
  const double e = dtype_eps(t);
  if (t == DType::F16 || t == DType::BF16) return 4 * e * e;
  const double rel = 256 * e + 4 * angle_term(max_pos);
  return rel * rel;
}
// lse is stored as f32 (f64 for F64 storage) whatever the storage dtype.
double tol_lse(DType t, int64_t max_pos = 0) {
  return tol_forward(t == DType::F64 ? DType::F64 : DType::F32, max_pos);
}

int64_t max_position(const AttnCase& c) {
  int64_t longest = 0;
  for (int64_t l : c.seqlens) longest = std::max(longest, l);
  return std::max<int64_t>(0, c.position_offset) + longest + longest / 5;
}

struct Forward {
  std::vector<double> o, lse;
  bool clean = false;  // guards and view gaps untouched
};

Forward run_forward(AttnProblem& pr, bool fused) {
  auto out = pr.outputs();
  const AttentionParams p = pr.params(out);
  if (fused) attention_forward(p);
  else attention_forward_reference(p);
  Forward f;
  f.o = pr.gather(out.ov);
  f.lse = out.lse->to_double();
  f.clean = pr.gaps_untouched(*out.o, out.ov) && out.lse->guards_intact();
  return f;
}

struct Backward {
  std::vector<double> dq, dk, dv;
  bool clean = false;
};

// The backward of the fused kernel takes o and lse from the fused forward; the reference recomputes all.
Backward run_backward(AttnProblem& pr, bool fused) {
  auto out = pr.outputs();
  const AttentionGradParams g = pr.grad_params(out);
  if (fused) {
    attention_forward(g.fwd);
    attention_backward(g);
  } else {
    attention_backward_reference(g);
  }
  Backward b;
  b.dq = pr.gather(out.dqv), b.dk = pr.gather(out.dkv), b.dv = pr.gather(out.dvv);
  b.clean = pr.gaps_untouched(*out.dq, out.dqv) && pr.gaps_untouched(*out.dk, out.dkv) &&
            pr.gaps_untouched(*out.dv, out.dvv);
  return b;
}

// ---------------------------------------------------------------------------------------------- the case table

std::vector<AttnCase> forward_cases() {
  struct ModeSpec {
    PositionMode mode;
    bool roper;
    int64_t window;
    double k;
    int64_t logn;
  };
  // Windows 12 and 40 against 64-key tiles: sequences of 130 have near, far and straddling tiles.
  const std::vector<ModeSpec> modes = {
      {PositionMode::None, false, 0, 1, 0},         {PositionMode::Rope, false, 0, 1, 0},
      {PositionMode::Rerope, false, 12, 1, 0},      {PositionMode::LeakyRerope, false, 40, 4, 0},
      {PositionMode::Rope, true, 0, 1, 0},          {PositionMode::Rerope, true, 40, 1, 0},
      {PositionMode::LeakyRerope, true, 12, 2.5, 0}, {PositionMode::Rope, false, 0, 1, 16},
      {PositionMode::Rerope, false, 40, 1, 24},     {PositionMode::LeakyRerope, true, 12, 8, 16},
  };
  const std::vector<int> dims = {16, 40, 64, 80, 96, 128, 256, 72};
  const std::vector<std::pair<int, int>> heads = {{2, 2}, {4, 1}, {4, 2}};
  const std::vector<std::vector<int64_t>> lens = {{1, 7, 33, 130}, {130}, {65, 64}, {7, 0, 1, 90}};
  const std::vector<DType> dtypes = {DType::F32, DType::F16, DType::BF16, DType::F64};
  const std::vector<MemLayout> mems = {MemLayout::Contiguous, MemLayout::Padded, MemLayout::FusedQkv, MemLayout::HeadMajor};
  std::vector<AttnCase> cases;
  // A rotating walk through the axes (coprime lengths), so every mode meets every dim, dtype and layout; ten
  // more steps give every mode the head-major layout (heads outermost, as a transposed [1, H, S, D] tensor).
  for (int i = 0; i < 50; ++i) {
    const ModeSpec& m = modes[size_t(i % 10)];
    AttnCase c;
    c.name = "walk" + std::to_string(i);
    c.mode = m.mode, c.roper = m.roper, c.window = m.window, c.leaky_k = m.k, c.logn_train = m.logn;
    c.D = dims[size_t(i % 8)];
    c.Hq = heads[size_t(i % 3)].first, c.Hkv = heads[size_t(i % 3)].second;
    c.seqlens = lens[size_t(i % 4)];
    c.causal = (i % 7) != 3 && (i % 7) != 5;
    c.dtype = dtypes[size_t((i / 2) % 4)];
    c.mem = i < 40 ? mems[size_t(i % 3)] : MemLayout::HeadMajor;
    if (i % 5 == 1) c.position_offset = 1000;  // explicit positions with gaps, far from 0
    if (!c.causal && i % 2 == 1) c.position_offset = 0, c.shuffle_positions = true;  // any order when not causal
    if (c.roper && c.D > 128) c.D = 96;  // the reference rotates values per (query, key) pair: keep it quick
    if (i % 6 == 2) c.rotary_dim = c.D / 2 - (c.D / 2) % 2;  // partial rotation
    if (i % 4 == 3) c.layout = RopeLayout::Interleaved;
    if (i % 9 == 4) c.attention_factor = 1.15;
    if (i % 8 == 6) c.softmax_scale = 0.3;
    cases.push_back(c);
  }
  return cases;
}

std::vector<AttnCase> backward_cases() {
  std::vector<AttnCase> cases;
  auto add = [&](std::string name, PositionMode mode, bool roper, int64_t w, double k, int D, int Hq, int Hkv,
                 std::vector<int64_t> seqs, bool causal, DType dt, int64_t logn = 0) {
    AttnCase c;
    c.name = std::move(name);
    c.mode = mode, c.roper = roper, c.window = w, c.leaky_k = k, c.D = D, c.Hq = Hq, c.Hkv = Hkv;
    c.seqlens = std::move(seqs), c.causal = causal, c.dtype = dt, c.logn_train = logn;
    cases.push_back(c);
  };
  using PM = PositionMode;
  add("none", PM::None, false, 0, 1, 64, 2, 2, {1, 7, 70}, true, DType::F32);
  add("rope", PM::Rope, false, 0, 1, 64, 4, 2, {1, 7, 70}, true, DType::F32);
  add("rope_full_mqa", PM::Rope, false, 0, 1, 80, 4, 1, {33, 40}, false, DType::F32);
  add("rerope", PM::Rerope, false, 12, 1, 64, 2, 2, {130}, true, DType::F32);
  add("rerope_gqa_d40", PM::Rerope, false, 40, 1, 40, 4, 2, {7, 90}, true, DType::F32, 16);
  add("leaky", PM::LeakyRerope, false, 12, 4, 96, 2, 1, {100}, true, DType::F32);
  add("leaky_full", PM::LeakyRerope, false, 20, 2, 64, 2, 2, {70}, false, DType::F32);
  add("roper", PM::Rope, true, 0, 1, 64, 2, 2, {7, 70}, true, DType::F32);
  add("rerope_roper", PM::Rerope, true, 12, 1, 64, 2, 1, {100}, true, DType::F32);
  add("leaky_roper_logn", PM::LeakyRerope, true, 12, 3, 48, 2, 2, {1, 90}, true, DType::F32, 16);
  add("rope_d256", PM::Rope, false, 0, 1, 256, 2, 1, {70}, true, DType::F32);
  add("rope_bf16", PM::Rope, false, 0, 1, 64, 2, 2, {7, 70}, true, DType::BF16);
  add("rerope_f16", PM::Rerope, false, 12, 1, 64, 2, 1, {100}, true, DType::F16);
  add("leaky_roper_f64", PM::LeakyRerope, true, 12, 3, 40, 2, 2, {90}, true, DType::F64);
  // Gradients into head-major views (heads outermost, as a transposed [1, H, S, D] tensor).
  for (size_t i : {size_t(4), size_t(9)}) {
    AttnCase c = cases[i];
    c.name += "_head_major";
    c.mem = MemLayout::HeadMajor;
    cases.push_back(c);
  }
  return cases;
}

std::string param_name(const testing::TestParamInfo<AttnCase>& info) { return info.param.name; }

// ------------------------------------------------------------------------------------------ forward vs reference

class fused_attention_forward : public testing::TestWithParam<AttnCase> {};

TEST_P(fused_attention_forward, MatchesReference) {
  const AttnCase& c = GetParam();
  SCOPED_TRACE(describe(c));
  AttnProblem pr(c);
  const Forward ref = run_forward(pr, false), got = run_forward(pr, true);
  EXPECT_TRUE(got.clean) << "write outside o / lse";
  // The measured errors go to the test report (--gtest_output=json) to show the margin to each tolerance.
  RecordProperty("o_nmse_over_tol", to_text(nmse(got.o, ref.o) / tol_forward(c.dtype, max_position(c))));
  EXPECT_LE(nmse(got.o, ref.o), tol_forward(c.dtype, max_position(c)));
  EXPECT_LE(nmse(got.lse, ref.lse), tol_lse(c.dtype, max_position(c)));
}

INSTANTIATE_TEST_SUITE_P(Table, fused_attention_forward, testing::ValuesIn(forward_cases()), param_name);

// AttentionParams::threads (forward and backward): one thread gives bitwise the result of two (each query tile and
// each (sequence, head) is one thread's work), and counts outside 0..kMaxThreads are refused naming the field.
TEST(attention_threads, OneThreadEqualsTwoAndBadCountsAreRefused) {
  AttnCase c;
  c.mode = PositionMode::Rerope, c.window = 12, c.Hq = 4, c.Hkv = 2, c.seqlens = {130, 70};
  AttnProblem pr(c);
  auto run = [&](int threads) {
    auto out = pr.outputs();
    AttentionGradParams g = pr.grad_params(out);
    g.fwd.threads = threads;
    attention_forward(g.fwd);
    attention_backward(g);
    return std::vector<std::vector<double>>{pr.gather(out.ov), out.lse->to_double(), pr.gather(out.dqv),
                                            AttnProblem::gather(out.dkv, c.dtype, pr.tokens(), c.D),
                                            AttnProblem::gather(out.dvv, c.dtype, pr.tokens(), c.D)};
  };
  EXPECT_EQ(run(1), run(2));
  auto out = pr.outputs();
  AttentionParams p = pr.params(out);
  for (int bad : {-1, 100000}) {
    p.threads = bad;
    EXPECT_THROW(
        try { attention_forward(p); } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("threads = " + std::to_string(bad)), std::string::npos) << e.what();
          throw;
        },
        Error);
  }
}

// Every SIMD target compiled into the library and supported here (AVX-512, AVX2, scalar ...), on a few cases.
TEST(attention_targets, EveryTargetMatchesReference) {
  const std::vector<AttnCase> all = forward_cases();
  for (int64_t target : detail::simd_targets()) {
    detail::force_simd_target(target);
    for (size_t i : {5, 6, 13}) {
      const AttnCase& c = all[i];
      SCOPED_TRACE(std::string(detail::simd_target_name(target)) + " " + describe(c));
      AttnProblem pr(c);
      const Forward ref = run_forward(pr, false), got = run_forward(pr, true);
      EXPECT_TRUE(got.clean);
      EXPECT_LE(nmse(got.o, ref.o), tol_forward(c.dtype, max_position(c)));
    }
  }
  detail::force_simd_target(0);
}

// ----------------------------------------------------------------------------------------- backward vs reference

class fused_attention_backward : public testing::TestWithParam<AttnCase> {};

TEST_P(fused_attention_backward, MatchesReference) {
  const AttnCase& c = GetParam();
  SCOPED_TRACE(describe(c));
  AttnProblem pr(c);
  const Backward ref = run_backward(pr, false), got = run_backward(pr, true);
  EXPECT_TRUE(got.clean) << "write outside dq / dk / dv";
  const double tol = tol_backward(c.dtype, max_position(c));
  RecordProperty("grad_nmse_over_tol", to_text(std::max({nmse(got.dq, ref.dq), nmse(got.dk, ref.dk),
                                                          nmse(got.dv, ref.dv)}) / tol));
  EXPECT_LE(nmse(got.dq, ref.dq), tol) << "dq";
  EXPECT_LE(nmse(got.dk, ref.dk), tol) << "dk";
  EXPECT_LE(nmse(got.dv, ref.dv), tol) << "dv";
}

INSTANTIATE_TEST_SUITE_P(Table, fused_attention_backward, testing::ValuesIn(backward_cases()), param_name);

// ------------------------------------------------------------------- gradients against finite differences (f64)

// L = sum dout . o; dL/dx by central differences of the reference forward, for every element of q, k, v.
// Truncation error ~ h^2 |L'''| ~ 1e-10 and rounding ~ eps64 |L| / h ~ 1e-10 at h = 1e-5: we allow 1e-7
// relative to the largest gradient.
class attention_gradcheck : public testing::TestWithParam<AttnCase> {};

TEST_P(attention_gradcheck, KernelAndReferenceMatchFiniteDifferences) {
  const AttnCase& c = GetParam();
  ASSERT_EQ(c.dtype, DType::F64);
  SCOPED_TRACE(describe(c));
  AttnProblem pr(c);
  auto loss = [&]() {
    const Forward f = run_forward(pr, false);
    const std::vector<double> dout = pr.gather(pr.dout());
    double l = 0;
    for (size_t i = 0; i < dout.size(); ++i) l += dout[i] * f.o[i];
    return l;
  };
  const Backward kern = run_backward(pr, true), ref = run_backward(pr, false);
  const double h = 1e-5;
  struct Input {
    const HeadsView* view;
    const std::vector<double>* kernel;
    const std::vector<double>* reference;
    const char* name;
  };
  const Input inputs[] = {{&pr.q(), &kern.dq, &ref.dq, "dq"},
                          {&pr.k(), &kern.dk, &ref.dk, "dk"},
                          {&pr.v(), &kern.dv, &ref.dv, "dv"}};
  for (const Input& in : inputs) {
    std::vector<double> fd;
    for (int64_t t = 0; t < pr.tokens(); ++t)
      for (int64_t hh = 0; hh < in.view->heads; ++hh)
        for (int d = 0; d < c.D; ++d) {
          const double x = pr.get(*in.view, t, hh, d);
          pr.set(*in.view, t, hh, d, x + h);
          const double lp = loss();
          pr.set(*in.view, t, hh, d, x - h);
          const double lm = loss();
          pr.set(*in.view, t, hh, d, x);
          fd.push_back((lp - lm) / (2 * h));
        }
    double scale = 1;
    for (double g : fd) scale = std::max(scale, std::fabs(g));
    EXPECT_LE(max_abs_diff(*in.kernel, fd), 1e-7 * scale) << in.name << " (fused kernel)";
    EXPECT_LE(max_abs_diff(*in.reference, fd), 1e-7 * scale) << in.name << " (reference)";
  }
}

std::vector<AttnCase> gradcheck_cases() {
  std::vector<AttnCase> cases;
  auto add = [&](std::string name, PositionMode mode, bool roper, int64_t w, double k, bool causal, int64_t logn,
                 int rot, RopeLayout layout) {
    AttnCase c;
    c.name = std::move(name);
    c.mode = mode, c.roper = roper, c.window = w, c.leaky_k = k, c.causal = causal, c.logn_train = logn;
    c.D = 16, c.rotary_dim = rot, c.layout = layout, c.Hq = 2, c.Hkv = 1, c.seqlens = {3, 8};
    c.dtype = DType::F64, c.attention_factor = 1.1;
    cases.push_back(c);
  };
  using PM = PositionMode;
  add("none", PM::None, false, 0, 1, true, 0, 0, RopeLayout::HalfSplit);
  add("rope", PM::Rope, false, 0, 1, true, 0, 0, RopeLayout::HalfSplit);
  add("rope_full_partial", PM::Rope, false, 0, 1, false, 0, 8, RopeLayout::Interleaved);
  add("rerope", PM::Rerope, false, 3, 1, true, 0, 0, RopeLayout::HalfSplit);
  add("rerope_full_logn", PM::Rerope, false, 3, 1, false, 4, 0, RopeLayout::Interleaved);
  add("leaky", PM::LeakyRerope, false, 3, 2.5, true, 0, 12, RopeLayout::HalfSplit);
  add("roper", PM::Rope, true, 0, 1, true, 0, 0, RopeLayout::HalfSplit);
  add("rerope_roper", PM::Rerope, true, 3, 1, true, 4, 0, RopeLayout::HalfSplit);
  add("leaky_roper_full", PM::LeakyRerope, true, 2, 3, false, 0, 8, RopeLayout::Interleaved);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Small, attention_gradcheck, testing::ValuesIn(gradcheck_cases()), param_name);

// ------------------------------------------------------------------------------------------------- identities

AttnCase identity_case(PositionMode mode, int64_t w, double k, bool roper) {
  AttnCase c;
  c.mode = mode, c.window = w, c.leaky_k = k, c.roper = roper;
  c.D = 64, c.Hq = 4, c.Hkv = 2, c.seqlens = {130, 33};
  return c;
}

std::vector<double> fused_o(const AttnCase& c, int64_t position_offset = -1) {
  AttnCase cc = c;
  cc.position_offset = position_offset;
  AttnProblem pr(cc);
  return run_forward(pr, true).o;
}

TEST(attention_identities, ReropeWithWindowPastTheSequenceIsRope) {
  const std::vector<double> rope = fused_o(identity_case(PositionMode::Rope, 0, 1, false));
  EXPECT_LE(nmse(fused_o(identity_case(PositionMode::Rerope, 130, 1, false)), rope), tol_forward(DType::F32));
  EXPECT_LE(nmse(fused_o(identity_case(PositionMode::Rerope, 1000, 1, true)),
                 fused_o(identity_case(PositionMode::Rope, 0, 1, true))),
            tol_forward(DType::F32));
  // ... and a window inside the sequence is not (the test can fail).
  EXPECT_GT(nmse(fused_o(identity_case(PositionMode::Rerope, 12, 1, false)), rope), 1e-4);
}

TEST(attention_identities, LeakyWithKOneIsRope) {
  const std::vector<double> rope = fused_o(identity_case(PositionMode::Rope, 0, 1, false));
  EXPECT_LE(nmse(fused_o(identity_case(PositionMode::LeakyRerope, 12, 1.0, false)), rope), tol_forward(DType::F32));
  EXPECT_LE(nmse(fused_o(identity_case(PositionMode::LeakyRerope, 12, 1.0, true)),
                 fused_o(identity_case(PositionMode::Rope, 0, 1, true))),
            tol_forward(DType::F32));
  EXPECT_GT(nmse(fused_o(identity_case(PositionMode::LeakyRerope, 12, 4.0, false)), rope), 1e-4);
}

// RoPER's output depends on relative positions only: shifting every position by 1000 changes nothing
// (a value rotation by R(2j - n), a published mistake, would). Also under ReRoPE / Leaky.
TEST(attention_identities, RoperDependsOnlyOnRelativePositions) {
  for (const AttnCase& c : {identity_case(PositionMode::Rope, 0, 1, true),
                            identity_case(PositionMode::Rerope, 12, 1, true),
                            identity_case(PositionMode::LeakyRerope, 12, 3, true)}) {
    SCOPED_TRACE(describe(c));
    const std::vector<double> at0 = fused_o(c, 0), at1000 = fused_o(c, 1000);
    // Angles at ~1000 rad are exact to fp32 rounding (angles.h), so the shift costs no more than a few ulps.
    EXPECT_LE(nmse(at1000, at0), tol_forward(DType::F32));
    AttnCase no_roper = c;
    no_roper.roper = false;
    EXPECT_GT(nmse(fused_o(no_roper, 0), at0), 1e-4);  // RoPER does change the output
  }
}

TEST(attention_identities, LognBelowTrainingLengthIsOff) {
  for (PositionMode mode : {PositionMode::Rope, PositionMode::Rerope, PositionMode::LeakyRerope}) {
    AttnCase c = identity_case(mode, 12, 2, false);
    const std::vector<double> off = fused_o(c);
    c.logn_train = 130;  // positions 0..129: ln(pos + 1) / ln(130) <= 1
    EXPECT_LE(nmse(fused_o(c), off), tol_forward(DType::F32));
    c.logn_train = 16;
    EXPECT_GT(nmse(fused_o(c), off), 1e-6);
  }
}

TEST(attention_identities, SingleKeyReturnsItsValue) {
  // A sequence of one token attends to itself only: o = v (RoPER: R(-p) R(p) v = v), lse = its own score.
  AttnCase c = identity_case(PositionMode::LeakyRerope, 1, 2, true);
  c.seqlens = {1, 1, 1};
  c.position_offset = 500;
  AttnProblem pr(c);
  const Forward f = run_forward(pr, true);
  std::vector<double> v_per_q;
  for (int64_t t = 0; t < pr.tokens(); ++t)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int d = 0; d < c.D; ++d) v_per_q.push_back(pr.get(pr.v(), t, h / (c.Hq / c.Hkv), d));
  EXPECT_LE(nmse(f.o, v_per_q), tol_forward(DType::F32));
}

// --------------------------------------------------------------------------------------------- NaN / Inf parity

// Expected: a NaN in q_i makes row i (all features, and its lse) NaN; a NaN in k_j makes every row that
// sees key j NaN (same sequence, a query head of j's group, and i >= j when causal); a NaN in feature d of v_j
// makes feature d of those rows NaN (RoPER: also d's rotation partner) and leaves lse finite. Nothing else.
struct NanSite {
  char tensor;  // 'q', 'k', 'v'
  int64_t token, head;
  int d;
};

void expect_nan_parity(const AttnCase& c, const NanSite& site) {
  SCOPED_TRACE(describe(c) + " NaN in " + site.tensor + " token " + std::to_string(site.token));
  AttnProblem pr(c);
  const HeadsView& v = site.tensor == 'q' ? pr.q() : site.tensor == 'k' ? pr.k() : pr.v();
  pr.set(v, site.token, site.head, site.d, std::numeric_limits<double>::quiet_NaN());
  const Forward ref = run_forward(pr, false), got = run_forward(pr, true);
  // The expectation from the definition, independent of both implementations.
  const int64_t seq_end = [&] {
    int64_t e = 0;
    for (int64_t l : c.seqlens)
      if ((e += l) > site.token) return e;
    return e;
  }();
  const int64_t seq_begin = seq_end - [&] {
    int64_t e = 0;
    for (int64_t l : c.seqlens)
      if ((e += l) > site.token) return l;
    return int64_t(0);
  }();
  const int rot = c.rotary_dim ? c.rotary_dim : c.D;
  const int partner = site.d >= rot ? site.d
                      : c.layout == RopeLayout::Interleaved ? (site.d ^ 1)
                                                            : (site.d < rot / 2 ? site.d + rot / 2 : site.d - rot / 2);
  const int64_t group = c.Hq / c.Hkv;
  std::vector<double> o_nan, lse_nan;
  for (int64_t t = 0; t < pr.tokens(); ++t)
    for (int64_t h = 0; h < c.Hq; ++h) {
      bool row = false;
      if (site.tensor == 'q') row = t == site.token && h == site.head;
      else row = t >= seq_begin && t < seq_end && h / group == site.head && (!c.causal || t >= site.token);
      lse_nan.push_back(row && site.tensor != 'v');
      for (int d = 0; d < c.D; ++d) {
        const bool feature = site.tensor != 'v' || d == site.d || (c.roper && d == partner);
        o_nan.push_back(row && feature);
      }
    }
  auto nan_mask = [](const std::vector<double>& x) {
    std::vector<double> m;
    for (double e : x) m.push_back(std::isnan(e));
    return m;
  };
  EXPECT_EQ(nan_mask(ref.o), o_nan) << "reference o";
  EXPECT_EQ(nan_mask(got.o), o_nan) << "fused o";
  EXPECT_EQ(nan_mask(ref.lse), lse_nan) << "reference lse";
  EXPECT_EQ(nan_mask(got.lse), lse_nan) << "fused lse";
  // Everything else still matches.
  std::vector<double> a, b;
  for (size_t i = 0; i < o_nan.size(); ++i)
    if (!o_nan[i]) a.push_back(got.o[i]), b.push_back(ref.o[i]);
  EXPECT_LE(nmse(a, b), tol_forward(c.dtype));
}

TEST(attention_nonfinite, NanReachesExactlyTheRowsThatSeeIt) {
  for (const AttnCase& base : {identity_case(PositionMode::Rope, 0, 1, false),
                               identity_case(PositionMode::Rerope, 12, 1, true),
                               identity_case(PositionMode::LeakyRerope, 12, 3, false)})
    for (bool causal : {true, false}) {
      AttnCase c = base;
      c.causal = causal;
      // Token 5 sits in the first (diagonal) key tile: rows 0..4 must not see it. Token 100 is past a tile edge.
      for (NanSite s : {NanSite{'q', 40, 1, 3}, NanSite{'k', 5, 1, 0}, NanSite{'k', 100, 0, 63},
                        NanSite{'v', 5, 1, 2}, NanSite{'v', 140, 0, 40}})
        expect_nan_parity(c, s);
    }
  AttnCase roper = identity_case(PositionMode::Rope, 0, 1, true);
  expect_nan_parity(roper, {'v', 5, 0, 7});
}

TEST(attention_nonfinite, InfGivesNonFiniteWhereTheReferenceDoes) {
  // Without RoPER: under RoPER an Inf value meets R(-pos_i) R(pos_j) = I as inf - inf, so the fused kernel
  // also turns the rotation partner of an Inf feature non-finite in row j itself (docs/attention.md).
  for (const AttnCase& c : {identity_case(PositionMode::Rope, 0, 1, false),
                            identity_case(PositionMode::Rerope, 12, 1, false),
                            identity_case(PositionMode::LeakyRerope, 12, 3, false)}) {
    for (char tensor : {'q', 'k', 'v'}) {
      SCOPED_TRACE(describe(c) + " Inf in " + tensor);
      AttnProblem pr(c);
      const HeadsView& v = tensor == 'q' ? pr.q() : tensor == 'k' ? pr.k() : pr.v();
      pr.set(v, 70, 1, 5, std::numeric_limits<double>::infinity());
      const Forward ref = run_forward(pr, false), got = run_forward(pr, true);
      size_t nonfinite = 0;
      for (size_t i = 0; i < ref.o.size(); ++i) {
        ASSERT_EQ(std::isfinite(got.o[i]), std::isfinite(ref.o[i])) << "element " << i;
        nonfinite += !std::isfinite(ref.o[i]);
      }
      EXPECT_GT(nonfinite, 0u);
    }
  }
}

// ------------------------------------------------------------------------------------------------- memory

TEST(attention_scratch, GrowsLinearlyWithTokens) {
  auto bytes = [](int64_t n, bool backward) {
    AttnCase c = identity_case(PositionMode::Rerope, 64, 1, true);
    c.seqlens = {n};
    AttnProblem pr(c);
    auto out = pr.outputs();
    return backward ? attention_backward_scratch_bytes(pr.grad_params(out), 2)
                    : attention_forward_scratch_bytes(pr.params(out), 2);
  };
  for (bool backward : {false, true}) {
    const double small = double(bytes(256, backward)), large = double(bytes(1024, backward));
    EXPECT_GT(small, 0);
    EXPECT_LE(large / small, 4.2) << (backward ? "backward" : "forward") << ": 4x tokens must cost <= ~4x scratch";
  }
}

// ------------------------------------------------------------------------------------------------ bad input

void expect_rejected(const std::function<void()>& call, const std::string& field) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected a rotary::Error naming " << field;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(field + " = "), std::string::npos) << msg;
    EXPECT_NE(msg.find("allowed"), std::string::npos) << msg;
  }
}

TEST(attention_bad_input, RejectedWithFieldValueAndAllowed) {
  AttnCase base = identity_case(PositionMode::Rope, 0, 1, false);
  base.seqlens = {5, 6};
  base.position_offset = 0;
  struct Bad {
    std::string field;
    std::function<void(AttnProblem&, AttentionParams&)> spoil;
  };
  std::vector<int64_t> cu_bad = {0, 7, 5, 11}, cu_short = {0, 5, 10}, cu_start = {1, 5, 11};
  const std::vector<Bad> bad = {
      {"k.heads",
       [](AttnProblem&, AttentionParams& p) {
         p.k.heads = 3, p.v.heads = 3, p.k.token_stride = p.v.token_stride = 3 * 64;
       }},
      {"v.heads", [](AttnProblem&, AttentionParams& p) { p.v.heads = 1; }},
      {"o.heads", [](AttnProblem&, AttentionParams& p) { p.o.heads = 2; }},
      {"q.head_stride", [](AttnProblem&, AttentionParams& p) { p.q.head_stride = 10; }},
      {"k.token_stride", [](AttnProblem&, AttentionParams& p) { p.k.token_stride = 64; }},
      {"v.data", [](AttnProblem&, AttentionParams& p) { p.v.data = nullptr; }},
      {"head_dim", [](AttnProblem&, AttentionParams& p) { p.head_dim = 8; }},
      {"head_dim", [](AttnProblem&, AttentionParams& p) { p.head_dim = 320; }},
      {"pos.window", [](AttnProblem&, AttentionParams& p) { p.pos.mode = PositionMode::Rerope, p.pos.window = 0; }},
      {"pos.window",
       [](AttnProblem&, AttentionParams& p) { p.pos.mode = PositionMode::LeakyRerope, p.pos.window = -3; }},
      {"pos.leaky_k",
       [](AttnProblem&, AttentionParams& p) {
         p.pos.mode = PositionMode::LeakyRerope, p.pos.window = 4, p.pos.leaky_k = 0;
       }},
      {"pos.leaky_k",
       [](AttnProblem&, AttentionParams& p) {
         p.pos.mode = PositionMode::LeakyRerope, p.pos.window = 4, p.pos.leaky_k = std::nan("");
       }},
      {"positions[3]", [](AttnProblem& pr, AttentionParams&) { pr.mutable_positions()[3] = 1; }},
      {"positions[8]", [](AttnProblem& pr, AttentionParams&) { pr.mutable_positions()[8] = pr.positions()[7]; }},
      {"cu_seqlens[2]", [&](AttnProblem&, AttentionParams& p) { p.cu_seqlens = cu_bad.data(), p.batch = 3; }},
      {"cu_seqlens[batch]", [&](AttnProblem&, AttentionParams& p) { p.cu_seqlens = cu_short.data(); }},
      {"cu_seqlens[0]", [&](AttnProblem&, AttentionParams& p) { p.cu_seqlens = cu_start.data(); }},
      {"batch", [](AttnProblem&, AttentionParams& p) { p.cu_seqlens = nullptr; }},
      {"pos.roper", [](AttnProblem&, AttentionParams& p) { p.pos.mode = PositionMode::None, p.pos.roper = true; }},
      {"pos.freqs", [](AttnProblem&, AttentionParams& p) { p.pos.freqs = nullptr; }},
      {"pos.freqs->head_dim", [](AttnProblem&, AttentionParams& p) { p.head_dim = 32; }},
      {"pos.logn_train_len", [](AttnProblem&, AttentionParams& p) { p.pos.logn_train_len = 1; }},
      {"positions[0]",
       [](AttnProblem& pr, AttentionParams& p) { pr.mutable_positions()[0] = -2, p.pos.logn_train_len = 8; }},
      {"softmax_scale", [](AttnProblem&, AttentionParams& p) { p.softmax_scale = INFINITY; }},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.field);
    AttnProblem pr(base);
    auto out = pr.outputs();
    AttentionGradParams g = pr.grad_params(out);
    b.spoil(pr, g.fwd);
    expect_rejected([&] { attention_forward(g.fwd); }, b.field);
    expect_rejected([&] { attention_forward_reference(g.fwd); }, b.field);
    expect_rejected([&] { attention_backward(g); }, b.field);
    expect_rejected([&] { attention_backward_reference(g); }, b.field);
  }
  // Backward only.
  AttnProblem pr(base);
  auto out = pr.outputs();
  AttentionGradParams g = pr.grad_params(out);
  g.fwd.lse = nullptr;
  expect_rejected([&] { attention_backward(g); }, "fwd.lse");
  g = pr.grad_params(out);
  g.dq.heads = 1;
  expect_rejected([&] { attention_backward(g); }, "dq.heads");
  // Positions may drop between sequences and need not increase when not causal.
  g = pr.grad_params(out);
  pr.mutable_positions()[5] = 0;  // first token of the second sequence
  EXPECT_NO_THROW(attention_forward(g.fwd));
  g.fwd.causal = false;
  pr.mutable_positions()[3] = 0;
  EXPECT_NO_THROW(attention_forward(g.fwd));
}

}  // namespace
}  // namespace rotary::test
