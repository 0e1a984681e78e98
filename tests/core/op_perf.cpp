// core_op_perf: the perf mode of the op-case harness (op_harness.h), like ggml's `test-backend-ops -m perf`.
// Times each case's fast path at every SIMD target against its float64 reference and prints one row per
// (case, target):
//   core_op_perf [FILTER] [MIN_SECONDS]
// FILTER picks the cases whose "op/name" contains it (e.g. "rope/f32_half_split_D128", "decode/", default all);
// MIN_SECONDS is the least time spent per measurement (default 0.05). ROTARY_SIMD_TARGET caps the targets.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "op_harness.h"
#include "simd_targets.h"

int main(int argc, char** argv) {
  const std::string filter = argc > 1 ? argv[1] : "";
  const double min_seconds = argc > 2 ? std::atof(argv[2]) : 0.05;
  if (argc > 3 || !(min_seconds > 0)) {
    std::fprintf(stderr, "usage: %s [FILTER] [MIN_SECONDS > 0]\n", argv[0]);
    return 2;
  }
  const auto cases = rotary::test::select_cases(filter);
  if (cases.empty()) {
    std::fprintf(stderr, "no case matches \"%s\"\n", filter.c_str());
    return 1;
  }
  rotary::test::perf_table(cases, rotary::detail::simd_targets(), min_seconds, std::cout);
  return 0;
}
