#include "op_harness.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <ostream>
#include <sstream>

#include "simd_targets.h"

namespace rotary::test {

// ------------------------------------------------------------------------------------------------- tolerances

Tolerance tolerance(Quantity q, const ToleranceInputs& in) {
  const double e = dtype_eps(in.dtype);
  const double u64 = dtype_eps(DType::F64);
  const bool half = in.dtype == DType::F16 || in.dtype == DType::BF16;
  // Angles are formed as pos * inv_freq in float64: an absolute error of ~|pos| eps64 rad that fp32 results never
  // see (far below eps32) but F64 results do, so F64 budgets grow with the largest position.
  const double angle = 4.0 * double(in.max_position) * u64;
  switch (q) {
    case Quantity::RopeElement: {
      // Bound on |fast - reference| for one rotated element; inputs |x| <= X, scale s (a, or 1/a for Inverse),
      // in.scale = s X:
      //   fast arithmetic in the compute type (u_c = u32, or u64 for F64 storage): c and s are rounded to it (u_c
      //   each, on top of <= 16 u64 from the float64 cos/sin, see test_angles.cpp), then two products and a sum
      //   with two or three roundings (fused or not):  <= (|x1 c| + |x2 s|) 2 u_c + |y| u_c <= 3 sqrt2 s X u_c,
      //   using |c| + |s| <= sqrt2 s and |y| <= sqrt2 s X;
      //   both results are rounded once to the storage type:  + 2 eps_s |y| <= 2 sqrt2 s X eps_s.
      // The 16 u64 cos/sin term enters twice (c and s): + 32 u64 s X.
      const double uc = in.dtype == DType::F64 ? u64 : dtype_eps(DType::F32);
      const double sqrt2 = std::sqrt(2.0);
      return {Metric::Abs, in.scale * (3 * sqrt2 * uc + 2 * sqrt2 * e + 32 * u64), 0};
    }
    case Quantity::AttentionOutput: {
      // NMSE against the float64 reference (docs/attention.md). f16/bf16: the output is rounded once to the
      // storage type, a relative error uniform in [-eps, eps] with mean square eps^2/3; the fp32 arithmetic
      // before it is ~1e4x smaller: allowed eps^2 (3x that mean). f32/f64: the error of the arithmetic itself -
      // a few ulps from the rotations, ~sqrt(D) from the dot products, ~log2(n) from the online-softmax rescales
      // and weighted sums: a per-element relative error of order 10 eps; allowed (64 eps + angle)^2. Any real
      // defect (one wrong angle, one missing key) shows as > 1e-6.
      if (half) return {Metric::Nmse, e * e, 0};
      const double rel = 64 * e + angle;
      return {Metric::Nmse, rel * rel, 0};
    }
    case Quantity::AttentionLse: {
      // lse is stored as f32 (f64 for F64) whatever the storage dtype: the output bound of that type.
      ToleranceInputs lse = in;
      lse.dtype = in.dtype == DType::F64 ? DType::F64 : DType::F32;
      return tolerance(Quantity::AttentionOutput, lse);
    }
    case Quantity::AttentionGradient: {
      // f16/bf16: 4 eps^2 - the gradients also see the rounding of o through D_i = do . o, amplified where
      // dP - D cancels. f32/f64: (256 eps + 4 angle)^2 - the backward subtracts nearly equal numbers in dP - D.
      if (half) return {Metric::Nmse, 4 * e * e, 0};
      const double rel = 256 * e + 4 * angle;
      return {Metric::Nmse, rel * rel, 0};
    }
    case Quantity::AttentionBiasGradient: {
      // Each entry sums dS over the pairs of one (bucket, head). A row's dS sums to 0 (sum_j P_ij (dP_ij - D_i)),
      // so an entry is partial row sums that cancel, each bounded by sum_j |dS_ij| <= 2 max |dP|, O(1) for inputs
      // in [-1, 1): the floor 1 is one row's contribution, below which an entry is cancellation noise. The error of
      // each dS term is the AttentionGradient one.
      const Tolerance t = tolerance(Quantity::AttentionGradient, in);
      return {t.metric, t.bound, 1.0};
    }
    case Quantity::DecodeOutput:
    case Quantity::DecodeLse: {
      // rms error relative to the oracle's rms (docs/decode.md), in units of the storage unit roundoff u:
      //  - f16/bf16: the output is rounded once to the storage type (rms ~u/sqrt3); keys stored rotated are
      //    rounded once more (a score of O(1) moves by ~u/3 rms, softmax passes that on); fp32 arithmetic is far
      //    below u. Allowed 4 u (measured 0.4-0.7 u).
      //  - f32: the same roundings plus fp32 cos/sin (a few ulps) and fp32 sums over n keys (~sqrt(n) ulps
      //    typical). Allowed 64 u (measured 3-7 u, n up to 5000).
      //  - f64: float64 sums (tiny) plus the angle itself: pos * inv_freq rounds to ~u pos radians, and the
      //    kernels form angles of distances while the oracle forms angles of absolute positions. Allowed
      //    32 u + u max position (measured 4-9 u at positions ~200).
      //  - q8 storage (against the oracle): each stored key and value element moves by up to half its block's
      //    scale, max |block| / 254 = u8 |block max| (u8 = 2^-8; rms u8 / sqrt3 of the block max, which for
      //    uniform inputs is ~1.7x the elements' rms): scores move ~u8 relative, the output's values ~u8 / sqrt(n
      //    effective), and the output is rounded to its dtype on top. Allowed 4 u8 + the dtype's own bound
      //    (measured 0.9-1.5 u8 on the Leaky cases, n up to 5000).
      double rel = in.dtype == DType::F64 ? 32 * e + e * double(in.max_position)
                   : in.dtype == DType::F32 ? 64 * e
                                            : 4 * e;
      if (in.q8) rel += 4 * 0x1p-8;
      // lse is stored in fp32 (f64 for F64): its own rounding plus the score error, per head, relative to
      // 1 + |lse| (the floor: an lse near 0 is a sum of O(1) terms, not a small number).
      if (q == Quantity::DecodeLse) return {Metric::Relative, 4 * rel, 1.0};
      return {Metric::Nmse, rel * rel, 0};
    }
    case Quantity::LinearAttention: {
      // rms error relative to the reference's rms (docs/linear-attention.md), in units of u:
      //  - f64 fast vs reference: the same sums in another order: 64 u (measured 2-5 u).
      //  - f32: fp32 running sums over <= N terms: u sqrt(N) typical; the numerator can cancel (rotated
      //    features have either sign) while the denominator cannot: 8 u sqrt(N) (measured 1-5 u, N <= 64).
      //  - f16/bf16: inputs are the reference's inputs (already rounded); the output and gradients are rounded
      //    once more (u) on top of fp32 arithmetic: 4 u.
      const double n = double(std::max<int64_t>(1, in.longest_sequence));
      const double rel = in.dtype == DType::F64 ? 64 * e : in.dtype == DType::F32 ? 8 * e * std::sqrt(n) : 4 * e;
      return {Metric::Nmse, rel * rel, 0};
    }
    case Quantity::LinearOutput: {
      // One output of linear_forward: a dot product of K = in.longest_sequence terms w x (the weights exact as
      // stored, q8 as quant x scale), plus the bias and, accumulating, the old y, summed in float32 in some order
      // (lanes, then across lanes). Whatever the order, the rounding error of a sum of n terms is at most
      // gamma_n = n u / (1 - n u) times the sum of the terms' magnitudes (Higham, Accuracy and Stability, 3.1);
      // n = K + 4 covers the K - 1 additions, q8's rounded quant x scale, the multiply of an unfused target, the
      // bias and the accumulation. The case divides each output by that magnitude sum, so the bound is gamma_n
      // itself (worst case, every target). One missing or wrong term moves an output by ~1/K of it: far above
      // gamma_n for the K <= ~1000 of the cases.
      const double n = double(in.longest_sequence + 4), u = dtype_eps(DType::F32);
      return {Metric::Abs, n * u / (1 - n * u), 0};
    }
    case Quantity::FiniteDifference:
      // Central differences of the float64 reference at h = 1e-5: truncation ~h^2 |L'''| / 6 and rounding
      // ~eps64 |L| / h, both ~1e-10 relative: allowed 1e-7 of the largest gradient entry, that entry floored
      // at the inputs' scale (a gradient that is nearly zero everywhere is compared with the inputs' size).
      return {Metric::RelativeToMax, 1e-7, in.floor};
  }
  return {};
}

// ------------------------------------------------------------------------------------------------- buffers

WatchedBuffer::WatchedBuffer(std::string name, DType dtype, int64_t elements)
    : GuardedBuffer(dtype, elements), name_(std::move(name)), writable_(size_t(elements), 0) {
  snapshot();
}

int64_t WatchedBuffer::offset_of(const void* p) const {
  return (static_cast<const char*>(p) - static_cast<const char*>(data())) / int64_t(dtype_size(dtype()));
}

void WatchedBuffer::allow_writes(const HeadsView& v, int64_t tokens, int width) {
  const int64_t base = offset_of(v.data);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < v.heads; ++h)
      for (int d = 0; d < width; ++d) writable_[size_t(base + t * v.token_stride + h * v.head_stride + d)] = 1;
}

void WatchedBuffer::snapshot() {
  const auto* p = static_cast<const uint8_t*>(data());
  initial_.assign(p, p + size() * int64_t(dtype_size(dtype())));
}

void WatchedBuffer::restore() { std::memcpy(data(), initial_.data(), initial_.size()); }

std::string WatchedBuffer::violations() const {
  if (!guards_intact()) return name_ + ": a guard zone was overwritten";
  const size_t es = dtype_size(dtype());
  const auto* p = static_cast<const uint8_t*>(data());
  for (int64_t i = 0; i < size(); ++i)
    if (!writable_[size_t(i)] && std::memcmp(p + size_t(i) * es, initial_.data() + size_t(i) * es, es) != 0)
      return name_ + ": element " + std::to_string(i) + " outside the written view changed";
  return "";
}

std::vector<double> gather_view(const HeadsView& v, DType t, int64_t tokens, int width) {
  std::vector<double> x;
  x.reserve(size_t(std::max<int64_t>(0, tokens * v.heads * width)));
  for (int64_t tok = 0; tok < tokens; ++tok)
    for (int64_t h = 0; h < v.heads; ++h)
      for (int d = 0; d < width; ++d) x.push_back(load_as_double(v.data, t, tok * v.token_stride + h * v.head_stride + d));
  return x;
}

std::vector<double> WatchedBuffer::gather(const HeadsView& v, int64_t tokens, int width) const {
  return gather_view(v, dtype(), tokens, width);
}

// ------------------------------------------------------------------------------------------------- registry

const OpCases& all_op_cases() {
  static const OpCases all = [] {
    OpCases out;
    for (auto* list : {&rope_cases, &attention_cases, &decode_cases, &linear_attention_cases, &linear_cases})
      for (auto& c : (*list)()) out.push_back(std::move(c));
    return out;
  }();
  return all;
}

std::vector<OpCase*> select_cases(const std::string& filter) {
  std::vector<OpCase*> out;
  for (const auto& c : all_op_cases())
    if (filter.empty() || (c->op() + "/" + c->name()).find(filter) != std::string::npos) out.push_back(c.get());
  return out;
}

std::string identifier(const std::string& s) {
  std::string out;
  for (char ch : s) {
    const bool keep = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
    if (keep) out += ch;
    else if (!out.empty() && out.back() != '_') out += '_';
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

// ------------------------------------------------------------------------------------------------- compare

namespace {

struct Measured {
  double error = 0;  // in the metric's units
  double limit = 0;  // what it may reach
  int64_t worst = -1;
};

Measured measure(const Output& o) {
  Measured m;
  const Tolerance& t = o.tol;
  if (o.got.size() != o.want.size()) return {INFINITY, t.bound, -1};
  switch (t.metric) {
    case Metric::Abs:
    case Metric::RelativeToMax: {
      double scale = t.floor;
      for (double w : o.want) scale = std::max(scale, std::fabs(w));
      m.limit = t.metric == Metric::Abs ? t.bound : t.bound * scale;
      for (size_t i = 0; i < o.got.size(); ++i) {
        const double d = std::fabs(o.got[i] - o.want[i]);
        if (!(d <= m.error)) m.error = d, m.worst = int64_t(i);  // NaN counts as the worst
      }
      return m;
    }
    case Metric::Relative: {
      // The ratio error / allowed, worst element; limit 1.
      m.limit = 1;
      for (size_t i = 0; i < o.got.size(); ++i) {
        const double r = std::fabs(o.got[i] - o.want[i]) / (t.bound * (t.floor + std::fabs(o.want[i])));
        if (!(r <= m.error)) m.error = r, m.worst = int64_t(i);
      }
      return m;
    }
    case Metric::Nmse: {
      double num = 0, den = 0;
      for (size_t i = 0; i < o.got.size(); ++i) {
        num += (o.got[i] - o.want[i]) * (o.got[i] - o.want[i]);
        den += o.want[i] * o.want[i];
      }
      den = std::max(den, double(o.got.size()) * t.floor * t.floor);
      m.error = den == 0 ? (num == 0 ? 0 : INFINITY) : num / den;
      m.limit = t.bound;
      return m;
    }
  }
  return m;
}

const char* metric_name(Metric m) {
  switch (m) {
    case Metric::Abs: return "max |got - want|";
    case Metric::Relative: return "max |got - want| / (bound (floor + |want|))";
    case Metric::RelativeToMax: return "max |got - want|";
    case Metric::Nmse: return "nmse";
  }
  return "?";
}

std::string target_prefix(int64_t target) { return std::string("[") + detail::simd_target_name(target) + "] "; }

}  // namespace

double error_over_bound(const Output& o) {
  const Measured m = measure(o);
  return m.limit > 0 ? m.error / m.limit : (m.error == 0 ? 0 : INFINITY);
}

std::string check_output(const Output& o) {
  const Measured m = measure(o);
  if (m.error <= m.limit) return "";
  std::ostringstream s;
  s.precision(4);
  s << o.name << ": " << metric_name(o.tol.metric) << " = " << m.error << " > " << m.limit;
  if (m.worst >= 0) s << " (element " << m.worst << ": got " << o.got[size_t(m.worst)] << ", want " << o.want[size_t(m.worst)] << ")";
  return s.str();
}

std::vector<std::string> compare_at_targets(OpCase& c, const std::vector<int64_t>& targets,
                                            const std::function<void(int64_t, const Output&)>& observe) {
  std::vector<std::string> failures;
  c.setup();
  c.run_reference();
  for (int64_t target : targets) {
    detail::force_simd_target(target);
    c.run_fast();
    if (std::string v = c.memory_violations(); !v.empty()) failures.push_back(target_prefix(target) + v);
    for (const Output& o : c.outputs()) {
      if (observe) observe(target, o);
      if (std::string f = check_output(o); !f.empty()) failures.push_back(target_prefix(target) + f);
    }
  }
  detail::force_simd_target(0);
  c.release();
  return failures;
}

// ------------------------------------------------------------------------------------------------- nonfinite

std::vector<std::string> nonfinite_parity(OpCase& c, NonFinite kind, const std::vector<int64_t>& targets) {
  std::vector<std::string> failures;
  const double value = kind == NonFinite::NaN ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
  const char* what = kind == NonFinite::NaN ? "NaN" : "Inf";
  for (const PoisonSite& site : c.poison_sites(kind)) {
    const std::string where = std::string(what) + " in " + site.input + "[" + std::to_string(site.token) + ", " +
                              std::to_string(site.head) + ", " + std::to_string(site.feature) + "] ";
    c.setup();
    c.poison(site, value);
    c.run_reference();
    for (int64_t target : targets) {
      detail::force_simd_target(target);
      c.run_fast();
      const std::string prefix = target_prefix(target) + where;
      if (std::string v = c.memory_violations(); !v.empty()) failures.push_back(prefix + v);
      size_t reference_nonfinite = 0;
      for (const Output& o : c.outputs()) {
        // The definition's mask (NaN: exactly NaN there; Inf: non-finite there), then parity with the reference.
        auto bad = [&](double x) { return kind == NonFinite::NaN ? std::isnan(x) : !std::isfinite(x); };
        if (auto expected = c.expected_nonfinite(site, kind, o.name)) {
          for (size_t i = 0; i < o.want.size(); ++i) {
            if (bad(o.want[i]) != bool((*expected)[i])) {
              failures.push_back(prefix + o.name + " element " + std::to_string(i) + ": reference " +
                                 std::to_string(o.want[i]) + ", the definition says " +
                                 ((*expected)[i] ? what : "finite"));
              break;
            }
            if (bad(o.got[i]) != bool((*expected)[i])) {
              failures.push_back(prefix + o.name + " element " + std::to_string(i) + ": fast " +
                                 std::to_string(o.got[i]) + ", the definition says " +
                                 ((*expected)[i] ? what : "finite"));
              break;
            }
          }
        }
        Output finite{o.name + " (finite elements)", {}, {}, o.tol};
        for (size_t i = 0; i < o.want.size() && i < o.got.size(); ++i) {
          reference_nonfinite += !std::isfinite(o.want[i]);
          if (std::isfinite(o.got[i]) != std::isfinite(o.want[i])) {
            failures.push_back(prefix + o.name + " element " + std::to_string(i) + ": fast " +
                               std::to_string(o.got[i]) + ", reference " + std::to_string(o.want[i]));
            break;
          }
          if (std::isfinite(o.want[i])) finite.got.push_back(o.got[i]), finite.want.push_back(o.want[i]);
        }
        // Everything the poison does not reach still matches.
        if (std::string f = check_output(finite); !f.empty()) failures.push_back(prefix + f);
      }
      if (reference_nonfinite == 0) failures.push_back(prefix + "reaches no output of the reference");
    }
    detail::force_simd_target(0);
    c.release();
  }
  return failures;
}

// ------------------------------------------------------------------------------------------------- gradient

std::vector<double> central_differences(const std::function<double()>& loss, const GradientInput& in, double h) {
  std::vector<double> fd(size_t(in.size()));
  for (int64_t i = 0; i < in.size(); ++i) {
    const double x = in.get(i);
    in.set(i, x + h);
    const double up = loss();
    in.set(i, x - h);
    const double down = loss();
    in.set(i, x);
    fd[size_t(i)] = (up - down) / (2 * h);
  }
  return fd;
}

std::vector<std::string> gradient_check(OpCase& c) {
  std::vector<std::string> failures;
  c.setup();
  c.run_reference();
  c.run_fast();
  const Tolerance tol = c.finite_difference_tolerance();
  for (const GradientInput& in : c.gradient_inputs()) {
    const std::vector<double> fd = central_differences([&] { return c.reference_loss(); }, in, 1e-5);
    for (auto [got, who] : {std::pair{&in.kernel, " (kernel)"}, std::pair{&in.reference, " (reference)"}})
      if (std::string f = check_output({in.name + who, *got, fd, tol}); !f.empty()) failures.push_back(f);
  }
  c.release();
  return failures;
}

// ------------------------------------------------------------------------------------------------- perf

namespace {
// Seconds per call of f, repeated until min_seconds have passed (at least once after one warm-up call).
double seconds_per_call(const std::function<void()>& f, double min_seconds) {
  using clock = std::chrono::steady_clock;
  f();
  int64_t calls = 0;
  const auto start = clock::now();
  double elapsed = 0;
  do {
    f();
    ++calls;
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  } while (elapsed < min_seconds);
  return elapsed / double(calls);
}
}  // namespace

void perf_table(const std::vector<OpCase*>& cases, const std::vector<int64_t>& targets, double min_seconds,
                std::ostream& out) {
  char line[512];
  std::snprintf(line, sizeof line, "%-26s %-9s %12s %12s %9s %9s %9s  %s\n", "op", "target", "fast_us", "ref_us",
                "speedup", "GB/s", "GFLOP/s", "case");
  out << line;
  for (OpCase* c : cases) {
    c->setup();
    const double ref = seconds_per_call([&] { c->run_reference(); }, min_seconds);
    const PerfCost cost = c->cost();
    for (int64_t target : targets) {
      detail::force_simd_target(target);
      const double fast = seconds_per_call([&] { c->run_fast(); }, min_seconds);
      std::snprintf(line, sizeof line, "%-26s %-9s %12.2f %12.2f %9.1f %9.2f %9.2f  %s\n", c->op().c_str(),
                    detail::simd_target_name(target), fast * 1e6, ref * 1e6, ref / fast, cost.bytes / fast * 1e-9,
                    cost.flops / fast * 1e-9, c->name().c_str());
      out << line;
    }
    detail::force_simd_target(0);
    c->release();
  }
}

}  // namespace rotary::test
