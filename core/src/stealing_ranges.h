// core/src/stealing_ranges.h (internal): how a team of threads shares [0, items) work items (linear_forward's row
// groups, linear_hwy.cpp's RunJobs) so that each thread's share stays one contiguous run and no thread waits for a
// slower one. Each thread starts with the range OpenMP's schedule(static) would give it and takes runs from its front;
// a thread whose range is empty takes the back half of what the thread with the most left still has. On a shared
// machine one core is often slower for a while (another guest on its sibling, an interrupt): a static split then
// makes every call wait for it at the barrier, and handing items out one by one (schedule(dynamic)) breaks the
// weight streams into pieces (docs/gguf.md: tried on Zen 4, decode slower). Which thread computes an item changes no
// result: the items are independent.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace rotary::detail {

class StealingRanges {
 public:
  // [0, items) split into `threads` ranges as schedule(static) splits it, once per round (rounds: independent
  // passes over the same items, e.g. token chunks; a thread goes on to the next round without waiting). A team
  // smaller than `threads` still covers every range: the ranges nobody owns are taken from the back.
  StealingRanges(int64_t items, int threads, int64_t rounds = 1)
      : threads_(std::max(threads, 1)), slots_(size_t(threads_ * std::max<int64_t>(rounds, 1))) {
    if (items < 0 || items > int64_t(UINT32_MAX))
      throw std::length_error("StealingRanges: items must be in [0, 2^32)");
    const int64_t per = (items + threads_ - 1) / threads_;
    for (size_t s = 0; s < slots_.size(); ++s) {
      const int64_t t = int64_t(s % size_t(threads_));
      const int64_t begin = std::min(items, t * per), end = std::min(items, begin + per);
      slots_[s].word.store(Pack(uint32_t(begin), uint32_t(end)), std::memory_order_relaxed);
    }
  }

  // The next run [begin, end) of round `round` for thread `me` (< threads): from the front of its own range -
  // an eighth of what it has left, so that little is out of reach of a thief near the end -, or else the back half
  // of the largest range left. False when every range of the round is empty.
  bool next(int64_t round, int me, int64_t& begin, int64_t& end) {
    Slot* slots = slots_.data() + round * threads_;
    std::atomic<uint64_t>& own = slots[me].word;
    uint64_t word = own.load(std::memory_order_relaxed);
    while (Front(word) < Back(word)) {
      const uint32_t take = std::max<uint32_t>(1, (Back(word) - Front(word)) / kOwnShare);
      if (own.compare_exchange_weak(word, Pack(Front(word) + take, Back(word)), std::memory_order_acq_rel,
                                    std::memory_order_relaxed)) {
        begin = Front(word), end = Front(word) + take;
        return true;
      }
    }
    for (;;) {
      int victim = -1;
      uint32_t most = 0;
      for (int t = 0; t < threads_; ++t) {
        const uint64_t w = slots[t].word.load(std::memory_order_relaxed);
        if (Front(w) < Back(w) && Back(w) - Front(w) > most) victim = t, most = Back(w) - Front(w);
      }
      if (victim < 0) return false;
      std::atomic<uint64_t>& theirs = slots[victim].word;
      uint64_t w = theirs.load(std::memory_order_relaxed);
      while (Front(w) < Back(w)) {
        const uint32_t take = (Back(w) - Front(w) + 1) / 2;
        if (theirs.compare_exchange_weak(w, Pack(Front(w), Back(w) - take), std::memory_order_acq_rel,
                                         std::memory_order_relaxed)) {
          begin = Back(w) - take, end = Back(w);
          return true;
        }
      }
    }
  }

 private:
  static constexpr uint32_t kOwnShare = 8;
  // A range as one word, so that its owner's and a thief's takes are one compare-exchange each: front in the low
  // 32 bits, back in the high.
  static uint64_t Pack(uint32_t front, uint32_t back) { return uint64_t(back) << 32 | front; }
  static uint32_t Front(uint64_t w) { return uint32_t(w); }
  static uint32_t Back(uint64_t w) { return uint32_t(w >> 32); }

  struct alignas(64) Slot {  // a cache line each: the owner's takes do not contend with the others' slots
    std::atomic<uint64_t> word{0};
  };
  int threads_;
  std::vector<Slot> slots_;
};

}  // namespace rotary::detail
