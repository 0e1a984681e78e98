// Learning-rate schedule: linear warm-up, then cosine decay to the floor. The expected values are properties of
// the schedule's definition (endpoints, midpoint of the cosine, monotonicity), not numbers copied from a run.
#include <gtest/gtest.h>

#include <cmath>

#include "train/schedule.h"

namespace rotary::train {
namespace {

TEST(LrSchedule, WarmupRisesLinearlyToPeak) {
  const LrSchedule s{2e-3, 10, 110, 0.1};
  for (int64_t k = 0; k < 10; ++k) EXPECT_DOUBLE_EQ(s.at(k), 2e-3 * static_cast<double>(k + 1) / 10.0) << k;
  EXPECT_DOUBLE_EQ(s.at(9), 2e-3);  // the last warm-up step reaches the peak
}

TEST(LrSchedule, CosineGoesFromPeakToFloorThroughTheMidpoint) {
  // 10 warm-up steps, then 101 decay steps: t = (k - 10) / 100, so k = 60 is t = 0.5 and k = 110 is t = 1.
  const LrSchedule s{1e-3, 10, 111, 0.2};
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);
  EXPECT_NEAR(s.at(60), 0.5 * (1e-3 + 2e-4), 1e-18);
  EXPECT_DOUBLE_EQ(s.at(110), 2e-4);
  for (int64_t k = 11; k <= 110; ++k) EXPECT_LT(s.at(k), s.at(k - 1)) << k;
  // Past the end (a run extended by hand) the rate stays at the floor rather than rising again.
  EXPECT_DOUBLE_EQ(s.at(500), 2e-4);
}

TEST(LrSchedule, NoWarmupStartsAtPeak) {
  const LrSchedule s{5e-4, 0, 50, 0.0};
  EXPECT_DOUBLE_EQ(s.at(0), 5e-4);
  EXPECT_NEAR(s.at(49), 0.0, 1e-20);
}

TEST(LrSchedule, ShortRunsNeverDivideByZero) {
  for (int64_t total : {1, 2}) {
    const LrSchedule s{1e-3, 1, total, 0.1};
    for (int64_t k = 0; k < total; ++k) EXPECT_TRUE(std::isfinite(s.at(k)) && s.at(k) > 0) << total << " " << k;
  }
}

}  // namespace
}  // namespace rotary::train
