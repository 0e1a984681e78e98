// lab/common/limits.h: the bounds on work a user controls that several parts of the lab check (the flags, the run
// config's validate(), the experiments), each stated once.
#pragma once

#include <cstdint>

namespace rotary::lab {

constexpr int64_t kMaxThreads = 4096;             // torch / OpenMP threads of one process
constexpr int64_t kMaxSequenceLength = 1 << 20;   // tokens of one row (training, eval, generation)

}  // namespace rotary::lab
