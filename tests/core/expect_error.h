// tests/core/expect_error.h: the error checks every suite shares (free of the core's test internals, so the
// nn, lab and train suites include it too).
//   expect_error        - a call throws rotary::Error whose message contains every given part
//   expect_error_naming - ... naming a field the way rotary::check does ("field = value")
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "rotary/error.h"

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

}  // namespace rotary::test
