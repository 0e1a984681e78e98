// core/src/linear_bf16_dot.cpp: linear_forward's products with bf16 weights and bf16 activations
// (ActivationFormat::BF16) on AVX512-BF16's vdpbf16ps, which multiplies 32 pairs of bf16 values and adds each
// neighbouring pair of products into one of 16 float lanes: twice the multiply-adds of an f32 FMA per instruction,
// and no widening of the weights. Highway 1.0.3 has no op for it, so this file uses the intrinsic in functions
// compiled for that extension; linear_hwy.cpp calls them only at AVX-512 targets and only when the CPU reports
// AVX512-BF16 (bf16_dot_supported).
//
// The arithmetic: a product of two bf16 values is exact in float32; each lane adds its two products to its
// accumulator one after the other, rounding to nearest even each time, with bf16 subnormal inputs read as zero and
// subnormal results flushed to zero (the instruction's fixed mode) - so a result differs from the float32-lane
// kernel's only in the order and rounding of the sums (and by subnormals), within linear_forward's tolerance.
// Tiles as in linear_hwy.cpp: kRows weight rows x kTokens tokens of accumulators, and the tokens left (decode's one)
// row by row, one sequential stream of weights per thread (kRows at a time past kLongRowBytes). A row's columns past the last whole 32 are read by a
// masked load (zeros beyond the row's end, nothing read there).
#include <cstdint>

#include "linear_kernel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics pass a deliberately undefined vector as the unused source of their unmasked forms
// (shuffles, casts), which its -Wuninitialized then reports at every use: not a fault of the code here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define ROTARY_LINEAR_BF16_DOT 1
#else
#define ROTARY_LINEAR_BF16_DOT 0
#endif

namespace rotary::linear_detail {

#if ROTARY_LINEAR_BF16_DOT

namespace {

#define ROTARY_BF16_DOT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

constexpr int kRows = 4, kTokens = 4;  // 16 accumulators + 4 weight vectors + 1 activation vector of 32 registers
constexpr int64_t kLanes = 32;         // bf16 elements per 512-bit vector (one 64-byte cache line)

// The sums of the 16 lanes of each of n accumulators (n = 1, or a multiple of 4), every one in the same order - u_i =
// v_i + v_(i+8), then ((u0 + u1) + (u2 + u3)) + ((u4 + u5) + (u6 + u7)) - so a (token, row) sum has the same bits in
// every tile shape. Four accumulators at a time share their horizontal adds (hadd pairs lanes of two vectors): ~13
// instructions per 4 sums instead of ~9 per sum, which at 896-wide rows was ~1/4 of a 4 x 4 tile's time.
ROTARY_BF16_DOT_TARGET inline __m256 HalvesAdded(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
template <int N>
ROTARY_BF16_DOT_TARGET inline void SumsOfLanes(const __m512* acc, float* sums) {
  if constexpr (N == 1) {
    const __m256 u = HalvesAdded(acc[0]);
    const __m256 h = _mm256_hadd_ps(u, u);
    const __m256 h2 = _mm256_hadd_ps(h, h);
    sums[0] = _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h2), _mm256_extractf128_ps(h2, 1)));
  } else {
    static_assert(N % 4 == 0, "one accumulator, or groups of four");
    for (int i = 0; i < N; i += 4) {
      const __m256 h01 = _mm256_hadd_ps(HalvesAdded(acc[i]), HalvesAdded(acc[i + 1]));
      const __m256 h23 = _mm256_hadd_ps(HalvesAdded(acc[i + 2]), HalvesAdded(acc[i + 3]));
      const __m256 h = _mm256_hadd_ps(h01, h23);  // [a, b, c, d of the first halves | of the second halves]
      _mm_storeu_ps(sums + i, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    }
  }
}

template <int NT, int NR>
ROTARY_BF16_DOT_TARGET inline void DotTile(const uint16_t* w, int64_t ws, const uint16_t* x, int64_t xs, int64_t K,
                                           float* sums) {
  __m512 acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    __m512i wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = _mm512_loadu_si512(w + r * ws + k);
    for (int t = 0; t < NT; ++t) {
      const __m512i xv = _mm512_loadu_si512(x + t * xs + k);
      for (int r = 0; r < NR; ++r) acc[t][r] = _mm512_dpbf16_ps(acc[t][r], __m512bh(wv[r]), __m512bh(xv));
    }
  }
  if (k < K) {
    const __mmask32 m = __mmask32((uint64_t(1) << (K - k)) - 1);
    __m512i wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = _mm512_maskz_loadu_epi16(m, w + r * ws + k);
    for (int t = 0; t < NT; ++t) {
      const __m512i xv = _mm512_maskz_loadu_epi16(m, x + t * xs + k);
      for (int r = 0; r < NR; ++r) acc[t][r] = _mm512_dpbf16_ps(acc[t][r], __m512bh(wv[r]), __m512bh(xv));
    }
  }
  SumsOfLanes<NT * NR>(&acc[0][0], sums);
}

template <int NT, int NR>
ROTARY_BF16_DOT_TARGET inline void DotTileAt(const Job& j, int64_t t0, int64_t r0) {
  float sums[NT * NR];
  DotTile<NT, NR>(static_cast<const uint16_t*>(j.w) + r0 * j.row_stride, j.row_stride, j.xb + t0 * j.cols, j.cols,
                  j.cols, sums);
  store_tile(j, t0, r0, NT, NR, sums);
}

}  // namespace

bool bf16_dot_supported() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return has;
}

ROTARY_BF16_DOT_TARGET void bf16_dot_block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  const int64_t tiled = t0 + (t1 - t0) / kTokens * kTokens;
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows)
    for (int64_t t = t0; t < tiled; t += kTokens) DotTileAt<kTokens, kRows>(j, t, r);
  for (; r < r1; ++r)
    for (int64_t t = t0; t < tiled; t += kTokens) DotTileAt<kTokens, 1>(j, t, r);
  r = r0;
  if (j.cols * 2 > kLongRowBytes)
    for (; r + kRows <= r1; r += kRows)
      for (int64_t t = tiled; t < t1; ++t) DotTileAt<1, kRows>(j, t, r);
  for (; r < r1; ++r)
    for (int64_t t = tiled; t < t1; ++t) DotTileAt<1, 1>(j, t, r);
}

#else

bool bf16_dot_supported() { return false; }
void bf16_dot_block(const Job&, int64_t, int64_t, int64_t, int64_t) {}  // never called: bf16_dot_supported() is false

#endif

}  // namespace rotary::linear_detail
