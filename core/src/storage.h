// core/src/storage.h (internal): the scalar storage conversion of the kernels - a row of n elements of any storage
// dtype read into the compute type W (float or double), or written back from it rounded once (bf16 and f16 to
// nearest even, rotary/dtype.h). The dtype switch sits outside the loop. Per element: load_as_double /
// store_from_double in rotary/dtype.h; the SIMD kernels load and store their lanes through Highway.
#pragma once

#include <cstdint>

#include "rotary/dtype.h"

namespace rotary::detail {

// out[i] = base[offset + i] for i < n.
template <class W>
inline void load_row(const void* base, DType t, int64_t offset, int64_t n, W* out) {
  switch (t) {
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) out[i] = W(static_cast<const float*>(base)[offset + i]);
      break;
    case DType::F64:
      for (int64_t i = 0; i < n; ++i) out[i] = W(static_cast<const double*>(base)[offset + i]);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = W(bf16_to_float(static_cast<const uint16_t*>(base)[offset + i]));
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = W(f16_to_float(static_cast<const uint16_t*>(base)[offset + i]));
      break;
  }
}
// Elements [offset, offset + n) as fp32: in place when the storage is f32, else widened into `buf` (n floats).
inline const float* f32_row(const void* base, DType t, int64_t offset, int64_t n, float* buf) {
  if (t == DType::F32) return static_cast<const float*>(base) + offset;
  load_row(base, t, offset, n, buf);
  return buf;
}
// base[offset + i] = in[i] for i < n, rounded to the storage type.
template <class W>
inline void store_row(void* base, DType t, int64_t offset, int64_t n, const W* in) {
  switch (t) {
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(base)[offset + i] = float(in[i]);
      break;
    case DType::F64:
      for (int64_t i = 0; i < n; ++i) static_cast<double*>(base)[offset + i] = double(in[i]);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(base)[offset + i] = float_to_bf16(float(in[i]));
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(base)[offset + i] = float_to_f16(float(in[i]));
      break;
  }
}

}  // namespace rotary::detail
