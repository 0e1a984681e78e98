// core/src/validate.h (internal): the one rule set every kernel's Params are checked against. Each check builds
// its message only once it has failed (a decode step validates on every call), and names the field, the value
// and what is allowed (rotary/error.h).
#pragma once

#include <cstdint>
#include <string_view>

#include "rotary/attention.h"
#include "rotary/dtype.h"
#include "rotary/rope.h"

namespace rotary::detail {

using rotary::kMaxAbsPosition;  // rotary/rope_spec.h

// A strided [tokens, heads, row] view (the row's `row` elements contiguous) must address `tokens * heads` rows
// that do not overlap, in any order of its two strided dims: the dim with the smaller stride must fit, with its
// rows, inside one step of the other (so [B,S,H,D] views, head-major [B,H,S,D] views seen as [S,H,D] and padded
// heads all pass). A dim of size 1 never steps, so its stride may be anything. `expected_heads` > 0 also requires
// v.heads == expected_heads, described as `expected_what` ("q.heads", "the cache's kv_heads") in the message.
void check_view(const HeadsView& v, std::string_view name, int64_t tokens, int64_t row, int64_t expected_heads = 0,
                std::string_view expected_what = {});

// Every position in [begin, end) has |pos| <= 2^53, is >= 0 when `non_negative` (log-n takes ln(pos + 1)), and,
// when `increasing`, is greater than the one before it (and than `*previous` for the first, when given: a cache's
// last position). Fields are named `<prefix>positions[t]`.
void check_positions(const int64_t* positions, int64_t begin, int64_t end, std::string_view prefix, bool non_negative,
                     bool increasing, const int64_t* previous = nullptr);

// Packed sequences: cu_seqlens null means one sequence of all tokens (batch must be 1); otherwise [batch + 1]
// non-decreasing offsets from 0 to tokens.
void check_sequences(const int64_t* cu_seqlens, int64_t batch, int64_t tokens);

void check_dtype(DType t, std::string_view field = "dtype");

// The position mode, its frequencies (whose head_dim must be `head_dim`, described as `head_dim_what`), window,
// leaky k, RoPER and log-n, as attention.h defines them; shared by attention and the KV cache.
void check_position_params(const PositionParams& pos, int head_dim, std::string_view head_dim_what);

// `threads` as every Params struct takes it: 0 means all OpenMP threads; at most kMaxThreads.
inline constexpr int kMaxThreads = 4096;
void check_threads(int threads);

// An attention backward with no tokens still owes the T5 table its gradient: zeros (no-op for other kinds).
void clear_t5_gradient(const AttentionGradParams& g);

}  // namespace rotary::detail
