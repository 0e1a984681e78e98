// core/src/simd_targets.h (internal): which Highway targets the kernels were compiled for, the switch that lets
// tests run every compiled target on this CPU (not only the best one runtime dispatch picks), and the process-wide
// ceiling set by the environment variable ROTARY_SIMD_TARGET.
//
// ROTARY_SIMD_TARGET=<name> caps runtime dispatch of every Highway kernel in the process at that target, so a
// machine with AVX-512 runs the AVX2, SSE4 or scalar code a smaller CPU would run (scripts/test.sh runs the
// kernel-using suites that way). Names: best (no cap), avx512 (= Highway's AVX3), avx2, sse4, scalar (the
// portable fallback), or any Highway target name such as AVX3_DL or EMU128, in any case. An unknown name, or a
// target this CPU lacks, stops the process at load with exit code 2 and a message naming the variable, the value
// and what is allowed: a test run must never silently run on another target than asked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rotary::detail {

// Targets (Highway bit values) compiled into rotary_core, supported by this CPU and allowed by
// ROTARY_SIMD_TARGET, best first.
std::vector<int64_t> simd_targets();
// Restricts runtime dispatch to `target` (one of simd_targets()); 0 returns to the best allowed target. Tests
// only: it changes process-wide state shared by every Highway kernel.
void force_simd_target(int64_t target);
const char* simd_target_name(int64_t target);
// Tests only: whether the block formats' byte products may run on AVX-VNNI at AVX2 targets of a CPU that has it
// (default true); false runs them on AVX2's vpmaddubsw there instead, so such a CPU tests both kernels. Process-wide,
// as force_simd_target.
void allow_avx_vnni(bool allowed);
bool avx_vnni_allowed();

// The Highway target each kernel file dispatches to now (a name, as simd_target_name), so a test can check that every
// kernel runs every target simd_targets() lists instead of quietly falling back to a target it was compiled for.
// The rotation kernel's is the public rotary::rope_simd_target().
const char* angles_simd_target();
const char* decode_simd_target();
const char* attention_forward_simd_target();
const char* attention_backward_simd_target();
const char* linear_simd_target();

// The target ROTARY_SIMD_TARGET caps dispatch at (a Highway bit), or 0 when it is unset or "best".
int64_t simd_target_ceiling();
// Parses a ROTARY_SIMD_TARGET value against the targets compiled and supported here (`available`, Highway bits).
// Returns the Highway bit, 0 for "best"; throws rotary::Error naming the variable, the value and the allowed names.
int64_t parse_simd_target(const std::string& value, const std::vector<int64_t>& available);

}  // namespace rotary::detail
