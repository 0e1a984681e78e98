// lab/train/schedule.cpp
#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace rotary::train {

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const double floor_lr = peak_lr * min_lr_ratio;
  const int64_t decay_steps = total_steps - warmup_steps;
  if (decay_steps <= 1) return peak_lr;
  // t = 0 at the first step after warm-up, 1 at the last step.
  const double t = std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps - 1), 0.0, 1.0);
  return floor_lr + (peak_lr - floor_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
}

}  // namespace rotary::train
