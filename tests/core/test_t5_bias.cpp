// rotary/t5_bias.h: T5's relative position buckets against values computed independently (the table for
// causal T5 defaults, and Hugging Face's formula worked by hand for the bidirectional case), and bad settings.
#include <gtest/gtest.h>

#include "expect.h"
#include "rotary/t5_bias.h"

namespace rotary {
namespace {

TEST(t5_buckets, CausalDefaultsMatchTheTable) {
  // distance -> bucket with 32 buckets, max_distance 128: exact below 16, then 16 + floor(16 log8(n / 16)).
  const std::pair<int64_t, int> table[] = {{0, 0},   {1, 1},   {7, 7},   {12, 12},  {15, 15},   {16, 16},
                                           {32, 21}, {64, 26}, {127, 31}, {128, 31}, {100000, 31}};
  for (const auto& [distance, bucket] : table)
    EXPECT_EQ(t5_relative_bucket(/*query_pos=*/1000 + distance, /*key_pos=*/1000, false, 32, 128), bucket) << distance;
  // A key after its query: bucket 0 however far.
  for (int64_t ahead : {1, 5, 200}) EXPECT_EQ(t5_relative_bucket(10, 10 + ahead, false, 32, 128), 0) << ahead;
}

TEST(t5_buckets, BucketsGrowMonotonicallyAndCoverTheRange) {
  int last = -1;
  for (int64_t d = 0; d < 300; ++d) {
    const int b = t5_relative_bucket(d, 0, false, 32, 128);
    EXPECT_GE(b, last) << d;
    EXPECT_LE(b - last, 1) << d;  // no bucket skipped: each is reached
    last = b;
  }
  EXPECT_EQ(last, 31);
}

TEST(t5_buckets, BidirectionalSplitsTheBucketsByDirection) {
  // 32 buckets both ways: 16 per direction, exact below 8; n = 16 -> 8 + floor(ln 2 / ln 16 * 8) = 10;
  // keys after the query are offset by 16.
  EXPECT_EQ(t5_relative_bucket(5, 5, true, 32, 128), 0);
  EXPECT_EQ(t5_relative_bucket(12, 5, true, 32, 128), 7);
  EXPECT_EQ(t5_relative_bucket(5, 12, true, 32, 128), 16 + 7);
  EXPECT_EQ(t5_relative_bucket(21, 5, true, 32, 128), 10);
  EXPECT_EQ(t5_relative_bucket(5, 21, true, 32, 128), 16 + 10);
  EXPECT_EQ(t5_relative_bucket(1000, 0, true, 32, 128), 15);
  EXPECT_EQ(t5_relative_bucket(0, 1000, true, 32, 128), 31);
}

TEST(t5_buckets, BadSettingsAreNamed) {
  EXPECT_NO_THROW(validate_t5_buckets(32, 128, false));
  test::expect_error([] { validate_t5_buckets(1, 128, false); }, {"t5_num_buckets = 1", "[2, 4096]"});
  test::expect_error([] { validate_t5_buckets(31, 128, true); }, {"t5_num_buckets = 31", "even"});
  test::expect_error([] { validate_t5_buckets(32, 16, false); }, {"t5_max_distance = 16", "> 16"});
  EXPECT_NO_THROW(validate_t5_buckets(32, 9, true));  // 8 exact buckets per direction
}

}  // namespace
}  // namespace rotary
