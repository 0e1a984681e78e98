#include "harness.h"

#include <algorithm>
#include <cmath>

namespace rotary::test {

namespace {
constexpr uint8_t kSentinel = 0xA7;  // as f32/f16/bf16 a finite, unusual value: a stray write changes it
}

GuardedBuffer::GuardedBuffer(DType dtype, int64_t elements)
    : dtype_(dtype), elements_(elements),
      bytes_(size_t(2 * kGuardBytes + elements * int64_t(dtype_size(dtype))), kSentinel) {}

std::vector<double> GuardedBuffer::to_double() const {
  std::vector<double> out(static_cast<size_t>(elements_));
  for (int64_t i = 0; i < elements_; ++i) out[size_t(i)] = get(i);
  return out;
}

bool GuardedBuffer::guards_intact() const {
  const size_t tail = size_t(kGuardBytes + elements_ * int64_t(dtype_size(dtype_)));
  for (size_t i = 0; i < size_t(kGuardBytes); ++i)
    if (bytes_[i] != kSentinel || bytes_[tail + i] != kSentinel) return false;
  return true;
}

void fill_uniform(GuardedBuffer& b, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < b.size(); ++i) b.set(i, u(rng));
}

double nmse(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return num / den;
}

double dtype_eps(DType t) {
  switch (t) {
    case DType::F32: return std::ldexp(1.0, -24);
    case DType::F16: return std::ldexp(1.0, -11);
    case DType::BF16: return std::ldexp(1.0, -8);
    case DType::F64: return std::ldexp(1.0, -53);
  }
  return 0;
}

}  // namespace rotary::test
