// core/src/attention_plan.cpp: the per-call part of the fused attention compiled once (not per SIMD target): the call
// resolved into a Plan, the row transform of each input in each mode, the scratch arena and a token's cos/sin
// (attention_plan.h). The per-target pre-rotation that uses them is attention_prep-inl.h.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>

#include "attention_plan.h"
#include "rotary/angles.h"
#include "rotary/t5_bias.h"

namespace rotary::attn {

double Plan::query_scale(int64_t t) const {
  if (!logn) return scale;
  return scale * std::max(1.0, std::log(double(pos[size_t(t)]) + 1.0) * inv_log_train);
}

Plan make_plan(const AttentionParams& p) {
  Plan pl;
  pl.tokens = p.tokens;
  pl.batch = p.batch;
  pl.first_query = p.first_query;
  pl.D = p.head_dim;
  pl.Dp = padded_dim(p.head_dim, elem_bytes(p.dtype));
  pl.Hq = p.q.heads;
  pl.Hkv = p.k.heads;
  pl.group = pl.Hq / pl.Hkv;
  pl.dtype = p.dtype;
  pl.causal = p.causal;
  pl.seq_start.resize(size_t(p.batch) + 1);
  for (int64_t s = 0; s <= p.batch; ++s)
    pl.seq_start[size_t(s)] = p.cu_seqlens ? p.cu_seqlens[s] : (s == 0 ? 0 : p.tokens);
  pl.pos.resize(size_t(p.tokens));
  pl.tok_seq.resize(size_t(p.tokens));
  pl.blk_first.resize(size_t(p.batch) + 1);
  pl.blk_first[0] = 0;
  for (int64_t s = 0; s < p.batch; ++s) {
    const int64_t b = pl.seq_start[size_t(s)], e = pl.seq_start[size_t(s) + 1];
    for (int64_t t = b; t < e; ++t) {
      pl.pos[size_t(t)] = p.positions ? p.positions[t] : t - b;
      pl.tok_seq[size_t(t)] = int32_t(s);
    }
    pl.blk_first[size_t(s) + 1] = pl.blk_first[size_t(s)] + (e - b + kBlockKeys - 1) / kBlockKeys;
  }
  pl.nblocks = pl.blk_first[size_t(p.batch)];
  pl.blk_pmin.assign(size_t(pl.nblocks), std::numeric_limits<int64_t>::max());
  pl.blk_pmax.assign(size_t(pl.nblocks), std::numeric_limits<int64_t>::min());
  for (int64_t s = 0; s < p.batch; ++s)
    for (int64_t t = pl.seq_start[size_t(s)]; t < pl.seq_start[size_t(s) + 1]; ++t) {
      const size_t blk = size_t(pl.blk_first[size_t(s)] + (t - pl.seq_start[size_t(s)]) / kBlockKeys);
      pl.blk_pmin[blk] = std::min(pl.blk_pmin[blk], pl.pos[size_t(t)]);
      pl.blk_pmax[blk] = std::max(pl.blk_pmax[blk], pl.pos[size_t(t)]);
    }
  pl.blk_increasing.assign(size_t(pl.nblocks), 1);
  for (int64_t s = 0; s < p.batch; ++s)
    for (int64_t t = pl.seq_start[size_t(s)] + 1; t < pl.seq_start[size_t(s) + 1]; ++t) {
      const int64_t i = t - pl.seq_start[size_t(s)];
      if (i % kBlockKeys != 0 && pl.pos[size_t(t)] <= pl.pos[size_t(t) - 1])
        pl.blk_increasing[size_t(pl.blk_first[size_t(s)] + i / kBlockKeys)] = 0;
    }
  pl.mode = p.pos.mode;
  pl.far = p.pos.mode == PositionMode::Rerope || p.pos.mode == PositionMode::LeakyRerope;
  pl.roper = p.pos.roper;
  pl.logn = p.pos.logn_train_len > 0;
  pl.inv_log_train = pl.logn ? 1.0 / std::log(double(p.pos.logn_train_len)) : 0.0;
  pl.scale = p.softmax_scale != 0 ? p.softmax_scale : 1.0 / std::sqrt(double(p.head_dim));
  pl.w = p.pos.window;
  pl.leaky_k = p.pos.leaky_k;
  pl.freqs = p.pos.mode == PositionMode::None ? nullptr : p.pos.freqs;
  pl.pairs = pl.freqs ? pl.freqs->pairs() : 0;
  const ScoreBiasParams& sb = p.bias;
  pl.bias = sb.kind;
  if (sb.kind == ScoreBias::Alibi) pl.alibi.assign(sb.alibi_slopes, sb.alibi_slopes + pl.Hq);
  if (sb.kind == ScoreBias::T5) {
    pl.lut_lo = sb.t5_bidirectional ? -int64_t(sb.t5_max_distance) : -1;
    pl.lut_hi = sb.t5_max_distance;
    const int64_t W = pl.lut_width();
    pl.lut_bucket.resize(size_t(W));
    pl.lut.resize(size_t(pl.Hq * W));
    for (int64_t i = 0; i < W; ++i) {
      const int b = t5_relative_bucket(pl.lut_lo + i, 0, sb.t5_bidirectional, sb.t5_num_buckets, sb.t5_max_distance);
      pl.lut_bucket[size_t(i)] = b;
      for (int64_t h = 0; h < pl.Hq; ++h)
        pl.lut[size_t(h * W + i)] = load_as_double(sb.t5_table, p.dtype, int64_t(b) * pl.Hq + h);
    }
  }
  return pl;
}

namespace {
RowTransform make(Angle a, int power, bool qs) {
  RowTransform t;
  t.angle = a, t.factor_power = power, t.query_scale = qs;
  return t;
}
bool rotary_mode(const Plan& pl) { return pl.mode != PositionMode::None; }
}  // namespace

RowTransform q_near(const Plan& pl) { return make(rotary_mode(pl) ? Angle::Pos : Angle::None, 1, true); }
RowTransform k_near(const Plan& pl) { return make(rotary_mode(pl) ? Angle::Pos : Angle::None, 1, false); }
RowTransform q_far(const Plan& pl) {
  return pl.mode == PositionMode::Rerope ? make(Angle::Window, 2, true) : make(Angle::LeakyQuery, 1, true);
}
RowTransform k_far(const Plan& pl) {
  return pl.mode == PositionMode::Rerope ? make(Angle::None, 0, false) : make(Angle::PosOverK, 1, false);
}
RowTransform v_near(const Plan& pl) { return make(pl.roper ? Angle::Pos : Angle::None, 0, false); }
RowTransform v_far(const Plan& pl) {
  return make(pl.roper && pl.mode == PositionMode::LeakyRerope ? Angle::PosOverK : Angle::None, 0, false);
}

RowTransform o_near(const Plan& pl) {
  RowTransform t = make(Angle::Pos, 0, false);
  t.transpose = true;
  return t;
}
RowTransform o_far(const Plan& pl) {
  RowTransform t = make(pl.mode == PositionMode::Rerope ? Angle::Window : Angle::LeakyQuery, 0, false);
  t.transpose = true;
  return t;
}

namespace {
// The kept block (see Arena). Freed at exit.
struct BlockCache {
  std::mutex mu;
  char* block = nullptr;
  int64_t cap = 0;
  ~BlockCache() { std::free(block); }
};
BlockCache& block_cache() {
  static BlockCache cache;
  return cache;
}
}  // namespace

Arena::Arena(int64_t bytes) : cap_(bytes) {
  if (bytes <= 0) return;
  {
    BlockCache& c = block_cache();
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.block && c.cap >= bytes) {
      base_ = c.block, cap_ = c.cap;
      c.block = nullptr, c.cap = 0;
      return;
    }
  }
  base_ = static_cast<char*>(std::aligned_alloc(64, size_t((bytes + 63) / 64 * 64)));
  if (!base_) throw std::bad_alloc();
}

Arena::~Arena() {
  if (!base_) return;
  BlockCache& c = block_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.cap < cap_) std::swap(c.block, base_), std::swap(c.cap, cap_);
  std::free(base_);
}

void* Arena::take_bytes(int64_t bytes) {
  const int64_t at = used_;
  used_ += (bytes + 63) / 64 * 64;
  if (cap_ < 0) return nullptr;  // counting
  if (used_ > cap_) throw std::bad_alloc();
  return base_ + at;
}

template <class T>
void angles_at(const Plan& pl, Angle a, int64_t t, T* c, T* s) {
  const double pos = double(pl.pos[size_t(t)]), w = double(pl.w), k = pl.leaky_k;
  const double* inv = pl.freqs->inv_freq.data();
  const int n = pl.pairs;
  if constexpr (sizeof(T) == 4) {
    if (a == Angle::Pos) return rope_cos_sin(inv, n, pl.pos[size_t(t)], 1.0, c, s);
    if (a == Angle::Window) return rope_cos_sin(inv, n, pl.w, 1.0, c, s);
    return rope_cos_sin_at(inv, n, a == Angle::PosOverK ? pos / k : (pos - w) / k + w, 1.0, c, s);
  } else {
    if (a == Angle::Pos) return rope_cos_sin_f64(inv, n, pl.pos[size_t(t)], 1.0, c, s);
    if (a == Angle::Window) return rope_cos_sin_f64(inv, n, pl.w, 1.0, c, s);
    const double ang = a == Angle::PosOverK ? pos / k : (pos - w) / k + w;
    for (int i = 0; i < n; ++i) c[i] = std::cos(ang * inv[i]), s[i] = std::sin(ang * inv[i]);
  }
}

#define ROTARY_ATTN_INSTANTIATE(T)                                                                  \
  template void angles_at<T>(const Plan&, Angle, int64_t, T*, T*);
ROTARY_ATTN_INSTANTIATE(float)
ROTARY_ATTN_INSTANTIATE(double)
#undef ROTARY_ATTN_INSTANTIATE

}  // namespace rotary::attn
