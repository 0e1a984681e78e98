// Validation shared by the fast kernel and the reference: every rejection names the field and what is allowed.
#include <cmath>
#include <string>
#include <string_view>

#include "rotary/error.h"
#include "rotary/rope.h"
#include "validate.h"

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

void validate_rope_params(const RopeParams& p) {
  if (p.freqs == nullptr) fail("freqs", "null", "a pointer to the RopeFreqs of the rotation");
  const RopeFreqs& f = *p.freqs;
  f.validate();
  check(p.tokens >= 0, "tokens", p.tokens, ">= 0");
  if (p.tokens == 0) return;
  if (p.positions == nullptr) fail("positions", "null", "a pointer to `tokens` int64 positions");
  check(p.direction == RopeDirection::Forward || p.direction == RopeDirection::Inverse ||
            p.direction == RopeDirection::Transpose,
        "direction", int(p.direction), "Forward, Inverse, Transpose");
  detail::check_dtype(p.dtype);
  detail::check_threads(p.threads);
  detail::check_view(p.q_in, "q_in", p.tokens, f.head_dim);
  detail::check_view(p.q_out, "q_out", p.tokens, f.head_dim, p.q_in.heads, "q_in.heads");
  if (p.k_in.data != nullptr || p.k_out.data != nullptr) {
    detail::check_view(p.k_in, "k_in", p.tokens, f.head_dim);
    detail::check_view(p.k_out, "k_out", p.tokens, f.head_dim, p.k_in.heads, "k_in.heads");
    if (p.q_in.heads % p.k_in.heads != 0)
      fail("k_in.heads", to_text(p.k_in.heads),
           "a divisor of q heads = " + std::to_string(p.q_in.heads) + " (MHA, GQA or MQA)");
  }
}

}  // namespace rotary
