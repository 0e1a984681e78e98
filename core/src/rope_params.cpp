// Validation shared by the fast kernel and the reference: every rejection names the field and what is allowed.
#include <cmath>
#include <string>
#include <string_view>

#include "rotary/error.h"
#include "rotary/rope.h"

namespace rotary {

// Every kernel call validates (a decode step rotates 32 heads in about a microsecond), so field names and
// "allowed" texts that need a std::string are built only once a check has failed: `if (!ok) fail(...)`.

void RopeFreqs::validate() const {
  check(head_dim >= 2 && head_dim <= 4096, "freqs.head_dim", head_dim, "2..4096");
  if (!(rotary_dim >= 2 && rotary_dim <= head_dim && rotary_dim % 2 == 0))
    fail("freqs.rotary_dim", to_text(rotary_dim), "an even number in [2, head_dim=" + std::to_string(head_dim) + "]");
  if (int64_t(inv_freq.size()) != rotary_dim / 2)
    fail("freqs.inv_freq.size()", to_text(inv_freq.size()), "rotary_dim / 2 = " + std::to_string(rotary_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i)
    if (!(std::isfinite(inv_freq[i]) && inv_freq[i] >= 0))
      fail("freqs.inv_freq[" + std::to_string(i) + "]", to_text(inv_freq[i]), "a finite value >= 0");
  check(std::isfinite(attention_factor) && attention_factor > 0, "freqs.attention_factor", attention_factor,
        "a finite value > 0");
}

namespace {

void check_view(const HeadsView& v, const char* name, int64_t tokens, int head_dim, bool required_heads_match,
                int64_t heads_expected) {
  const std::string_view n(name);
  auto field = [&](const char* member) { return std::string(n) + member; };
  if (v.data == nullptr) fail(field(".data"), "null", "a non-null pointer");
  if (v.heads < 1) fail(field(".heads"), to_text(v.heads), ">= 1");
  if (required_heads_match && v.heads != heads_expected)
    fail(field(".heads"), to_text(v.heads), "the same as the input view (" + std::to_string(heads_expected) + ")");
  // Heads of one token must not overlap; tokens must not overlap each other (unless there is one token).
  if (v.heads > 1 && v.head_stride < head_dim)
    fail(field(".head_stride"), to_text(v.head_stride),
         ">= head_dim = " + std::to_string(head_dim) + " (heads must not overlap)");
  if (v.heads <= 1 && v.head_stride < 0) fail(field(".head_stride"), to_text(v.head_stride), ">= 0");
  const int64_t token_extent = (v.heads - 1) * v.head_stride + head_dim;
  if (tokens > 1 && v.token_stride < token_extent)
    fail(field(".token_stride"), to_text(v.token_stride),
         ">= (heads-1)*head_stride + head_dim = " + std::to_string(token_extent) + " (tokens must not overlap)");
  if (tokens <= 1 && v.token_stride < 0) fail(field(".token_stride"), to_text(v.token_stride), ">= 0");
}

}  // namespace

void validate_rope_params(const RopeFreqs& f, const RopeParams& p) {
  f.validate();
  check(p.tokens >= 0, "tokens", p.tokens, ">= 0");
  if (p.tokens == 0) return;
  check(p.positions != nullptr, "positions", "null", "a pointer to `tokens` int64 positions");
  check(p.direction == RopeDirection::Forward || p.direction == RopeDirection::Inverse ||
            p.direction == RopeDirection::Transpose,
        "direction", int(p.direction), "Forward, Inverse, Transpose");
  check(p.dtype == DType::F32 || p.dtype == DType::F16 || p.dtype == DType::BF16 || p.dtype == DType::F64, "dtype",
        int(p.dtype), "f32, f16, bf16, f64");
  check_view(p.q_in, "q_in", p.tokens, f.head_dim, false, 0);
  check_view(p.q_out, "q_out", p.tokens, f.head_dim, true, p.q_in.heads);
  if (p.k_in.data != nullptr || p.k_out.data != nullptr) {
    check_view(p.k_in, "k_in", p.tokens, f.head_dim, false, 0);
    check_view(p.k_out, "k_out", p.tokens, f.head_dim, true, p.k_in.heads);
    if (p.q_in.heads % p.k_in.heads != 0)
      fail("k_in.heads", to_text(p.k_in.heads),
           "a divisor of q heads = " + std::to_string(p.q_in.heads) + " (MHA, GQA or MQA)");
  }
}

}  // namespace rotary
