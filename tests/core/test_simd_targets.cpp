// core/src/simd_targets.cpp: the ROTARY_SIMD_TARGET ceiling that lets one machine run the code paths of smaller
// CPUs (scripts/test.sh runs the kernel suites under avx2, sse4 and scalar), its parser, and that the ceiling
// really reaches dispatch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <hwy/targets.h>

#include "rotary/activations.h"
#include "rotary/error.h"
#include "rotary/rope.h"
#include "simd_targets.h"

namespace rotary {
namespace {

TEST(simd_targets, ParsesNamesAndAliases) {
  const std::vector<int64_t> avail = {HWY_AVX3, HWY_AVX2, HWY_SSE4, HWY_EMU128};
  EXPECT_EQ(detail::parse_simd_target("best", avail), 0);
  EXPECT_EQ(detail::parse_simd_target("avx512", avail), HWY_AVX3);
  EXPECT_EQ(detail::parse_simd_target("AVX3", avail), HWY_AVX3);
  EXPECT_EQ(detail::parse_simd_target("avx2", avail), HWY_AVX2);
  EXPECT_EQ(detail::parse_simd_target("Sse4", avail), HWY_SSE4);
  EXPECT_EQ(detail::parse_simd_target("scalar", avail), HWY_EMU128);
}

TEST(simd_targets, RefusesUnknownOrUnsupportedNames) {
  const std::vector<int64_t> avx2_machine = {HWY_AVX2, HWY_SSE4, HWY_EMU128};
  for (const char* bad : {"avx9", "neon", "avx512", "avx3"}) {
    try {
      detail::parse_simd_target(bad, avx2_machine);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("ROTARY_SIMD_TARGET"), std::string::npos) << msg;
      EXPECT_NE(msg.find(bad), std::string::npos) << msg;
      EXPECT_NE(msg.find("avx2"), std::string::npos) << msg;  // names what is allowed
    }
  }
}

// Under a ceiling (as scripts/test.sh sets it) the best allowed target is the ceiling itself, and the rotation
// kernel dispatches to it; without one, dispatch uses the best compiled target. Either way the test can fail.
TEST(simd_targets, CeilingFromTheEnvironmentReachesDispatch) {
  const std::vector<int64_t> targets = detail::simd_targets();
  ASSERT_FALSE(targets.empty());
  const int64_t ceiling = detail::simd_target_ceiling();
  const char* env = std::getenv("ROTARY_SIMD_TARGET");
  std::printf("ROTARY_SIMD_TARGET=%s: dispatch to %s\n", env ? env : "(unset)", rope_simd_target());
  if (ceiling != 0) {
    EXPECT_EQ(targets.front(), ceiling);
    for (int64_t t : targets) EXPECT_GE(t, ceiling) << detail::simd_target_name(t);  // nothing better
  }
  EXPECT_STREQ(rope_simd_target(), detail::simd_target_name(targets.front()));
  // force_simd_target(0) returns to the ceiling, not past it.
  detail::force_simd_target(targets.back());
  EXPECT_STREQ(rope_simd_target(), detail::simd_target_name(targets.back()));
  detail::force_simd_target(0);
  EXPECT_STREQ(rope_simd_target(), detail::simd_target_name(targets.front()));
}

// Every kernel file is compiled for the same targets (the one policy in core/CMakeLists.txt), so forcing any target
// simd_targets() lists runs that target's code in each of them; a kernel compiled for fewer targets would fall back
// to another one here (attention used to run its scalar fallback under sse4).
TEST(simd_targets, EveryKernelRunsEveryListedTarget) {
  const std::vector<int64_t> targets = detail::simd_targets();
  ASSERT_FALSE(targets.empty());
  for (int64_t t : targets) {
    const std::string want = detail::simd_target_name(t);
    detail::force_simd_target(t);
    EXPECT_EQ(rope_simd_target(), want);
    EXPECT_EQ(detail::angles_simd_target(), want);
    EXPECT_EQ(detail::decode_simd_target(), want);
    EXPECT_EQ(detail::attention_forward_simd_target(), want);
    EXPECT_EQ(detail::attention_backward_simd_target(), want);
    EXPECT_EQ(detail::linear_simd_target(), want);
    EXPECT_EQ(detail::activations_simd_target(), want);
  }
  detail::force_simd_target(0);
}

}  // namespace
}  // namespace rotary
