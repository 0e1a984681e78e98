// core/src/validate.h: the one rule set for strided views, positions, packed sequences and threads that every
// kernel's Params go through. Accepts every non-overlapping layout (heads outermost included, size-1 dims with any
// stride) and names the field, the value and the rule when it refuses.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "expect.h"
#include "rotary/error.h"
#include "validate.h"

namespace rotary {
namespace {

using detail::check_view;
using test::expect_error;

float buf[4];  // any non-null address: check_view never dereferences

HeadsView view(int64_t heads, int64_t token_stride, int64_t head_stride) { return {buf, heads, token_stride, head_stride}; }

TEST(validate_view, AcceptsEveryNonOverlappingLayout) {
  const int64_t T = 5, H = 3, D = 8;
  EXPECT_NO_THROW(check_view(view(H, H * D, D), "q", T, D));                // [T, H, D]
  EXPECT_NO_THROW(check_view(view(H, D, T * D), "q", T, D));                // [H, T, D]: [1, H, S, D] transposed
  EXPECT_NO_THROW(check_view(view(H, H * (D + 3) + 5, D + 3), "q", T, D));  // padded heads and tokens
  EXPECT_NO_THROW(check_view(view(H, 3 * H * D, D), "q", T, D));            // a slice of a fused qkv row
  EXPECT_NO_THROW(check_view(view(H, D + 1, T * (D + 1)), "q", T, D));      // head-major with padded rows
  // A dim of size 1 never steps: any stride, even 0 or negative.
  EXPECT_NO_THROW(check_view(view(H, -7, D), "q", 1, D));
  EXPECT_NO_THROW(check_view(view(H, 0, D), "q", 1, D));
  EXPECT_NO_THROW(check_view(view(1, D, 0), "q", T, D));
  EXPECT_NO_THROW(check_view(view(1, D, -3), "q", T, D));
  EXPECT_NO_THROW(check_view(view(1, 0, 0), "q", 1, D));
  EXPECT_NO_THROW(check_view(view(H, 0, D), "q", 0, D));  // no tokens at all
}

TEST(validate_view, RefusesOverlapNamingTheStrideAndTheBound) {
  const int64_t T = 5, H = 3, D = 8;
  expect_error([&] { check_view(view(H, H * D, D - 1), "q", T, D); }, {"q.head_stride = 7", ">= the row length 8"});
  expect_error([&] { check_view(view(H, H * D - 1, D), "q", T, D); }, {"q.token_stride = 23", ">= 24", "overlap"});
  expect_error([&] { check_view(view(H, D, T * D - 1), "q", T, D); }, {"q.head_stride = 39", ">= 40"});
  expect_error([&] { check_view(view(H, D, D), "k", T, D); }, {"k.", "overlap"});  // equal strides
  expect_error([&] { check_view(view(H, 0, D), "v", T, D); }, {"v.token_stride = 0"});
  expect_error([&] { check_view(view(H, H * D, 0), "v", T, D); }, {"v.head_stride = 0"});
  expect_error([&] { check_view(view(H, -24, D), "o", T, D); }, {"o.token_stride = -24", ">= 0"});
  expect_error([&] { check_view(view(1, D - 1, 0), "o", T, D); }, {"o.token_stride = 7", ">= the row length 8"});
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2;
  expect_error([&] { check_view(view(H, huge, D), "q", T, D); }, {"q.token_stride", "2^63"});
  expect_error([&] { check_view(view(H, D, huge), "q", T, D); }, {"q.head_stride", "2^63"});
}

TEST(validate_view, RefusesNullDataAndWrongHeads) {
  expect_error([] { check_view({nullptr, 2, 16, 8}, "dq", 3, 8); }, {"dq.data = null"});
  expect_error([] { check_view(view(0, 16, 8), "dq", 3, 8); }, {"dq.heads = 0", ">= 1"});
  expect_error([] { check_view(view(2, 16, 8), "o", 3, 8, 4, "q.heads"); }, {"o.heads = 2", "q.heads = 4"});
  EXPECT_NO_THROW(check_view(view(4, 32, 8), "o", 3, 8, 4, "q.heads"));
}

TEST(validate_positions, RangeSignAndOrder) {
  const int64_t lim = detail::kMaxAbsPosition;
  std::vector<int64_t> p{0, 5, 5, 9};
  EXPECT_NO_THROW(detail::check_positions(p.data(), 0, 4, "", false, false));
  expect_error([&] { detail::check_positions(p.data(), 0, 4, "", false, true); },
               {"positions[2] = 5", "> positions[1] = 5"});
  EXPECT_NO_THROW(detail::check_positions(p.data(), 2, 4, "", false, true));  // each range on its own
  const int64_t last = 5;
  expect_error([&] { detail::check_positions(p.data(), 2, 4, "cache: ", false, true, &last); },
               {"cache: positions[2] = 5", "last cached position 5"});
  std::vector<int64_t> far{-lim, lim, lim + 1};
  EXPECT_NO_THROW(detail::check_positions(far.data(), 0, 2, "", false, true));
  expect_error([&] { detail::check_positions(far.data(), 0, 3, "", false, false); }, {"positions[2]", "2^53"});
  std::vector<int64_t> neg{-1, 0};
  expect_error([&] { detail::check_positions(neg.data(), 0, 2, "", true, false); }, {"positions[0] = -1", ">= 0"});
}

TEST(validate_sequences, OffsetsFromZeroToTokensNonDecreasing) {
  std::vector<int64_t> cu{0, 3, 3, 7};
  EXPECT_NO_THROW(detail::check_sequences(cu.data(), 3, 7));
  EXPECT_NO_THROW(detail::check_sequences(nullptr, 1, 7));
  expect_error([] { detail::check_sequences(nullptr, 2, 7); }, {"batch = 2", "cu_seqlens is null"});
  expect_error([&] { detail::check_sequences(cu.data(), 0, 7); }, {"batch = 0"});
  expect_error([&] { detail::check_sequences(cu.data(), 3, 8); }, {"cu_seqlens[batch] = 7", "tokens = 8"});
  std::vector<int64_t> down{0, 4, 3, 7};
  expect_error([&] { detail::check_sequences(down.data(), 3, 7); }, {"cu_seqlens[2] = 3", ">= cu_seqlens[1] = 4"});
  std::vector<int64_t> late{1, 4};
  expect_error([&] { detail::check_sequences(late.data(), 1, 4); }, {"cu_seqlens[0] = 1"});
}

TEST(validate_threads, ZeroMeansAllAndTheRangeIsBounded) {
  EXPECT_NO_THROW(detail::check_threads(0));
  EXPECT_NO_THROW(detail::check_threads(detail::kMaxThreads));
  expect_error([] { detail::check_threads(-1); }, {"threads = -1"});
  expect_error([] { detail::check_threads(100000); }, {"threads = 100000", "4096"});
}

}  // namespace
}  // namespace rotary
