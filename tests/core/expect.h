// tests/core/expect.h: gtest helpers every core suite shares (op_harness.h stays free of gtest).
//   expect_error        - a call throws rotary::Error whose message contains every given part
//   expect_error_naming - ... naming a field the way rotary::check does ("field = value")
//   for_each_target     - a body run once per SIMD target compiled in and supported here
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "rotary/error.h"
#include "simd_targets.h"

namespace rotary::test {

// (An initializer_list, not a vector: {"a", "b"} would also make a std::string from two pointers.)
inline void expect_error(const std::function<void()>& call, std::initializer_list<std::string> parts) {
  try {
    call();
    ADD_FAILURE() << "no rotary::Error; expected one naming " << (parts.size() ? *parts.begin() : "");
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}
inline void expect_error(const std::function<void()>& call, const std::string& part) {
  expect_error(call, {part});
}
inline void expect_error_naming(const std::function<void()>& call, const std::string& field) {
  expect_error(call, field + " = ");
}

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
