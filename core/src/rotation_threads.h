// core/src/rotation_threads.h (internal): how many OpenMP threads a rotation over tokens takes - the one rule of
// rope_apply (rope_kernels_hwy.cpp) and rope_table_apply (rope_table_hwy.cpp).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace rotary::detail {

// Threads only pay off when each has enough to do: below this many elements per thread, fork/join (about a
// microsecond here) costs more than it saves. Measured on the 2-core CI machine (32 heads x 128, f32): 2 threads
// break even at 4 tokens (16K elements) and win from 8 tokens. The decode shape (1 token) never forks.
inline constexpr double kMinElementsPerThread = 12288;

// `requested`: the Params' threads field (0: omp_get_max_threads()). At most one thread per token.
inline int64_t rotation_threads(int requested, int64_t tokens, double elements) {
  int64_t threads = std::min<int64_t>(requested > 0 ? requested : omp_get_max_threads(), tokens);
  return std::min<int64_t>(threads, int64_t(elements / kMinElementsPerThread));
}

}  // namespace rotary::detail
