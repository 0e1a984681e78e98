// Fused attention beyond the kernel-vs-reference comparisons (those are op cases: cases_attention.cpp, run by
// core_test_ops): the thread count, identities between position modes, scratch growth and bad input. Tolerances
// come from the harness (tolerance(), op_harness.cpp; docs/attention.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "attention_cases.h"
#include "op_harness.h"
#include "rotary/attention.h"
#include "expect.h"
#include "rotary/error.h"

namespace rotary::test {
namespace {

double tol_forward_f32() { return tolerance(Quantity::AttentionOutput, {.dtype = DType::F32}).bound; }

// o of the fused forward.
std::vector<double> fused_forward_o(AttnProblem& pr) {
  auto out = pr.outputs();
  attention_forward(pr.params(out));
  return pr.gather(out.ov);
}

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
                                            pr.gather(out.dkv), pr.gather(out.dvv)};
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

// first_query: the queries of the last tokens alone give bitwise the rows of the whole call (each row's online softmax
// runs over the same key blocks in the same order, whichever rows share its query tile), in every mode and through
// the reference too; o and lse are written in their first tokens - first_query rows only; no queries writes nothing.
TEST(attention_first_query, LastRowsOfTheWholeCallBitwise) {
  struct Mode {
    PositionMode mode;
    int64_t w;
    double k;
    bool roper;
  };
  for (const Mode& m : {Mode{PositionMode::Rope, 0, 1, false}, Mode{PositionMode::Rerope, 40, 1, true},
                        Mode{PositionMode::LeakyRerope, 12, 3, false}})
    for (DType dt : {DType::F32, DType::BF16})
      for (int64_t first : {int64_t(1), int64_t(63), int64_t(64), int64_t(100), int64_t(199), int64_t(200)}) {
        AttnCase c = identity_case(m.mode, m.w, m.k, m.roper);
        c.seqlens = {200}, c.dtype = dt, c.logn_train = 64;
        SCOPED_TRACE(describe(c) + " first_query " + std::to_string(first));
        AttnProblem pr(c);
        auto whole = pr.outputs();
        attention_forward(pr.params(whole));
        const std::vector<double> o_all = pr.gather(whole.ov), lse_all = whole.lse->to_double();
        auto tail = pr.outputs();
        AttentionParams p = pr.params(tail);
        p.cu_seqlens = nullptr, p.first_query = first;
        p.q.data = static_cast<char*>(p.q.data) + first * p.q.token_stride * int64_t(dtype_size(dt));
        attention_forward(p);
        const std::vector<double> o = pr.gather(tail.ov), lse = tail.lse->to_double();
        const int64_t n = 200 - first, row = c.Hq * c.D;
        EXPECT_TRUE(std::equal(o.begin(), o.begin() + n * row, o_all.begin() + first * row));
        EXPECT_TRUE(std::all_of(o.begin() + n * row, o.end(), [](double x) { return x == AttnProblem::kMarker; }));
        EXPECT_TRUE(std::equal(lse.begin(), lse.begin() + n * c.Hq, lse_all.begin() + first * c.Hq));
        EXPECT_TRUE(pr.gaps_untouched(*tail.o, tail.ov));
        EXPECT_EQ(attention_forward_scratch_bytes(p) == 0, first == 200);
        if (first == 200 || dt != DType::F32) continue;
        auto ref_all = pr.outputs(), ref_tail = pr.outputs();
        attention_forward_reference(pr.params(ref_all));
        AttentionParams pt = p;
        pt.o = ref_tail.ov, pt.lse = ref_tail.lse->data();
        attention_forward_reference(pt);
        const std::vector<double> r_all = pr.gather(ref_all.ov), r = pr.gather(ref_tail.ov);
        EXPECT_TRUE(std::equal(r.begin(), r.begin() + n * row, r_all.begin() + first * row));
      }
}

// ------------------------------------------------------------------------------------------------- identities

std::vector<double> fused_o(const AttnCase& c, int64_t position_offset = -1) {
  AttnCase cc = c;
  cc.position_offset = position_offset;
  AttnProblem pr(cc);
  return fused_forward_o(pr);
}

TEST(attention_identities, ReropeWithWindowPastTheSequenceIsRope) {
  const std::vector<double> rope = fused_o(identity_case(PositionMode::Rope, 0, 1, false));
  EXPECT_LE(nmse(fused_o(identity_case(PositionMode::Rerope, 130, 1, false)), rope), tol_forward_f32());
  EXPECT_LE(nmse(fused_o(identity_case(PositionMode::Rerope, 1000, 1, true)),
                 fused_o(identity_case(PositionMode::Rope, 0, 1, true))),
            tol_forward_f32());
  // ... and a window inside the sequence is not (the test can fail).
  EXPECT_GT(nmse(fused_o(identity_case(PositionMode::Rerope, 12, 1, false)), rope), 1e-4);
}

TEST(attention_identities, LeakyWithKOneIsRope) {
  const std::vector<double> rope = fused_o(identity_case(PositionMode::Rope, 0, 1, false));
  EXPECT_LE(nmse(fused_o(identity_case(PositionMode::LeakyRerope, 12, 1.0, false)), rope), tol_forward_f32());
  EXPECT_LE(nmse(fused_o(identity_case(PositionMode::LeakyRerope, 12, 1.0, true)),
                 fused_o(identity_case(PositionMode::Rope, 0, 1, true))),
            tol_forward_f32());
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
    EXPECT_LE(nmse(at1000, at0), tol_forward_f32());
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
    EXPECT_LE(nmse(fused_o(c), off), tol_forward_f32());
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
  const std::vector<double> o = fused_forward_o(pr);
  std::vector<double> v_per_q;
  for (int64_t t = 0; t < pr.tokens(); ++t)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int d = 0; d < c.D; ++d) v_per_q.push_back(pr.get(pr.v(), t, h / (c.Hq / c.Hkv), d));
  EXPECT_LE(nmse(o, v_per_q), tol_forward_f32());
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
      {"first_query", [](AttnProblem&, AttentionParams& p) { p.first_query = -1; }},
      {"first_query", [](AttnProblem&, AttentionParams& p) { p.first_query = p.tokens + 1; }},
      {"cu_seqlens", [](AttnProblem&, AttentionParams& p) { p.first_query = 3; }},  // two sequences
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.field);
    AttnProblem pr(base);
    auto out = pr.outputs();
    AttentionGradParams g = pr.grad_params(out);
    b.spoil(pr, g.fwd);
    expect_error([&] { attention_forward(g.fwd); }, {b.field + std::string(" = "), "allowed"});
    expect_error([&] { attention_forward_reference(g.fwd); }, {b.field + std::string(" = "), "allowed"});
    expect_error([&] { attention_backward(g); }, {b.field + std::string(" = "), "allowed"});
    expect_error([&] { attention_backward_reference(g); }, {b.field + std::string(" = "), "allowed"});
  }
  // Backward only.
  AttnProblem pr(base);
  auto out = pr.outputs();
  AttentionGradParams g = pr.grad_params(out);
  g.fwd.lse = nullptr;
  expect_error([&] { attention_backward(g); }, {"fwd.lse" + std::string(" = "), "allowed"});
  g = pr.grad_params(out);
  g.dq.heads = 1;
  expect_error([&] { attention_backward(g); }, {"dq.heads" + std::string(" = "), "allowed"});
  g = pr.grad_params(out);
  g.fwd.cu_seqlens = nullptr, g.fwd.batch = 1, g.fwd.positions = nullptr, g.fwd.first_query = 2;
  attention_forward(g.fwd);  // a valid forward...
  expect_error([&] { attention_backward(g); }, {"fwd.first_query = 2", "allowed"});  // ...that has no backward
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
