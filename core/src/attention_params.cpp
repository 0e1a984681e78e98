// Validation shared by the fused attention kernels and the reference: every rejection names the field, its
// value and what is allowed.
#include <cmath>
#include <string>

#include "rotary/attention.h"
#include "rotary/error.h"
#include "rotary/t5_bias.h"
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
  check(p.first_query >= 0 && p.first_query <= p.tokens, "first_query", p.first_query,
        "in [0, tokens = " + std::to_string(p.tokens) + "]");
  if (p.first_query > 0)
    check(p.cu_seqlens == nullptr, "cu_seqlens", "given",
          "null with first_query = " + std::to_string(p.first_query) + " (queries for the last tokens of one sequence)");
  if (p.tokens == 0) return;
  const int64_t queries = p.tokens - p.first_query;
  if (queries > 0) check_view(p.q, "q", queries, p.head_dim);
  check_view(p.k, "k", p.tokens, p.head_dim);
  if (p.q.heads % p.k.heads != 0)
    fail("k.heads", to_text(p.k.heads), "a divisor of q.heads = " + std::to_string(p.q.heads) + " (MHA, GQA or MQA)");
  check_view(p.v, "v", p.tokens, p.head_dim, p.k.heads, "k.heads");
  if (queries > 0) check_view(p.o, "o", queries, p.head_dim, p.q.heads, "q.heads");
  const ScoreBiasParams& b = p.bias;
  check(b.kind == ScoreBias::None || b.kind == ScoreBias::Alibi || b.kind == ScoreBias::T5, "bias.kind", int(b.kind),
        "None, Alibi or T5");
  if (b.kind == ScoreBias::Alibi) {
    check(b.alibi_slopes != nullptr, "bias.alibi_slopes", "null", "[q.heads] slopes with bias.kind = Alibi");
    for (int64_t h = 0; h < p.q.heads; ++h)
      check(std::isfinite(b.alibi_slopes[h]), "bias.alibi_slopes[" + std::to_string(h) + "]", b.alibi_slopes[h],
            "a finite value");
  }
  if (b.kind == ScoreBias::T5) {
    check(b.t5_table != nullptr, "bias.t5_table", "null", "[t5_num_buckets, q.heads] with bias.kind = T5");
    validate_t5_buckets(b.t5_num_buckets, b.t5_max_distance, b.t5_bidirectional);
  }
  if (p.positions != nullptr)
    for (int64_t s = 0; s < p.batch; ++s)
      check_positions(p.positions, p.cu_seqlens ? p.cu_seqlens[s] : 0, p.cu_seqlens ? p.cu_seqlens[s + 1] : p.tokens,
                      "", p.pos.logn_train_len > 0, p.causal);
}

void validate_attention_grad_params(const AttentionGradParams& g) {
  const AttentionParams& p = g.fwd;
  validate_attention_params(p);
  check(p.first_query == 0, "fwd.first_query", p.first_query, "0 in the backward (every query's gradient)");
  if (p.tokens == 0) return;
  check(p.lse != nullptr, "fwd.lse", "null", "the forward's log-sum-exp [tokens, q.heads] (required in backward)");
  detail::check_view(g.dout, "dout", p.tokens, p.head_dim, p.q.heads, "q.heads");
  detail::check_view(g.dq, "dq", p.tokens, p.head_dim, p.q.heads, "q.heads");
  detail::check_view(g.dk, "dk", p.tokens, p.head_dim, p.k.heads, "k.heads");
  detail::check_view(g.dv, "dv", p.tokens, p.head_dim, p.k.heads, "k.heads");
  if (p.bias.kind == ScoreBias::T5)
    check(g.dt5_table != nullptr, "dt5_table", "null", "[t5_num_buckets, q.heads] with bias.kind = T5");
  else
    check(g.dt5_table == nullptr, "dt5_table", "given", "null unless bias.kind = T5 (only T5's table is learned)");
}

void detail::clear_t5_gradient(const AttentionGradParams& g) {
  const ScoreBiasParams& b = g.fwd.bias;
  if (b.kind != ScoreBias::T5) return;
  for (int64_t e = 0; e < int64_t(b.t5_num_buckets) * g.fwd.q.heads; ++e) store_from_double(g.dt5_table, g.fwd.dtype, e, 0.0);
}

}  // namespace rotary
