// core/src/linear_kernel.h (internal): what linear.cpp hands the Highway kernels of linear_hwy.cpp - a validated
// call with the thread count resolved.
#pragma once

#include <cstdint>

#include "rotary/linear.h"

namespace rotary::linear_detail {

// Activation bytes a prefill chunk keeps in L2 while the weight rows stream past (chunk tokens x cols floats).
inline constexpr int64_t kChunkBytes = 256 * 1024;

struct Job {
  WeightFormat format = WeightFormat::F32;
  const void* w = nullptr;
  int64_t rows = 0, cols = 0, row_stride = 0;
  const float* scales = nullptr;
  int64_t scale_stride = 0;
  const float* bias = nullptr;
  int64_t tokens = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
  bool accumulate = false;
};

// Throws rotary::Error naming the field for params linear_forward does not take (linear.cpp).
void validate(const LinearParams& p);

// Runs `count` jobs as one, their row groups shared among `threads` threads, at the SIMD target dispatch selects.
void run(const Job* jobs, int count, int threads);

}  // namespace rotary::linear_detail
