// tests/core/cases_decode.h: the decode oracle and problem pieces shared by the "decode" op cases
// (cases_decode.cpp) and the decode tests that are not one kernel against the oracle (test_decode.cpp).
//
// The oracle (decode_oracle) is written from the definitions with ABSOLUTE rotations, as the seed computes them:
// near score (a R(pos_i) q) . (a R(pos_j) k), far score ReRoPE (a^2 R(w) q) . k, Leaky
// (a R((pos_i - w)/k + w) q) . (a R(pos_j/k) k), RoPER value R(-delta_ij) v_j. It reads the raw inputs, never the
// cache, so the cache's storage (rotated keys, permuted layout, near table, far copies) is under test too.
#pragma once

#include <string>
#include <vector>

#include "op_harness.h"
#include "rotary/attention.h"
#include "rotary/kv_cache.h"
#include "rotary/rope_spec.h"

namespace rotary::test {

struct DecodeSpec {
  PositionMode mode = PositionMode::Rope;
  DType dtype = DType::F32;
  RopeLayout layout = RopeLayout::HalfSplit;
  int D = 32, rotary_dim = 32;
  int64_t Hq = 4, Hkv = 2, n = 97;
  int64_t window = 16;
  double leaky_k = 4;
  int64_t logn = 0;
  bool roper = false;
  double attention_factor = 1.0;
  int64_t q_gap = 0;  // q position = last cached position + q_gap
  uint64_t seed = 1;
};

std::string describe(const DecodeSpec& c);
RopeFreqs make_freqs(const DecodeSpec& c);
PositionParams make_pos(const DecodeSpec& c, const RopeFreqs* f);
// Strictly increasing positions with gaps of 1..3, starting at 2.
std::vector<int64_t> make_positions(int64_t n, uint64_t seed);
// y = factor R(angle) x on the rotary pairs, the rest unchanged.
std::vector<double> turn(const RopeFreqs& f, const std::vector<double>& x, double angle, double factor);

struct DecodeRows {  // contiguous q [Hq, D], k, v [n, Hkv, D] in the storage dtype
  GuardedBuffer q, k, v;
  DecodeRows(DType t, int64_t Hq, int64_t Hkv, int64_t n, int D)
      : q(t, Hq * D), k(t, n * Hkv * D), v(t, n * Hkv * D) {}
  std::vector<double> row(const GuardedBuffer& b, int64_t index, int D) const;
};

// The decode step as the seed defines it: query at q_pos against keys [0, n) of the raw rows. o [Hq, D], lse [Hq].
void decode_oracle(const PositionParams& pp, int D, int64_t Hq, int64_t Hkv, const DecodeRows& rows,
                   const int64_t* pos, int64_t n, int64_t q_pos, double scale, std::vector<double>& o,
                   std::vector<double>& lse);

// A contiguous [heads, D] view of one token.
inline HeadsView token_view(GuardedBuffer& b, int64_t heads, int D) { return {b.data(), heads, heads * D, D}; }

}  // namespace rotary::test
