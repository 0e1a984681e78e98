// core/src/validate.cpp: the checks of validate.h.
#include "validate.h"

#include <cmath>
#include <string>

#include "rotary/error.h"

namespace rotary::detail {
namespace {

std::string cat(std::string_view a, std::string_view b) { return std::string(a).append(b); }

// a * b + c with int64 overflow reported as false.
bool mul_add(int64_t a, int64_t b, int64_t c, int64_t& out) {
  int64_t m = 0;
  return !__builtin_mul_overflow(a, b, &m) && !__builtin_add_overflow(m, c, &out);
}

}  // namespace

void check_view(const HeadsView& v, std::string_view name, int64_t tokens, int64_t row, int64_t expected_heads,
                std::string_view expected_what) {
  if (v.data == nullptr) fail(cat(name, ".data"), "null", "a non-null pointer");
  if (v.heads < 1) fail(cat(name, ".heads"), to_text(v.heads), ">= 1");
  if (expected_heads > 0 && v.heads != expected_heads)
    fail(cat(name, ".heads"), to_text(v.heads), cat(expected_what, " = ") + std::to_string(expected_heads));
  struct Dim {
    int64_t n, stride;
    const char* field;
  };
  Dim inner{v.heads, v.head_stride, ".head_stride"}, outer{tokens, v.token_stride, ".token_stride"};
  for (const Dim& d : {inner, outer})
    if (d.n > 1 && d.stride < 0) fail(cat(name, d.field), to_text(d.stride), ">= 0");
  if (inner.n <= 1 || (outer.n > 1 && outer.stride < inner.stride)) std::swap(inner, outer);
  if (inner.n > 1 && inner.stride < row)
    fail(cat(name, inner.field), to_text(inner.stride),
         ">= the row length " + std::to_string(row) + " (rows must not overlap)");
  if (outer.n > 1) {
    int64_t span = 0;  // elements one step of the outer dim must clear: the inner dim's rows
    if (!mul_add(inner.n - 1, inner.stride, row, span))
      fail(cat(name, inner.field), to_text(inner.stride), "a stride whose view fits in 2^63 elements");
    if (outer.stride < span)
      fail(cat(name, outer.field), to_text(outer.stride),
           ">= " + std::to_string(span) + " = (" + std::string(inner.field + 1) + " dim size " +
               std::to_string(inner.n) + " - 1) * " + std::to_string(inner.stride) + " + row " + std::to_string(row) +
               " (the view's rows must not overlap)");
    int64_t extent = 0;
    if (!mul_add(outer.n - 1, outer.stride, span, extent))
      fail(cat(name, outer.field), to_text(outer.stride), "a stride whose view fits in 2^63 elements");
  }
}

void check_positions(const int64_t* positions, int64_t begin, int64_t end, std::string_view prefix, bool non_negative,
                     bool increasing, const int64_t* previous) {
  auto field = [&](int64_t t) { return cat(prefix, "positions[") + std::to_string(t) + "]"; };
  for (int64_t t = begin; t < end; ++t) {
    const int64_t pos = positions[t];
    if (pos < -kMaxAbsPosition || pos > kMaxAbsPosition) fail(field(t), to_text(pos), "|position| <= 2^53");
    if (non_negative && pos < 0) fail(field(t), to_text(pos), ">= 0 (log-n scaling takes ln(pos + 1))");
    if (!increasing) continue;
    if (t > begin && pos <= positions[t - 1])
      fail(field(t), to_text(pos),
           "> " + field(t - 1) + " = " + std::to_string(positions[t - 1]) + " (positions must increase strictly)");
    if (t == begin && previous != nullptr && pos <= *previous)
      fail(field(t), to_text(pos),
           "> the last cached position " + std::to_string(*previous) + " (positions must increase strictly)");
  }
}

void check_sequences(const int64_t* cu, int64_t batch, int64_t tokens) {
  if (batch < 1) fail("batch", to_text(batch), ">= 1");
  if (cu == nullptr) {
    if (batch != 1) fail("batch", to_text(batch), "1 when cu_seqlens is null (one sequence of all tokens)");
    return;
  }
  if (cu[0] != 0) fail("cu_seqlens[0]", to_text(cu[0]), "0");
  for (int64_t s = 0; s < batch; ++s)
    if (cu[s + 1] < cu[s])
      fail("cu_seqlens[" + std::to_string(s + 1) + "]", to_text(cu[s + 1]),
           ">= cu_seqlens[" + std::to_string(s) + "] = " + std::to_string(cu[s]) + " (non-decreasing)");
  if (cu[batch] != tokens) fail("cu_seqlens[batch]", to_text(cu[batch]), "tokens = " + std::to_string(tokens));
}

void check_dtype(DType t, std::string_view field) {
  if (!(t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64))
    fail(field, to_text(int(t)), "f32, f16, bf16, f64");
}

void check_position_params(const PositionParams& pp, int head_dim, std::string_view head_dim_what) {
  const bool rotary = pp.mode == PositionMode::Rope || pp.mode == PositionMode::Rerope ||
                      pp.mode == PositionMode::LeakyRerope;
  if (!rotary && pp.mode != PositionMode::None)
    fail("pos.mode", to_text(int(pp.mode)), "None, Rope, Rerope, LeakyRerope");
  if (rotary) {
    if (pp.freqs == nullptr) fail("pos.freqs", "null", "a RopeFreqs for modes Rope, Rerope, LeakyRerope");
    pp.freqs->validate();
    if (pp.freqs->head_dim != head_dim)
      fail("pos.freqs->head_dim", to_text(pp.freqs->head_dim), cat(head_dim_what, " = ") + std::to_string(head_dim));
  }
  if (pp.roper && !rotary)
    fail("pos.roper", "true", "false when pos.mode is None (RoPER rotates values by the positions a rotary mode uses)");
  if ((pp.mode == PositionMode::Rerope || pp.mode == PositionMode::LeakyRerope) &&
      !(pp.window > 0 && pp.window <= kMaxAbsPosition))
    fail("pos.window", to_text(pp.window), "> 0 (and <= 2^53)");
  if (pp.mode == PositionMode::LeakyRerope && !(std::isfinite(pp.leaky_k) && pp.leaky_k > 0))
    fail("pos.leaky_k", to_text(pp.leaky_k), "a finite value > 0");
  if (!(pp.logn_train_len == 0 || pp.logn_train_len > 1))
    fail("pos.logn_train_len", to_text(pp.logn_train_len), "0 (off) or a training length > 1");
}

void check_threads(int threads) {
  if (threads < 0 || threads > kMaxThreads)
    fail("threads", to_text(threads), "0 (all OpenMP threads) or 1.." + std::to_string(kMaxThreads));
}

}  // namespace rotary::detail
