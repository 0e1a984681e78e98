// tests/core/op_harness.h: one op-case harness for the core kernels, in the manner of ggml's test-backend-ops.
//
// Every kernel-vs-reference check of the core is a case: an OpCase names its op ("rope", "attention_forward",
// ...) and its parameters, builds its inputs, runs the kernel under test at the SIMD target selected now and the
// float64 reference, and hands back named outputs (got, want, tolerance). The runner (test_ops.cpp, core_op_perf)
// drives every registered case through the modes:
//   compare     fast vs reference at every SIMD target the build has; guard zones and view gaps intact
//   nonfinite   NaN, then Inf, in one input element: the fast output is non-finite exactly where the reference's
//               is (and, where a case states it, where the definition says)
//   gradient    the kernel's and the reference's backward against central differences of the float64 reference
//   perf        each case's fast path per target timed against the reference (core_op_perf)
// This header and op_harness.cpp / cases_*.cpp do not use gtest: the lab benchmarks can link rotary_op_cases and
// iterate the same cases. docs/testing.md says how to add an op or a case.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness.h"
#include "rotary/rope.h"

namespace rotary::test {

// ------------------------------------------------------------------------------------------------- tolerances

// How an output's error is measured against its bound.
enum class Metric : uint8_t {
  Abs,            // max_i |got_i - want_i| <= bound
  Relative,       // |got_i - want_i| <= bound (floor + |want_i|) for every i
  RelativeToMax,  // max_i |got_i - want_i| <= bound max(floor, max_i |want_i|)
  Nmse,           // sum (got - want)^2 / max(sum want^2, n floor^2) <= bound
};

struct Tolerance {
  Metric metric = Metric::Nmse;
  double bound = 0;
  // The absolute scale below which the reference's own size stops counting: a quantity that is zero in exact
  // arithmetic is rounding noise in both implementations, and noise compared with noise fails on the next CPU.
  double floor = 0;
};

// What is being compared; each has one documented derivation in tolerance() (op_harness.cpp).
enum class Quantity : uint8_t {
  RopeElement,          // one rotated element, |x| <= scale (scale = attention factor x input bound)
  AttentionOutput,      // fused attention o
  AttentionLse,         // fused attention lse (stored f32, f64 for F64)
  AttentionGradient,    // fused attention dq, dk, dv
  AttentionBiasGradient,  // fused attention's gradient of the T5 bias table (sums of dS per bucket)
  DecodeOutput,         // decode step o against the absolute-rotation oracle
  DecodeLse,            // decode step lse
  LinearAttention,      // linear attention o and its gradients
  LinearOutput,         // linear_forward y, each element divided by its condition scale (cases_linear.cpp)
  FiniteDifference,     // any float64 gradient against central differences of the float64 reference
};

struct ToleranceInputs {
  DType dtype = DType::F32;        // storage dtype
  int64_t max_position = 0;        // largest |position| the angles see (float64 angle term)
  int64_t longest_sequence = 1;    // longest running sum (linear attention)
  double scale = 1;                // RopeElement: attention factor (or 1/a) times the input bound
  double floor = 0;                // FiniteDifference: the inputs' scale (see Tolerance::floor)
  bool q8 = false;                 // DecodeOutput / DecodeLse: keys and values stored in q8 blocks (KvStorage::Q8)
};

Tolerance tolerance(Quantity q, const ToleranceInputs& in);

// ------------------------------------------------------------------------------------------------- buffers

// A GuardedBuffer whose contents before a run are remembered: a run starts from them again (restore), and after
// it every element outside the op's view (padding between heads and tokens, other batch rows, a read-only
// input) must still hold them.
class WatchedBuffer : public GuardedBuffer {
 public:
  WatchedBuffer(std::string name, DType dtype, int64_t elements);
  const std::string& name() const { return name_; }
  // Elements of view `v` (`width` features of each head and token) are the op's to write.
  void allow_writes(const HeadsView& v, int64_t tokens, int width);
  void snapshot();  // the current contents become the state before a run
  void restore();   // back to the snapshot
  // "" when the guard zones and every element the op may not write are as snapshot; else what changed.
  std::string violations() const;
  // Elements of a view in [token][head][feature] order, as doubles.
  std::vector<double> gather(const HeadsView& v, int64_t tokens, int width) const;
  int64_t offset_of(const void* p) const;  // element index of a pointer into this buffer

 private:
  std::string name_;
  std::vector<char> writable_;
  std::vector<uint8_t> initial_;
};

// Elements of view `v` ([tokens, v.heads, width], storage `t`) in [token][head][feature] order, as doubles.
std::vector<double> gather_view(const HeadsView& v, DType t, int64_t tokens, int width);

// ------------------------------------------------------------------------------------------------- cases

struct Output {
  std::string name;
  std::vector<double> got, want;
  Tolerance tol;
};

// One input element to make non-finite: [token, head, feature] of the named input view.
struct PoisonSite {
  std::string input;
  int64_t token = 0, head = 0;
  int feature = 0;
};
enum class NonFinite : uint8_t { NaN, Inf };

// A gradient the finite-difference mode checks: the input view's elements in [token][head][feature] order and
// the gradients of L = sum dout . o with respect to them from the kernel and from the reference backward.
struct GradientInput {
  std::string name;
  std::function<int64_t()> size;
  std::function<double(int64_t)> get;
  std::function<void(int64_t, double)> set;
  std::vector<double> kernel, reference;
};

struct PerfCost {
  double bytes = 0;  // bytes the fast path must read and write at least
  double flops = 0;  // arithmetic of the op as defined (not of the reference's materialisation)
};

class OpCase {
 public:
  virtual ~OpCase() = default;
  virtual std::string op() const = 0;
  // The parameters, readable; letters, digits and '_' only, unique within the op (a gtest parameter name).
  virtual std::string name() const = 0;

  // (Re)builds the inputs (deterministic) and output buffers; release() frees them again.
  virtual void setup() = 0;
  virtual void release() = 0;
  virtual void run_reference() = 0;
  // The kernel under test at the current SIMD target; starts from the state after setup() (in-place ops too).
  virtual void run_fast() = 0;
  // After run_reference and run_fast: the outputs, got from the fast run and want from the reference.
  virtual std::vector<Output> outputs() const = 0;
  // After run_fast: "" when every buffer's guard zones and the elements outside the written views are intact.
  virtual std::string memory_violations() const = 0;

  // Non-finite mode: the sites to poison (none: the case is not in this mode) and poisoning one after setup().
  virtual std::vector<PoisonSite> poison_sites(NonFinite) const { return {}; }
  virtual void poison(const PoisonSite&, double) {}
  // Where the definition puts non-finite values of `output` for a site (independent of both implementations);
  // nullopt: only parity with the reference is checked.
  virtual std::optional<std::vector<char>> expected_nonfinite(const PoisonSite&, NonFinite,
                                                              const std::string& /*output*/) const {
    return std::nullopt;
  }

  // Gradient mode (float64 cases of ops with a backward pass): L = sum dout . o from the reference forward.
  virtual bool finite_differences() const { return false; }
  virtual double reference_loss() { return 0; }
  virtual std::vector<GradientInput> gradient_inputs() { return {}; }
  virtual Tolerance finite_difference_tolerance() const { return {}; }

  virtual PerfCost cost() const = 0;
};

using OpCases = std::vector<std::unique_ptr<OpCase>>;

// The case lists, one per op family (cases_*.cpp).
OpCases rope_cases();
OpCases attention_cases();
OpCases decode_cases();
OpCases linear_attention_cases();
OpCases linear_cases();
// Every case of every op, built once.
const OpCases& all_op_cases();
// Cases whose "op/name" contains `filter` (empty: all).
std::vector<OpCase*> select_cases(const std::string& filter);

// Letters, digits and '_' of `s`, anything else as '_' ("a=1.17" -> "a_1_17").
std::string identifier(const std::string& s);

// ------------------------------------------------------------------------------------------------- the modes
// Each returns the failures as readable lines (empty: passed), so the gtest runner and other programs share them.

// One output against its tolerance: "" or the failure with the measured error.
std::string check_output(const Output& o);
// The measured error of an output over its bound (1 = at the tolerance); for reports.
double error_over_bound(const Output& o);

// compare: the reference once, the fast path at every SIMD target in `targets` (detail::simd_targets()).
// `observe`, when given, sees every output at every target (the runner records the margins).
std::vector<std::string> compare_at_targets(OpCase& c, const std::vector<int64_t>& targets,
                                            const std::function<void(int64_t, const Output&)>& observe = {});
// nonfinite: every site of `kind`, at every target.
std::vector<std::string> nonfinite_parity(OpCase& c, NonFinite kind, const std::vector<int64_t>& targets);
// gradient: central differences (step h) of reference_loss() against both backward passes.
std::vector<double> central_differences(const std::function<double()>& loss, const GradientInput& in,
                                               double h);
std::vector<std::string> gradient_check(OpCase& c);
// perf: times run_fast per target and run_reference; prints one table row per (case, target).
void perf_table(const std::vector<OpCase*>& cases, const std::vector<int64_t>& targets, double min_seconds,
                std::ostream& out);

}  // namespace rotary::test
