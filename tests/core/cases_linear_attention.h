// tests/core/cases_linear_attention.h: one linear attention problem (parameters, guarded buffers in strided views,
// the params pointing at them): the state of the linear attention op cases (cases_linear_attention.cpp) and of the
// tests of test_linear_attention.cpp that are not one kernel against the reference.
#pragma once

#include <memory>
#include <vector>

#include "op_harness.h"
#include "rotary/linear_attention.h"
#include "rotary/rope_spec.h"

namespace rotary::test {

struct LinearCaseSpec {
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
  bool finite_differences = false;
  FeatureMap feature_map = FeatureMap::EluPlusOne;  // identity: q, k drawn positive, in [0.05, 2)
};

// Buffers [tokens, H, row + pad] of one problem and the params pointing at them; every output buffer starts as
// fill_uniform noise and keeps it outside its view.
struct LinearProblem {
  LinearCaseSpec c;
  RopeFreqs freqs;
  int64_t tokens = 0;
  std::vector<int64_t> cu, pos;
  std::unique_ptr<WatchedBuffer> q, k, v, dout, o, dq, dk, dv;

  explicit LinearProblem(const LinearCaseSpec& cc) : c(cc) {
    for (int64_t l : c.lengths) tokens += l;
    RopeSpec spec;
    spec.head_dim = c.D, spec.rotary_dim = c.rotary_dim, spec.layout = c.layout, spec.base = 100.0;
    freqs = spec.freqs();
    freqs.attention_factor = c.attention_factor;
    cu.push_back(0);
    for (int64_t l : c.lengths) cu.push_back(cu.back() + l);
    int64_t p = 3;
    for (int64_t t = 0; t < tokens; ++t) pos.push_back(p += 1 + int64_t((t * 7 + c.seed) % 3));
    uint64_t seed = c.seed * 5;
    auto make = [&](const char* name, int row, double lo, double hi) {
      auto b = std::make_unique<WatchedBuffer>(name, c.dtype, tokens * c.H * (row + c.pad));
      fill_uniform(*b, ++seed, lo, hi);
      b->snapshot();
      return b;
    };
    // Inputs of q and k in [-2, 1.5): phi's two branches (x <= 0 and x > 0) both occur.
    // With the identity map they are the features themselves, so positive.
    const bool identity = c.feature_map == FeatureMap::Identity;
    const double lo = identity ? 0.05 : -2.0, hi = identity ? 2.0 : 1.5;
    q = make("q", c.D, lo, hi), k = make("k", c.D, lo, hi), v = make("v", c.Dv, -1, 1);
    dout = make("dout", c.Dv, -1, 1);
    o = make("o", c.Dv, -1, 1), dq = make("dq", c.D, -1, 1), dk = make("dk", c.D, -1, 1), dv = make("dv", c.Dv, -1, 1);
    for (auto [b, row] : {std::pair{o.get(), c.Dv}, std::pair{dq.get(), c.D}, std::pair{dk.get(), c.D},
                          std::pair{dv.get(), c.Dv}}) {
      b->allow_writes(view(*b, row), tokens, row);
      b->snapshot();
    }
  }
  HeadsView view(WatchedBuffer& b, int row) const { return {b.data(), c.H, c.H * (row + c.pad), row + c.pad}; }
  std::vector<double> gather(const WatchedBuffer& b, int row) const {
    return b.gather({const_cast<void*>(b.data()), c.H, c.H * (row + c.pad), row + c.pad}, tokens, row);
  }
  LinearAttentionParams params() {
    LinearAttentionParams p;
    p.tokens = tokens, p.head_dim = c.D, p.value_dim = c.Dv, p.dtype = c.dtype;
    p.q = view(*q, c.D), p.k = view(*k, c.D), p.v = view(*v, c.Dv), p.o = view(*o, c.Dv);
    p.batch = int64_t(c.lengths.size());
    p.cu_seqlens = cu.data();
    p.positions = c.positions ? pos.data() : nullptr;
    p.causal = c.causal;
    p.feature_map = c.feature_map;
    p.freqs = c.rotate ? &freqs : nullptr;
    return p;
  }
  LinearAttentionGradParams grad_params() {
    LinearAttentionGradParams g;
    g.fwd = params();
    g.dout = view(*dout, c.Dv), g.dq = view(*dq, c.D), g.dk = view(*dk, c.D), g.dv = view(*dv, c.Dv);
    return g;
  }
};

}  // namespace rotary::test
