// lab/train/schedule.h: the learning-rate schedule - linear warm-up, then cosine decay to a floor (torch-free).
#pragma once

#include <cstdint>

namespace rotary::train {

struct LrSchedule {
  double peak_lr = 1e-3;
  int64_t warmup_steps = 0;   // steps 0 .. warmup-1 ramp linearly up to peak_lr
  int64_t total_steps = 1;    // the cosine reaches the floor at the last step
  double min_lr_ratio = 0.1;  // floor = peak_lr * min_lr_ratio

  // The rate for 0-based step `step`: warm-up (step+1)/warmup * peak, so the first step is not wasted at 0;
  // afterwards floor + (peak - floor) * (1 + cos(pi * t)) / 2 with t going 0 -> 1 over the remaining steps.
  double at(int64_t step) const;
};

}  // namespace rotary::train
