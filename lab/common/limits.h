// lab/common/limits.h: the bounds on work a user controls that several parts of the lab check (the flags, the run
// config's validate(), the experiments), each stated once.
#pragma once

#include <cstdint>

#include "rotary_nn/limits.h"

namespace rotary::lab {

constexpr int64_t kMaxThreads = 4096;             // torch / OpenMP threads of one process
using nn::kMaxSequenceLength;                     // tokens of one row (training, eval, generation)
constexpr int64_t kMaxBatchTokens = int64_t(1) << 26;  // batch_size x seq_len: one step's rows are made at once
constexpr int64_t kMaxHeldOutRows = (int64_t(1) << 31) - 1;  // eval_batches x batch_size (counted in an int)

}  // namespace rotary::lab
