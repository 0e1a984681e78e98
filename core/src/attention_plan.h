// core/src/attention_plan.h (internal): what the fused attention kernels share - the resolved call
// (sequences, positions, mode), the scratch layout, and the O(N) pre-rotation of q, k, v (and do) into padded
// fp32 (fp64 for F64) rows in the form each tile product needs.
//
// Scratch forms (T = float, or double for F64 storage; Dp = head_dim rounded up to 64 bytes):
//   rows   [heads][tokens][Dp]           row-major, one padded row per token (q tiles, v tiles, dO, K for dQ)
//   packed [heads][blocks][Dp][kBlockKeys] a key block transposed, so a score tile row is a run of vector FMAs
// Key blocks start at each sequence start; columns past a sequence's end are zero.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "rotary/attention.h"

namespace rotary::attn {

#ifndef ROTARY_ATTN_BC
#define ROTARY_ATTN_BC 64
#endif
#ifndef ROTARY_ATTN_BR
#define ROTARY_ATTN_BR 64
#endif
// Keys per key tile and packed block (a multiple of any vector width) and queries per query tile. Overridable
// for tuning experiments; 64 x 64 measured as good as 48, 72 x 64 and 72 x 128 (docs/bench-attention.md).
inline constexpr int kBlockKeys = ROTARY_ATTN_BC;
inline constexpr int kBlockRows = ROTARY_ATTN_BR;
inline constexpr int kMaxPairs = 128;   // head_dim <= 256

// How a row is rotated and scaled on its way into (or out of) scratch.
enum class Angle : uint8_t {
  None,        // no rotation
  Pos,         // pos
  PosOverK,    // pos / k                (Leaky keys and values beyond the window)
  LeakyQuery,  // (pos - w) / k + w      (Leaky queries beyond the window)
  Window,      // w                      (ReRoPE queries beyond the window)
};

struct RowTransform {
  Angle angle = Angle::None;
  int factor_power = 0;      // the RopeFreqs attention factor to this power scales the rotated features
  bool query_scale = false;  // the whole row times softmax_scale * log-n factor of the token
  bool transpose = false;    // R(-angle): the adjoint (and inverse) of the pure rotation
};

struct Plan {
  int64_t tokens = 0, batch = 1;
  int64_t first_query = 0;          // queries for tokens [first_query, tokens) only (AttentionParams::first_query)
  int64_t queries() const { return tokens - first_query; }
  int D = 0, Dp = 0;
  int64_t Hq = 0, Hkv = 0, group = 1;
  DType dtype = DType::F32;
  bool causal = true;
  std::vector<int64_t> seq_start;   // [batch + 1]
  std::vector<int64_t> pos;         // [tokens]
  std::vector<int32_t> tok_seq;     // [tokens] sequence of each token
  std::vector<int64_t> blk_first;   // [batch + 1] first key block of each sequence
  int64_t nblocks = 0;
  std::vector<int64_t> blk_pmin, blk_pmax;  // [nblocks] position range of each key block
  std::vector<uint8_t> blk_increasing;      // [nblocks] positions increase strictly inside the block

  PositionMode mode = PositionMode::None;
  bool far = false;    // Rerope or LeakyRerope: a second score product beyond the window
  bool roper = false;
  bool logn = false;
  double scale = 0, leaky_k = 1, inv_log_train = 0;
  int64_t w = 0;
  const RopeFreqs* freqs = nullptr;
  int pairs = 0;       // rotated pairs (0 for mode None)

  // The score bias b_h(d), d = pos_i - pos_j, added to the scaled score (ScoreBiasParams): ALiBi from the slopes;
  // T5 from a table by distance clamped into [lut_lo, lut_hi], where the bucket is constant outside (causal: every
  // d < 0 is bucket 0; every d >= max_distance the last bucket; bidirectional likewise for -d).
  ScoreBias bias = ScoreBias::None;
  std::vector<double> alibi;        // [Hq] slopes
  int64_t lut_lo = 0, lut_hi = -1;
  std::vector<double> lut;          // [Hq][lut_width()] T5 bias by clamped distance
  std::vector<int32_t> lut_bucket;  // [lut_width()] the bucket of each clamped distance
  int64_t lut_width() const { return lut_hi - lut_lo + 1; }
  int64_t lut_index(int64_t d) const { return std::clamp(d, lut_lo, lut_hi) - lut_lo; }

  int64_t seq_len(int64_t s) const { return seq_start[size_t(s) + 1] - seq_start[size_t(s)]; }
  int64_t blocks_of(int64_t s) const { return blk_first[size_t(s) + 1] - blk_first[size_t(s)]; }
  // Query scale of a token: softmax_scale * max(1, ln(pos + 1) / ln(L_train)).
  double query_scale(int64_t t) const;
};

// elem_bytes: 4 (fp32 arithmetic) or 8 (F64). Assumes validated params.
Plan make_plan(const AttentionParams& p);
inline int elem_bytes(DType t) { return t == DType::F64 ? 8 : 4; }
inline int padded_dim(int D, int elem) { const int per = 64 / elem; return (D + per - 1) / per * per; }

// s[j] += b_h(qpos - kpos[j]) for the kcount keys of a score tile row (no-op without a bias).
template <class T>
inline void add_score_bias(const Plan& pl, int64_t h, int64_t qpos, const int64_t* kpos, int64_t kcount, T* s) {
  if (pl.bias == ScoreBias::Alibi) {
    const double slope = pl.alibi[size_t(h)];
    for (int64_t j = 0; j < kcount; ++j) s[j] += T(-slope * double(qpos - kpos[j]));
  } else if (pl.bias == ScoreBias::T5) {
    const double* row = pl.lut.data() + h * pl.lut_width();
    for (int64_t j = 0; j < kcount; ++j) s[j] += T(row[pl.lut_index(qpos - kpos[j])]);
  }
}

enum class TileKind : uint8_t { Near, Far, Straddle };

// Where a (query tile, key block) pair lies relative to the window, from the position ranges of both:
// every distance < w (Near: one product Qn Kn^T), every distance >= w (Far: Qf Kf^T), or some of each.
inline TileKind classify(const Plan& pl, int64_t qpmin, int64_t qpmax, int64_t blk) {
  if (!pl.far || qpmax - pl.blk_pmin[size_t(blk)] < pl.w) return TileKind::Near;
  if (qpmin - pl.blk_pmax[size_t(blk)] >= pl.w) return TileKind::Far;
  return TileKind::Straddle;
}

// One row of a straddling tile; key j (of kcount, positions kpos) is inside the window iff kpos[j] > thr
// (thr = pos_i - w). With increasing key positions the far keys are a prefix [0, js): plain copies.
inline int64_t far_prefix(const int64_t* kpos, int64_t kcount, int64_t thr) {
  return std::upper_bound(kpos, kpos + kcount, thr) - kpos;
}
// s[j] = s2[j] for the far keys.
template <class T>
inline void select_far(const int64_t* kpos, int64_t kcount, int64_t thr, bool increasing, T* s, const T* s2) {
  if (increasing) {
    const int64_t js = far_prefix(kpos, kcount, thr);
    std::copy(s2, s2 + js, s);
  } else {
    for (int64_t j = 0; j < kcount; ++j) s[j] = kpos[j] > thr ? s[j] : s2[j];
  }
}
// Moves the far entries of s into s2: afterwards s holds the near entries, s2 the far ones, zeros elsewhere.
template <class T>
inline void split_far(const int64_t* kpos, int64_t kcount, int64_t thr, bool increasing, T* s, T* s2) {
  if (increasing) {
    const int64_t js = far_prefix(kpos, kcount, thr);
    std::copy(s, s + js, s2);
    std::fill(s2 + js, s2 + kcount, T(0));
    std::fill(s, s + js, T(0));
  } else {
    for (int64_t j = 0; j < kcount; ++j) {
      const bool nr = kpos[j] > thr;
      s2[j] = nr ? T(0) : s[j];
      s[j] = nr ? s[j] : T(0);
    }
  }
}

// Transforms of the forward inputs (Qn/Kn: inside the window or plain RoPE; Qf/Kf: beyond the window;
// Vn/Vf: values for the near and far accumulators under RoPER) and their output-side adjoints.
RowTransform q_near(const Plan& pl);
RowTransform k_near(const Plan& pl);
RowTransform q_far(const Plan& pl);
RowTransform k_far(const Plan& pl);
RowTransform v_near(const Plan& pl);
RowTransform v_far(const Plan& pl);
// RoPER output rotations of the near and far accumulators: R(-pos_i), and R(-w) (ReRoPE) or
// R(-((pos_i - w)/k + w)) (Leaky). Their adjoints rotate dO in the backward.
RowTransform o_near(const Plan& pl);
RowTransform o_far(const Plan& pl);
inline RowTransform adjoint(RowTransform t) { t.transpose = !t.transpose; return t; }

// A bump allocator over one 64-byte aligned block; the kernels size the block with the same calls, so
// the reported scratch size is the allocation.
// The block is reused across calls: the last one is kept (one block, the largest seen) so that a call does
// not page-fault fresh memory every time; concurrent calls each get their own.
class Arena {
 public:
  explicit Arena(int64_t bytes);  // bytes < 0: counting only
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  template <class T>
  T* take(int64_t n) { return static_cast<T*>(take_bytes(n * int64_t(sizeof(T)))); }
  int64_t used() const { return used_; }

 private:
  void* take_bytes(int64_t bytes);
  char* base_ = nullptr;
  int64_t cap_ = 0, used_ = 0;
};

// One destination of the pre-rotation: src (a [tokens, heads, D] view of storage dtype pl.dtype) through tr
// into rows [heads][tokens][Dp] or packed [heads][blocks][Dp][kBlockKeys] scratch of T, zero padding written.
// flags (optional, [heads][nblocks]): set to 1 for a key block holding a non-finite value (the causal
// diagonal of such a value block takes the exact per-row path, so that 0 * NaN never reaches a masked query).
struct PrepJob {
  HeadsView src;
  RowTransform tr;
  void* dst = nullptr;
  bool packed = false;
  uint8_t* flags = nullptr;
  int64_t first_token = 0;  // rows only: tokens [first_token, tokens), src row and dst row t - first_token
};

// The pure rotation angles of token t for an angle kind: c[m] = cos(angle * inv_freq[m]), s[m] = sin(...),
// m < pl.pairs (fp32 from rotary::rope_cos_sin*, fp64 for F64).
template <class T>
void angles_at(const Plan& pl, Angle a, int64_t t, T* c, T* s);

}  // namespace rotary::attn
