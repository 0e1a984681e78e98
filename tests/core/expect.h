// tests/core/expect.h: gtest helpers every core suite shares (op_harness.h stays free of gtest).
//   expect_error, expect_error_naming - from expect_error.h
//   for_each_target - a body run once per SIMD target compiled in and supported here
#pragma once

#include <gtest/gtest.h>

#include "expect_error.h"
#include "simd_targets.h"

namespace rotary::test {

// Runs the body once per SIMD target (detail::simd_targets(), capped by ROTARY_SIMD_TARGET), then restores dispatch.
template <class F>
void for_each_target(F&& body) {
  for (int64_t target : detail::simd_targets()) {
    SCOPED_TRACE(detail::simd_target_name(target));
    detail::force_simd_target(target);
    body();
  }
  detail::force_simd_target(0);
}

}  // namespace rotary::test
