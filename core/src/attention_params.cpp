// Validation shared by the fused attention kernels and the reference: every rejection names the field, its
// value and what is allowed.
#include <cmath>
#include <string>

#include "rotary/attention.h"
#include "rotary/error.h"
#include "validate.h"

namespace rotary {

void validate_attention_params(const AttentionParams& p) {
  using namespace detail;
  check(p.tokens >= 0, "tokens", p.tokens, ">= 0");
  check(p.head_dim >= 16 && p.head_dim <= 256, "head_dim", p.head_dim, "16..256");
  check_dtype(p.dtype);
  check_threads(p.threads);
  check(std::isfinite(p.softmax_scale), "softmax_scale", p.softmax_scale, "a finite value (0: 1/sqrt(head_dim))");
  check_position_params(p.pos, p.head_dim, "head_dim");
  check_sequences(p.cu_seqlens, p.batch, p.tokens);
  if (p.tokens == 0) return;
  check_view(p.q, "q", p.tokens, p.head_dim);
  check_view(p.k, "k", p.tokens, p.head_dim);
  if (p.q.heads % p.k.heads != 0)
    fail("k.heads", to_text(p.k.heads), "a divisor of q.heads = " + std::to_string(p.q.heads) + " (MHA, GQA or MQA)");
  check_view(p.v, "v", p.tokens, p.head_dim, p.k.heads, "k.heads");
  check_view(p.o, "o", p.tokens, p.head_dim, p.q.heads, "q.heads");
  if (p.positions != nullptr)
    for (int64_t s = 0; s < p.batch; ++s)
      check_positions(p.positions, p.cu_seqlens ? p.cu_seqlens[s] : 0, p.cu_seqlens ? p.cu_seqlens[s + 1] : p.tokens,
                      "", p.pos.logn_train_len > 0, p.causal);
}

void validate_attention_grad_params(const AttentionGradParams& g) {
  const AttentionParams& p = g.fwd;
  validate_attention_params(p);
  if (p.tokens == 0) return;
  check(p.lse != nullptr, "fwd.lse", "null", "the forward's log-sum-exp [tokens, q.heads] (required in backward)");
  detail::check_view(g.dout, "dout", p.tokens, p.head_dim, p.q.heads, "q.heads");
  detail::check_view(g.dq, "dq", p.tokens, p.head_dim, p.q.heads, "q.heads");
  detail::check_view(g.dk, "dk", p.tokens, p.head_dim, p.k.heads, "k.heads");
  detail::check_view(g.dv, "dv", p.tokens, p.head_dim, p.k.heads, "k.heads");
}

}  // namespace rotary
