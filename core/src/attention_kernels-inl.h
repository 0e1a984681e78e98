// core/src/attention_kernels-inl.h (internal, per Highway target): the tile products and the online
// softmax row step shared by the fused forward and backward.
//
// TileGemm: C[M, ncols] (=|+=) A[M, K] * B[K, ncols] with A read through strides (so A can be a transposed
// tile) and B row-major with padded rows (ncols a multiple of the vector width). The register-blocked
// micro-kernel keeps R x CV accumulators, broadcasts one A element per row and loads CV vectors of B per k:
// R*CV FMAs per R + CV loads. On the tile sizes attention uses (64 x 64 x 64) it runs as fast as OpenBLAS
// sgemm per call without its packing (docs/bench-attention.md), and it lets the kernels run exact row counts.
#if defined(ROTARY_ATTENTION_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ROTARY_ATTENTION_KERNELS_INL_H_
#undef ROTARY_ATTENTION_KERNELS_INL_H_
#else
#define ROTARY_ATTENTION_KERNELS_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace rotary::attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 64-byte vectors: the scratch pads rows to 64 bytes.
template <class T>
using Tag = hn::CappedTag<T, 64 / sizeof(T)>;

// Vector registers the accumulators may take: 16-register ISAs keep 12, 32-register ones 24.
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3
inline constexpr int kAccRegs = 12;
#else
inline constexpr int kAccRegs = 24;
#endif

template <int CV>
constexpr int RowsFor() {
  return std::min(8, std::max(1, kAccRegs / CV));
}

template <class T, int R, int CV>
HWY_NOINLINE void MicroTile(int64_t K, const T* HWY_RESTRICT A, int64_t ars, int64_t aks, const T* HWY_RESTRICT B,
                            int64_t ldb, T* HWY_RESTRICT C, int64_t ldc, bool accumulate) {
  const Tag<T> d;
  const size_t NL = hn::Lanes(d);
  using V = hn::Vec<Tag<T>>;
  V c[R][CV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < CV; ++v) c[r][v] = accumulate ? hn::LoadU(d, C + r * ldc + v * NL) : hn::Zero(d);
  for (int64_t k = 0; k < K; ++k) {
    V b[CV];
    for (int v = 0; v < CV; ++v) b[v] = hn::LoadU(d, B + k * ldb + v * NL);
    const T* a = A + k * aks;
    for (int r = 0; r < R; ++r) {
      const V ar = hn::Set(d, a[r * ars]);
      for (int v = 0; v < CV; ++v) c[r][v] = hn::MulAdd(ar, b[v], c[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < CV; ++v) hn::StoreU(c[r][v], d, C + r * ldc + v * NL);
}

template <class T, int CV, int R>
HWY_INLINE void TailRows(int64_t rows, int64_t K, const T* A, int64_t ars, int64_t aks, const T* B, int64_t ldb, T* C,
                         int64_t ldc, bool accumulate) {
  if constexpr (R >= 1) {
    if (rows == R) return MicroTile<T, R, CV>(K, A, ars, aks, B, ldb, C, ldc, accumulate);
    TailRows<T, CV, R - 1>(rows, K, A, ars, aks, B, ldb, C, ldc, accumulate);
  }
}

template <class T, int CV>
HWY_INLINE void RowPanels(int64_t M, int64_t K, const T* A, int64_t ars, int64_t aks, const T* B, int64_t ldb, T* C,
                          int64_t ldc, bool accumulate) {
  constexpr int RM = RowsFor<CV>();
  int64_t r = 0;
  for (; r + RM <= M; r += RM) MicroTile<T, RM, CV>(K, A + r * ars, ars, aks, B, ldb, C + r * ldc, ldc, accumulate);
  if (r < M) TailRows<T, CV, RM - 1>(M - r, K, A + r * ars, ars, aks, B, ldb, C + r * ldc, ldc, accumulate);
}

// C[M, ncols] (=|+=) sum_k A(r, k) B[k, :], A(r, k) = A[r * ars + k * aks]; ncols a multiple of Lanes.
template <class T>
void TileGemm(int64_t M, int64_t ncols, int64_t K, const T* A, int64_t ars, int64_t aks, const T* B, int64_t ldb,
              T* C, int64_t ldc, bool accumulate) {
  if (M <= 0) return;
  const Tag<T> d;
  const int64_t NL = int64_t(hn::Lanes(d));
  const int64_t nvec = ncols / NL;
  int64_t chunks = (nvec + 3) / 4, v0 = 0;
  // Column chunks of at most 4 vectors, balanced (5 -> 3 + 2) so that no chunk runs one lonely vector.
  while (v0 < nvec) {
    const int64_t cv = (nvec - v0 + chunks - 1) / chunks;
    const T* Bc = B + v0 * NL;
    T* Cc = C + v0 * NL;
    switch (cv) {
      case 1: RowPanels<T, 1>(M, K, A, ars, aks, Bc, ldb, Cc, ldc, accumulate); break;
      case 2: RowPanels<T, 2>(M, K, A, ars, aks, Bc, ldb, Cc, ldc, accumulate); break;
      case 3: RowPanels<T, 3>(M, K, A, ars, aks, Bc, ldb, Cc, ldc, accumulate); break;
      default: RowPanels<T, 4>(M, K, A, ars, aks, Bc, ldb, Cc, ldc, accumulate); break;
    }
    v0 += cv;
    --chunks;
  }
}

// p = exp(x) for the softmax (x = s - m <= 0 up to rounding): exact 0 below the normal range (masked -inf
// included) and NaN stays NaN (Highway's Exp maps NaN to 0, which would hide a NaN input).
// fp32: 2^t with t = x log2(e), split t = n + f (n = round(t), |f| <= 1/2), 2^f by Cephes' exp2f polynomial
// (relative error ~1e-7, as hwy::Exp's) and 2^n added to the exponent bits: ~15 operations to hwy::Exp's ~25,
// which is ~5% of a forward tile. fp64 keeps hwy::Exp.
template <class D, class V>
HWY_INLINE V ExpKeepNaN(D d, V x) {
  using T = hn::TFromD<D>;
  if constexpr (sizeof(T) == 8) {
    return hn::IfThenElse(hn::IsNaN(x), x, hn::Exp(d, x));
  } else {
    const hn::RebindToSigned<D> di;
    const V t = hn::Mul(x, hn::Set(d, T(1.44269504088896341)));
    const V n = hn::Round(t);
    const V f = hn::Sub(t, n);
    V p = hn::Set(d, T(1.535336188319500e-4));
    p = hn::MulAdd(p, f, hn::Set(d, T(1.339887440266574e-3)));
    p = hn::MulAdd(p, f, hn::Set(d, T(9.618437357674640e-3)));
    p = hn::MulAdd(p, f, hn::Set(d, T(5.550332471162809e-2)));
    p = hn::MulAdd(p, f, hn::Set(d, T(2.402264791363012e-1)));
    p = hn::MulAdd(p, f, hn::Set(d, T(6.931472028550421e-1)));
    p = hn::MulAdd(p, f, hn::Set(d, T(1)));
    const V scaled = hn::BitCast(d, hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::ConvertTo(di, n))));
    const V y = hn::IfThenZeroElse(hn::Lt(t, hn::Set(d, T(-125))), scaled);
    return hn::IfThenElse(hn::IsNaN(x), x, y);
  }
}

// Sets s[j] = -inf for j in [from, n) (n a multiple of Lanes).
template <class T>
HWY_INLINE void MaskFrom(T* s, int64_t from, int64_t n) {
  for (int64_t j = std::max<int64_t>(from, 0); j < n; ++j) s[j] = -std::numeric_limits<T>::infinity();
}

// One online-softmax step of a row: s[0:n] holds this key tile's scores (masked entries -inf). Replaces them
// by p = exp(s - m_new), updates m and l, and returns alpha = exp(m_old - m_new) for rescaling the accumulator.
template <class T>
HWY_INLINE T SoftmaxRowStep(T* HWY_RESTRICT s, int64_t n, T& m, T& l) {
  const Tag<T> d;
  const int64_t NL = int64_t(hn::Lanes(d));
  auto vmax = hn::Set(d, -std::numeric_limits<T>::infinity());
  for (int64_t j = 0; j < n; j += NL) vmax = hn::Max(vmax, hn::LoadU(d, s + j));
  const T tile_max = hn::GetLane(hn::MaxOfLanes(d, vmax));
  const T m_new = std::max(m, tile_max);
  // A row that has seen only masked keys keeps m = -inf; subtracting 0 then gives exp(-inf) = 0, not NaN.
  const T m_use = m_new == -std::numeric_limits<T>::infinity() ? T(0) : m_new;
  const auto vm = hn::Set(d, m_use);
  auto vsum = hn::Zero(d);
  for (int64_t j = 0; j < n; j += NL) {
    const auto p = ExpKeepNaN(d, hn::Sub(hn::LoadU(d, s + j), vm));
    hn::StoreU(p, d, s + j);
    vsum = hn::Add(vsum, p);
  }
  const T alpha = std::exp(m - m_use);
  l = l * alpha + hn::GetLane(hn::SumOfLanes(d, vsum));
  m = m_new;
  return alpha;
}

// row[0:n] *= f
template <class T>
HWY_INLINE void ScaleRow(T* HWY_RESTRICT row, int64_t n, T f) {
  const Tag<T> d;
  const int64_t NL = int64_t(hn::Lanes(d));
  const auto vf = hn::Set(d, f);
  for (int64_t j = 0; j < n; j += NL) hn::StoreU(hn::Mul(hn::LoadU(d, row + j), vf), d, row + j);
}

}  // namespace HWY_NAMESPACE
}  // namespace rotary::attn
HWY_AFTER_NAMESPACE();

#endif  // ROTARY_ATTENTION_KERNELS_INL_H_
