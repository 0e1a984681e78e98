// core/src/simd_targets.h (internal): which Highway targets the rotation kernels were compiled for, and a switch
// that lets tests run every compiled target on this CPU (not only the best one runtime dispatch picks).
#pragma once

#include <cstdint>
#include <vector>

namespace rotary::detail {

// Targets (Highway bit values) compiled into rotary_core and supported by this CPU, best first.
std::vector<int64_t> simd_targets();
// Restricts runtime dispatch to `target` (one of simd_targets()); 0 returns to the best target. Tests only:
// it changes process-wide state shared by every Highway kernel.
void force_simd_target(int64_t target);
const char* simd_target_name(int64_t target);

}  // namespace rotary::detail
