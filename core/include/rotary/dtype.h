// rotary/dtype.h: storage types of the kernels and scalar conversions (arithmetic is always fp32 or fp64).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace rotary {

enum class DType : uint8_t { F32, F16, BF16, F64 };

inline constexpr size_t dtype_size(DType t) {
  return t == DType::F64 ? 8 : t == DType::F32 ? 4 : 2;
}
inline constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F64: return "f64";
  }
  return "?";
}
// Parses "f32"/"float32", "f16"/"float16"/"half", "bf16"/"bfloat16", "f64"/"float64"; throws rotary::Error otherwise.
DType parse_dtype(std::string_view name);

// bf16: the upper 16 bits of an IEEE float; rounding to nearest even, NaN stays NaN.
inline float bf16_to_float(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// IEEE binary16, rounding to nearest even; overflow goes to infinity as in hardware conversions.
// f16 -> f32 is exact and inline without branches on the value, so loops over f16 rows vectorise: the 15 bits of
// exponent and mantissa moved into a float's places and multiplied by 2^112 re-bias the exponent (exact for
// normal and subnormal halves alike: a float holds every half); infinities and NaNs (exponent 31) are set apart.
inline float f16_to_float(uint16_t h) {
  const uint32_t magnitude = uint32_t(h) & 0x7fffu;
  uint32_t u = magnitude << 13;
  float f;
  std::memcpy(&f, &u, 4);
  f *= 0x1p112f;
  std::memcpy(&u, &f, 4);
  u = magnitude >= 0x7c00u ? (0x7f800000u | (magnitude << 13)) : u;
  u |= (uint32_t(h) & 0x8000u) << 16;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_f16(float f);

// Reads element i of a buffer of dtype t as double (used by references and tests).
inline double load_as_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}
// Writes element i of a buffer of dtype t from a double (rounded once, to the storage type).
inline void store_from_double(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = float(v); break;
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(float(v)); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = float_to_f16(float(v)); break;
  }
}

}  // namespace rotary
