// The op-case runner: every case of every op (cases_*.cpp) in each mode of the harness (op_harness.h). CMake
// registers one ctest test per (mode, op) with a gtest filter; one case alone:
//   core_test_ops --gtest_filter='*/rope_f32_half_split_D128*'
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "op_harness.h"
#include "rotary/error.h"
#include "simd_targets.h"

namespace rotary::test {
namespace {

std::vector<OpCase*> cases_where(const std::function<bool(const OpCase&)>& keep) {
  std::vector<OpCase*> out;
  for (OpCase* c : select_cases(""))
    if (keep(*c)) out.push_back(c);
  return out;
}

std::string param_name(const testing::TestParamInfo<OpCase*>& info) {
  return info.param->op() + "_" + info.param->name();
}

void expect_none(const std::vector<std::string>& failures) {
  for (const std::string& f : failures) ADD_FAILURE() << f;
}

// compare: fast vs float64 reference at every SIMD target this build and CPU have (capped by ROTARY_SIMD_TARGET).
class op_compare : public testing::TestWithParam<OpCase*> {};
TEST_P(op_compare, FastMatchesReferenceOnEveryTarget) {
  ASSERT_FALSE(detail::simd_targets().empty());
  // The worst error of each output over its bound, across targets, goes to the test report
  // (--gtest_output=json, properties "<output>_over_tol") to show the margin to each tolerance.
  std::map<std::string, double> worst;
  expect_none(compare_at_targets(*GetParam(), detail::simd_targets(), [&](int64_t, const Output& o) {
    worst[o.name] = std::max(worst[o.name], error_over_bound(o));
  }));
  for (const auto& [name, ratio] : worst) RecordProperty(name + "_over_tol", to_text(ratio));
}
INSTANTIATE_TEST_SUITE_P(All, op_compare, testing::ValuesIn(cases_where([](const OpCase&) { return true; })),
                         param_name);

// nonfinite: a NaN, then an Inf, in one input element at a time (cases with poison sites of that kind).
struct NonFiniteParam {
  OpCase* c;
  NonFinite kind;
};
std::vector<NonFiniteParam> nonfinite_params() {
  std::vector<NonFiniteParam> out;
  for (NonFinite kind : {NonFinite::NaN, NonFinite::Inf})
    for (OpCase* c : cases_where([kind](const OpCase& c) { return !c.poison_sites(kind).empty(); }))
      out.push_back({c, kind});
  return out;
}
class op_nonfinite : public testing::TestWithParam<NonFiniteParam> {};
TEST_P(op_nonfinite, NonFiniteWhereTheReferenceIs) {
  expect_none(nonfinite_parity(*GetParam().c, GetParam().kind, detail::simd_targets()));
}
INSTANTIATE_TEST_SUITE_P(All, op_nonfinite, testing::ValuesIn(nonfinite_params()),
                         [](const testing::TestParamInfo<NonFiniteParam>& info) {
                           return info.param.c->op() + "_" + info.param.c->name() +
                                  (info.param.kind == NonFinite::NaN ? "_nan" : "_inf");
                         });

// gradient: both backward passes against central differences of the float64 reference (best target: the
// compare mode covers the kernel's backward on every target).
class op_gradient : public testing::TestWithParam<OpCase*> {};
TEST_P(op_gradient, BackwardMatchesCentralDifferences) { expect_none(gradient_check(*GetParam())); }
INSTANTIATE_TEST_SUITE_P(All, op_gradient,
                         testing::ValuesIn(cases_where([](const OpCase& c) { return c.finite_differences(); })),
                         param_name);

// The registry itself: names are identifiers, unique, and every op the harness knows has cases in each mode
// it promises.
TEST(op_cases, NamesAreUniqueIdentifiersAndEveryOpHasCases) {
  std::set<std::string> names, ops;
  for (OpCase* c : select_cases("")) {
    const std::string full = c->op() + "_" + c->name();
    EXPECT_EQ(identifier(full), full);
    EXPECT_TRUE(names.insert(full).second) << "duplicate case " << full;
    ops.insert(c->op());
  }
  for (const char* op : {"rope", "attention_forward", "attention_backward", "decode", "linear_attention_forward",
                         "linear_attention_backward"})
    EXPECT_TRUE(ops.count(op)) << op;
  std::set<std::string> gradient_ops, nan_ops;
  for (OpCase* c : select_cases("")) {
    if (c->finite_differences()) gradient_ops.insert(c->op());
    if (!c->poison_sites(NonFinite::NaN).empty()) nan_ops.insert(c->op());
  }
  EXPECT_EQ(gradient_ops, (std::set<std::string>{"attention_backward", "linear_attention_backward"}));
  for (const char* op : {"rope", "attention_forward", "decode", "linear_attention_forward"})
    EXPECT_TRUE(nan_ops.count(op)) << op;
}

// The harness can fail: a wrong output, a NaN where the reference has none and a stray write are all caught.
TEST(op_cases, HarnessCatchesWhatItClaimsTo) {
  const Tolerance tol = tolerance(Quantity::AttentionOutput, {.dtype = DType::F32});
  EXPECT_EQ(check_output({"o", {1.0, 2.0}, {1.0, 2.0}, tol}), "");
  EXPECT_NE(check_output({"o", {1.0, 2.001}, {1.0, 2.0}, tol}), "");
  EXPECT_NE(check_output({"o", {1.0, NAN}, {1.0, 2.0}, tol}), "");
  EXPECT_NE(check_output({"o", {1e-9}, {0.0}, tol}), "");  // noise against an exact zero, no floor: fails
  EXPECT_EQ(check_output({"o", {1e-9}, {0.0}, {Metric::Nmse, tol.bound, 1.0}}), "");  // with the floor: passes
  EXPECT_NE(check_output({"x", {1.0 + 1e-6}, {1.0}, tolerance(Quantity::RopeElement, {.dtype = DType::F32})}), "");
  WatchedBuffer b("b", DType::F32, 8);
  fill_uniform(b, 1);
  b.allow_writes({b.data(), 1, 4, 4}, 1, 2);  // elements 0 and 1
  b.snapshot();
  b.set(1, 5.0);
  EXPECT_EQ(b.violations(), "");
  b.set(2, 5.0);
  EXPECT_NE(b.violations(), "");
  b.restore();
  EXPECT_EQ(b.violations(), "");
}

}  // namespace
}  // namespace rotary::test
