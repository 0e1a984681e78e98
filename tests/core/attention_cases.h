// tests/core/attention_cases.h: one attention problem (case description + guarded tensors in a chosen memory
// layout): the state of the attention op cases (cases_attention.cpp) and of the identity, scratch and bad-input
// tests of test_attention.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "op_harness.h"
#include "rotary/attention.h"
#include "rotary/rope_spec.h"

namespace rotary::test {

enum class MemLayout : uint8_t {
  Contiguous,  // [tokens, H, D]
  Padded,      // heads and tokens with gaps (head_stride = D + 3, token_stride = H (D + 3) + 5)
  FusedQkv,    // q, k, v interleaved per token in one buffer, as a fused projection writes them
  HeadMajor,   // [H, tokens, D]: a [B, H, S, D] tensor transposed to [B, S, H, D] at B = 1 (Hugging Face at
               // inference); token_stride = D < head_stride = tokens * D
};

struct AttnCase {
  std::string name;
  PositionMode mode = PositionMode::Rope;
  bool roper = false;
  int64_t window = 0;
  double leaky_k = 1.0;
  int64_t logn_train = 0;
  int D = 64;
  int rotary_dim = 0;  // 0: D
  RopeLayout layout = RopeLayout::HalfSplit;
  double attention_factor = 1.0;
  int Hq = 2, Hkv = 2;
  std::vector<int64_t> seqlens{33};
  bool causal = true;
  DType dtype = DType::F32;
  MemLayout mem = MemLayout::Contiguous;
  int64_t position_offset = -1;  // >= 0: explicit positions offset + index (+ index / 5 gaps); -1: default
  bool shuffle_positions = false;  // explicit positions permuted inside each sequence (non-causal only)
  double softmax_scale = 0;
  ScoreBias bias = ScoreBias::None;  // Alibi: slopes 2^-(h+1) (negated for odd heads); T5: a table in [-1, 1)
  int t5_buckets = 32, t5_max_distance = 128;
  bool t5_bidirectional = false;
  int64_t first_query = 0;  // > 0 (one sequence): queries for tokens [first_query, tokens) only
};

inline std::string describe(const AttnCase& c) {
  std::string mode = c.mode == PositionMode::None ? "none" : c.mode == PositionMode::Rope ? "rope"
                     : c.mode == PositionMode::Rerope ? "rerope(w=" + std::to_string(c.window) + ")"
                                                     : "leaky(w=" + std::to_string(c.window) + ",k=" +
                                                           std::to_string(c.leaky_k) + ")";
  std::string lens;
  for (int64_t l : c.seqlens) lens += (lens.empty() ? "" : ",") + std::to_string(l);
  const std::string bias = c.bias == ScoreBias::Alibi ? "+alibi"
                           : c.bias == ScoreBias::T5 ? "+t5(" + std::to_string(c.t5_buckets) + "," +
                                                           std::to_string(c.t5_max_distance) +
                                                           (c.t5_bidirectional ? ",bi)" : ")")
                                                     : "";
  const std::string tail = c.first_query > 0 ? " queries from " + std::to_string(c.first_query) : "";
  return c.name + " [" + mode + (c.roper ? "+roper" : "") + (c.logn_train ? "+logn" : "") + bias + tail +
         " D=" + std::to_string(c.D) + " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) +
         " seqs=" + lens + (c.causal ? " causal" : " full") + " " + dtype_name(c.dtype) + "]";
}

// The largest position the angles see (explicit positions grow by index / 5 gaps past the offset).
inline int64_t max_position(const AttnCase& c) {
  int64_t longest = 0;
  for (int64_t l : c.seqlens) longest = std::max(longest, l);
  return std::max<int64_t>(0, c.position_offset) + longest + longest / 5;
}

// A mid-size problem of one mode: D = 64, 4 query heads on 2 kv heads, sequences 130 and 33 (causal).
inline AttnCase identity_case(PositionMode mode, int64_t w, double k, bool roper) {
  AttnCase c;
  c.mode = mode, c.window = w, c.leaky_k = k, c.roper = roper;
  c.D = 64, c.Hq = 4, c.Hkv = 2, c.seqlens = {130, 33};
  return c;
}

// Buffers and views of one problem; q, k, v, dout filled with uniform [-1, 1) values.
class AttnProblem {
 public:
  explicit AttnProblem(const AttnCase& c, uint64_t seed = 1) : c_(c) {
    tokens_ = 0;
    cu_.push_back(0);
    for (int64_t l : c.seqlens) cu_.push_back(tokens_ += l);
    if (c.position_offset >= 0) {
      std::mt19937_64 rng(seed + 99);
      for (int64_t s = 0; s < int64_t(c.seqlens.size()); ++s) {
        const size_t first = pos_.size();
        for (int64_t i = 0; i < c.seqlens[size_t(s)]; ++i) pos_.push_back(c.position_offset + i + i / 5);
        if (c.shuffle_positions) std::shuffle(pos_.begin() + int64_t(first), pos_.end(), rng);
      }
    }
    if (c.mode != PositionMode::None) {
      RopeSpec spec;
      spec.head_dim = c.D;
      spec.rotary_dim = c.rotary_dim;
      spec.layout = c.layout;
      freqs_ = spec.freqs();
      freqs_.attention_factor = c.attention_factor;
    }
    const int64_t D = c.D;
    if (c.mem == MemLayout::FusedQkv) {
      const int64_t row = (c.Hq + 2 * c.Hkv) * D;
      qkv_ = std::make_unique<GuardedBuffer>(c.dtype, tokens_ * row);
      fill_uniform(*qkv_, seed);
      q_ = {qkv_->data(), c.Hq, row, D};
      k_ = {at(qkv_->data(), c.Hq * D), c.Hkv, row, D};
      v_ = {at(qkv_->data(), (c.Hq + c.Hkv) * D), c.Hkv, row, D};
    } else {
      qb_ = make(c.Hq, seed), kb_ = make(c.Hkv, seed + 1), vb_ = make(c.Hkv, seed + 2);
      q_ = view(*qb_, c.Hq), k_ = view(*kb_, c.Hkv), v_ = view(*vb_, c.Hkv);
    }
    dob_ = make(c.Hq, seed + 3);
    dout_ = view(*dob_, c.Hq);
    for (int h = 0; h < c.Hq; ++h) alibi_.push_back(std::ldexp(h % 2 ? -1.0 : 1.0, -(h + 1)));
    if (c.bias == ScoreBias::T5) {
      t5_ = std::make_unique<GuardedBuffer>(c.dtype, int64_t(c.t5_buckets) * c.Hq);
      fill_uniform(*t5_, seed + 4);
    }
  }

  const AttnCase& spec() const { return c_; }
  int64_t tokens() const { return tokens_; }
  const std::vector<int64_t>& positions() const { return pos_; }
  std::vector<int64_t>& mutable_positions() { return pos_; }
  RopeFreqs& freqs() { return freqs_; }

  // Params with fresh output buffers (o filled with a marker so that writes outside the view show).
  struct Outputs {
    std::unique_ptr<GuardedBuffer> o, lse, dq, dk, dv, dt5;
    HeadsView ov, dqv, dkv, dvv;
  };
  Outputs outputs() const {
    Outputs out;
    out.o = make(c_.Hq, 0, true), out.ov = view(*out.o, c_.Hq);
    out.lse = std::make_unique<GuardedBuffer>(c_.dtype == DType::F64 ? DType::F64 : DType::F32, tokens_ * c_.Hq);
    out.dq = make(c_.Hq, 0, true), out.dqv = view(*out.dq, c_.Hq);
    out.dk = make(c_.Hkv, 0, true), out.dkv = view(*out.dk, c_.Hkv);
    out.dv = make(c_.Hkv, 0, true), out.dvv = view(*out.dv, c_.Hkv);
    if (t5_) {
      out.dt5 = std::make_unique<GuardedBuffer>(c_.dtype, t5_->size());
      for (int64_t i = 0; i < out.dt5->size(); ++i) out.dt5->set(i, kMarker);
    }
    return out;
  }
  AttentionParams params(Outputs& out) {
    AttentionParams p;
    p.tokens = tokens_;
    p.head_dim = c_.D;
    p.dtype = c_.dtype;
    p.q = q_, p.k = k_, p.v = v_, p.o = out.ov;
    p.lse = out.lse->data();
    p.batch = int64_t(c_.seqlens.size());
    p.cu_seqlens = cu_.data();
    p.positions = pos_.empty() ? nullptr : pos_.data();
    p.causal = c_.causal;
    p.softmax_scale = c_.softmax_scale;
    p.pos.mode = c_.mode;
    p.pos.freqs = c_.mode == PositionMode::None ? nullptr : &freqs_;
    p.pos.roper = c_.roper;
    p.pos.window = c_.window;
    p.pos.leaky_k = c_.leaky_k;
    p.pos.logn_train_len = c_.logn_train;
    p.bias.kind = c_.bias;
    p.bias.alibi_slopes = alibi_.data();
    p.bias.t5_table = t5_ ? t5_->data() : nullptr;
    p.bias.t5_num_buckets = c_.t5_buckets;
    p.bias.t5_max_distance = c_.t5_max_distance;
    p.bias.t5_bidirectional = c_.t5_bidirectional;
    if (c_.first_query > 0) {
      // q from token first_query on; o and lse keep their full buffers, written in their first rows only (the
      // rows past tokens - first_query keep the marker, so that a stray write shows as a difference).
      p.first_query = c_.first_query, p.cu_seqlens = nullptr;
      p.q.data = at(q_.data, c_.first_query * q_.token_stride);
    }
    return p;
  }
  AttentionGradParams grad_params(Outputs& out) {
    AttentionGradParams g;
    g.fwd = params(out);
    g.dout = dout_, g.dq = out.dqv, g.dk = out.dkv, g.dv = out.dvv;
    g.dt5_table = out.dt5 ? out.dt5->data() : nullptr;
    return g;
  }

  // Elements of a view, in [token][head][d] order, as doubles.
  std::vector<double> gather(const HeadsView& v) const { return gather_view(v, c_.dtype, tokens_, c_.D); }
  // Sets element (token, head, d) of an input view.
  void set(const HeadsView& v, int64_t tok, int64_t h, int d, double x) {
    store_from_double(v.data, c_.dtype, tok * v.token_stride + h * v.head_stride + d, x);
  }
  double get(const HeadsView& v, int64_t tok, int64_t h, int d) const {
    return load_as_double(v.data, c_.dtype, tok * v.token_stride + h * v.head_stride + d);
  }
  const HeadsView& q() const { return q_; }
  const HeadsView& k() const { return k_; }
  const HeadsView& v() const { return v_; }
  const HeadsView& dout() const { return dout_; }
  GuardedBuffer* t5_table() { return t5_.get(); }  // null without a T5 bias

  // True when every element of buffer b outside view v (gaps between heads and tokens) still holds the marker.
  bool gaps_untouched(const GuardedBuffer& b, const HeadsView& v) const {
    std::vector<bool> in(size_t(b.size()), false);
    for (int64_t tok = 0; tok < tokens_; ++tok)
      for (int64_t h = 0; h < v.heads; ++h)
        for (int d = 0; d < c_.D; ++d) in[size_t(tok * v.token_stride + h * v.head_stride + d)] = true;
    for (int64_t i = 0; i < b.size(); ++i)
      if (!in[size_t(i)] && b.get(i) != kMarker) return false;
    return b.guards_intact();
  }

  static constexpr double kMarker = 77.0;

 private:
  int64_t row_elems(int64_t H) const {
    return c_.mem == MemLayout::Padded ? H * (c_.D + 3) + 5 : H * c_.D;  // HeadMajor: the same elements
  }
  std::unique_ptr<GuardedBuffer> make(int64_t H, uint64_t seed, bool marker = false) const {
    auto b = std::make_unique<GuardedBuffer>(c_.dtype, std::max<int64_t>(1, tokens_ * row_elems(H)));
    if (marker) {
      for (int64_t i = 0; i < b->size(); ++i) b->set(i, kMarker);
    } else {
      fill_uniform(*b, seed);
    }
    return b;
  }
  HeadsView view(GuardedBuffer& b, int64_t H) const {
    if (c_.mem == MemLayout::HeadMajor) return {b.data(), H, c_.D, tokens_ * c_.D};
    const int64_t hs = c_.mem == MemLayout::Padded ? c_.D + 3 : c_.D;
    return {b.data(), H, row_elems(H), hs};
  }
  void* at(void* base, int64_t elems) const {
    return static_cast<char*>(base) + elems * int64_t(dtype_size(c_.dtype));
  }

  AttnCase c_;
  int64_t tokens_ = 0;
  std::vector<int64_t> cu_, pos_;
  RopeFreqs freqs_;
  std::unique_ptr<GuardedBuffer> qkv_, qb_, kb_, vb_, dob_, t5_;
  std::vector<double> alibi_;
  HeadsView q_, k_, v_, dout_;
};

}  // namespace rotary::test
