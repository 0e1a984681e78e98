// Scalar conversions for the storage types (the SIMD kernels convert with Highway; these are for the
// references, tests and tails).
#include "rotary/dtype.h"

#include <cmath>

#include "rotary/error.h"

namespace rotary {

DType parse_dtype(std::string_view n) {
  if (n == "f32" || n == "float32" || n == "float") return DType::F32;
  if (n == "f16" || n == "float16" || n == "half") return DType::F16;
  if (n == "bf16" || n == "bfloat16") return DType::BF16;
  if (n == "f64" || n == "float64" || n == "double") return DType::F64;
  fail("dtype", std::string(n), "f32, f16, bf16, f64");
}

uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: infinity
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // value / 2^-24 rounded to nearest even
    float a;
    std::memcpy(&a, &abs, 4);
    float q = std::nearbyint(std::ldexp(a, 24));
    return uint16_t(sign | uint16_t(q));
  }
  // normal: rebias exponent and round the mantissa from 23 to 10 bits, to nearest even
  uint32_t r = abs - (112u << 23);
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | uint16_t(r >> 13));
}

}  // namespace rotary
