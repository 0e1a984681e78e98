// Validation shared by the table rotation's fast kernel and its reference (rotary/rope_table.h): every rejection
// names the field, the value and what is allowed.
#include <string>

#include "rotary/error.h"
#include "rotary/rope_table.h"
#include "validate.h"

namespace rotary {

void validate_rope_table_params(const RopeTableParams& p) {
  check(p.head_dim >= 2 && p.head_dim <= 4096, "head_dim", p.head_dim, "2..4096");
  if (!(p.rotary_dim >= 2 && p.rotary_dim <= p.head_dim && p.rotary_dim % 2 == 0))
    fail("rotary_dim", to_text(p.rotary_dim), "an even number in [2, head_dim=" + std::to_string(p.head_dim) + "]");
  check(p.layout == RopeLayout::HalfSplit || p.layout == RopeLayout::Interleaved, "layout", int(p.layout),
        "HalfSplit, Interleaved");
  check(p.width == TableWidth::Pairs || p.width == TableWidth::Features, "width", int(p.width), "Pairs, Features");
  check(p.tokens >= 0, "tokens", p.tokens, ">= 0");
  detail::check_dtype(p.dtype);
  detail::check_threads(p.threads);
  if (p.tokens == 0) return;
  check(p.table_rows >= 1, "table_rows", p.table_rows, ">= 1");
  if (p.row_stride < p.table_width())
    fail("row_stride", to_text(p.row_stride),
         ">= the table width " + std::to_string(p.table_width()) +
             (p.width == TableWidth::Pairs ? " (rotary_dim / 2)" : " (rotary_dim)"));
  if (p.cos == nullptr) fail("cos", "null", "a pointer to the cos table");
  if (p.sin == nullptr) fail("sin", "null", "a pointer to the sin table");
  if (p.rows == nullptr) fail("rows", "null", "a pointer to `tokens` int64 table rows");
  for (int64_t t = 0; t < p.tokens; ++t)
    if (p.rows[t] < 0 || p.rows[t] >= p.table_rows)
      fail("rows[" + std::to_string(t) + "]", to_text(p.rows[t]),
           "a table row in [0, table_rows=" + std::to_string(p.table_rows) + ")");
  detail::check_view(p.x_in, "x_in", p.tokens, p.head_dim);
  detail::check_view(p.x_out, "x_out", p.tokens, p.head_dim, p.x_in.heads, "x_in.heads");
}

}  // namespace rotary
