// Validation shared by the fused attention kernels and the reference: every rejection names the field, its
// value and what is allowed.
#include <cmath>
#include <string>

#include "rotary/attention.h"
#include "rotary/error.h"

namespace rotary {

namespace {

constexpr int64_t kMaxAbsPosition = int64_t(1) << 53;  // positions are exact doubles; distances cannot overflow

void check_view(const HeadsView& v, const std::string& name, int64_t tokens, int head_dim) {
  check(v.data != nullptr, name + ".data", "null", "a non-null pointer");
  check(v.heads >= 1, name + ".heads", v.heads, ">= 1");
  if (v.heads > 1)
    check(v.head_stride >= head_dim, name + ".head_stride", v.head_stride,
          ">= head_dim = " + std::to_string(head_dim) + " (heads must not overlap)");
  else
    check(v.head_stride >= 0, name + ".head_stride", v.head_stride, ">= 0");
  const int64_t extent = (v.heads - 1) * v.head_stride + head_dim;
  if (tokens > 1)
    check(v.token_stride >= extent, name + ".token_stride", v.token_stride,
          ">= (heads-1)*head_stride + head_dim = " + std::to_string(extent) + " (tokens must not overlap)");
  else
    check(v.token_stride >= 0, name + ".token_stride", v.token_stride, ">= 0");
}

void check_positions(const AttentionParams& p) {
  const int64_t* cu = p.cu_seqlens;
  for (int64_t s = 0; s < p.batch; ++s) {
    const int64_t begin = cu ? cu[s] : 0, end = cu ? cu[s + 1] : p.tokens;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t pos = p.positions[t];
      const std::string field = "positions[" + std::to_string(t) + "]";
      check(pos >= -kMaxAbsPosition && pos <= kMaxAbsPosition, field, pos, "|position| <= 2^53");
      if (p.pos.logn_train_len > 0)
        check(pos >= 0, field, pos, ">= 0 (log-n scaling takes ln(pos + 1))");
      if (p.causal && t > begin)
        check(pos > p.positions[t - 1], field, pos,
              "> positions[" + std::to_string(t - 1) + "] = " + std::to_string(p.positions[t - 1]) +
                  " (positions must increase strictly inside a causal sequence)");
    }
  }
}

void check_position_params(const AttentionParams& p) {
  const PositionParams& pp = p.pos;
  const bool rope_like = pp.mode == PositionMode::Rope || pp.mode == PositionMode::Rerope ||
                         pp.mode == PositionMode::LeakyRerope;
  check(pp.mode == PositionMode::None || rope_like, "pos.mode", int(pp.mode), "None, Rope, Rerope, LeakyRerope");
  if (rope_like) {
    check(pp.freqs != nullptr, "pos.freqs", "null", "a RopeFreqs for modes Rope, Rerope, LeakyRerope");
    pp.freqs->validate();
    check(pp.freqs->head_dim == p.head_dim, "pos.freqs->head_dim", pp.freqs->head_dim,
          "head_dim = " + std::to_string(p.head_dim));
  }
  check(!pp.roper || rope_like, "pos.roper", "true",
        "false when pos.mode is None (RoPER rotates values by the positions a rotary mode uses)");
  if (pp.mode == PositionMode::Rerope || pp.mode == PositionMode::LeakyRerope)
    check(pp.window > 0 && pp.window <= kMaxAbsPosition, "pos.window", pp.window, "> 0 (and <= 2^53)");
  if (pp.mode == PositionMode::LeakyRerope)
    check(std::isfinite(pp.leaky_k) && pp.leaky_k > 0, "pos.leaky_k", pp.leaky_k, "a finite value > 0");
  check(pp.logn_train_len == 0 || pp.logn_train_len > 1, "pos.logn_train_len", pp.logn_train_len,
        "0 (off) or > 1");
}

}  // namespace

void validate_attention_params(const AttentionParams& p) {
  check(p.tokens >= 0, "tokens", p.tokens, ">= 0");
  check(p.head_dim >= 16 && p.head_dim <= 256, "head_dim", p.head_dim, "16..256");
  check(p.dtype == DType::F32 || p.dtype == DType::F16 || p.dtype == DType::BF16 || p.dtype == DType::F64, "dtype",
        int(p.dtype), "f32, f16, bf16, f64");
  check(std::isfinite(p.softmax_scale), "softmax_scale", p.softmax_scale, "a finite value (0: 1/sqrt(head_dim))");
  check_position_params(p);
  check(p.batch >= 1, "batch", p.batch, ">= 1");
  if (p.cu_seqlens == nullptr) {
    check(p.batch == 1, "batch", p.batch, "1 when cu_seqlens is null (one sequence of all tokens)");
  } else {
    check(p.cu_seqlens[0] == 0, "cu_seqlens[0]", p.cu_seqlens[0], "0");
    for (int64_t s = 0; s < p.batch; ++s)
      check(p.cu_seqlens[s + 1] >= p.cu_seqlens[s], "cu_seqlens[" + std::to_string(s + 1) + "]",
            p.cu_seqlens[s + 1], ">= cu_seqlens[" + std::to_string(s) + "] = " + std::to_string(p.cu_seqlens[s]) +
                                     " (non-decreasing)");
    check(p.cu_seqlens[p.batch] == p.tokens, "cu_seqlens[batch]", p.cu_seqlens[p.batch],
          "tokens = " + std::to_string(p.tokens));
  }
  if (p.tokens == 0) return;
  check_view(p.q, "q", p.tokens, p.head_dim);
  check_view(p.k, "k", p.tokens, p.head_dim);
  check_view(p.v, "v", p.tokens, p.head_dim);
  check_view(p.o, "o", p.tokens, p.head_dim);
  check(p.q.heads % p.k.heads == 0, "k.heads", p.k.heads,
        "a divisor of q.heads = " + std::to_string(p.q.heads) + " (MHA, GQA or MQA)");
  check(p.v.heads == p.k.heads, "v.heads", p.v.heads, "k.heads = " + std::to_string(p.k.heads));
  check(p.o.heads == p.q.heads, "o.heads", p.o.heads, "q.heads = " + std::to_string(p.q.heads));
  if (p.positions != nullptr) check_positions(p);
}

void validate_attention_grad_params(const AttentionGradParams& g) {
  const AttentionParams& p = g.fwd;
  validate_attention_params(p);
  if (p.tokens == 0) return;
  check(p.lse != nullptr, "fwd.lse", "null", "the forward's log-sum-exp [tokens, q.heads] (required in backward)");
  check_view(g.dout, "dout", p.tokens, p.head_dim);
  check_view(g.dq, "dq", p.tokens, p.head_dim);
  check_view(g.dk, "dk", p.tokens, p.head_dim);
  check_view(g.dv, "dv", p.tokens, p.head_dim);
  check(g.dout.heads == p.q.heads, "dout.heads", g.dout.heads, "q.heads = " + std::to_string(p.q.heads));
  check(g.dq.heads == p.q.heads, "dq.heads", g.dq.heads, "q.heads = " + std::to_string(p.q.heads));
  check(g.dk.heads == p.k.heads, "dk.heads", g.dk.heads, "k.heads = " + std::to_string(p.k.heads));
  check(g.dv.heads == p.k.heads, "dv.heads", g.dv.heads, "k.heads = " + std::to_string(p.k.heads));
}

}  // namespace rotary
