// core/src/stealing_ranges.h: how linear_forward's threads share their row groups - every item of every round taken
// exactly once whatever the team, a thread's own runs from its static range's front, and a slow thread's items taken
// over by the others.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "stealing_ranges.h"

namespace rotary {
namespace {

// Runs `team` threads over `rounds` rounds of `items` split for `slots` threads; counts of each (round, item) taken,
// items taken per thread, and whether every run was within [0, items) and non-empty.
struct Taken {
  std::vector<std::atomic<int>> count;
  std::vector<int64_t> per_thread;
  bool runs_ok = true;
};
void Share(int64_t items, int slots, int team, int64_t rounds, Taken& taken, int slow_thread = -1) {
  detail::StealingRanges ranges(items, slots, rounds);
  taken.count = std::vector<std::atomic<int>>(size_t(items * rounds));
  taken.per_thread.assign(size_t(team), 0);
  std::atomic<bool> runs_ok{true};
#pragma omp parallel num_threads(team)
  {
    const int me = omp_get_thread_num();
    for (int64_t r = 0; r < rounds; ++r)
      for (int64_t b, e; ranges.next(r, me, b, e);) {
        if (!(0 <= b && b < e && e <= items)) runs_ok = false;
        for (int64_t i = b; i < e; ++i) {
          taken.count[size_t(r * items + i)].fetch_add(1);
          if (me == slow_thread) std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        taken.per_thread[size_t(me)] += e - b;
      }
  }
  taken.runs_ok = runs_ok;
}

void ExpectEachOnce(const Taken& taken) {
  EXPECT_TRUE(taken.runs_ok);
  int64_t wrong = 0;
  for (const auto& c : taken.count) wrong += c.load() != 1;
  EXPECT_EQ(wrong, 0) << "items taken other than once";
}

TEST(stealing_ranges, EveryItemOfEveryRoundOnceForAnyTeam) {
  for (int64_t items : {0, 1, 3, 7, 64, 1001}) {
    for (int slots : {1, 2, 3, 8}) {
      for (int team : {1, 2, 4}) {
        if (team > slots) continue;  // RunJobs asks for at most `slots` threads
        SCOPED_TRACE(testing::Message() << items << " items, " << slots << " slots, team " << team);
        Taken taken;
        Share(items, slots, team, 3, taken);
        ExpectEachOnce(taken);
      }
    }
  }
}

TEST(stealing_ranges, OwnRunsComeFromTheStaticRangesFront) {
  // One thread, two slots: its own runs first, in order from 0 up to 50 (schedule(static)'s first half), an eighth of
  // what is left each time; then slot 1's items from its back, half at a time.
  detail::StealingRanges ranges(100, 2);
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t b, e; ranges.next(0, 0, b, e);) runs.emplace_back(b, e);
  ASSERT_GE(runs.size(), 3u);
  EXPECT_EQ(runs[0], std::make_pair(int64_t(0), int64_t(6)));  // 50 / 8
  int64_t at = 0;
  size_t k = 0;
  for (; k < runs.size() && runs[k].first == at && at < 50; ++k) at = runs[k].second;
  EXPECT_EQ(at, 50);
  ASSERT_LT(k, runs.size());
  EXPECT_EQ(runs[k], std::make_pair(int64_t(75), int64_t(100)));  // the back half of slot 1's [50, 100)
}

TEST(stealing_ranges, TheOthersTakeOverASlowThreadsItems) {
  // Thread 0 sleeps on each item; thread 1, done with its own half at once, takes the back of thread 0's, so
  // thread 0 ends with well under its static half.
  Taken taken;
  Share(400, 2, 2, 1, taken, 0);
  ExpectEachOnce(taken);
  EXPECT_LT(taken.per_thread[0], 100) << "thread 1 took " << taken.per_thread[1];
}

TEST(stealing_ranges, RefusesCountsPastThirtyTwoBits) {
  EXPECT_THROW(detail::StealingRanges(int64_t(1) << 32, 2), std::length_error);
  EXPECT_THROW(detail::StealingRanges(-1, 2), std::length_error);
}

}  // namespace
}  // namespace rotary
