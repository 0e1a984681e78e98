// core/src/linear_q8_avx2.cpp: linear_forward's products with q8 weights and q8 activations (ActivationFormat::Q8)
// on AVX2's byte products, for x86 CPUs without AVX512-VNNI (Zen 3 and most desktop and laptop CPUs).
// vpmaddubsw multiplies 32 unsigned bytes by 32 signed bytes and adds neighbouring pairs into 16 int16 lanes
// (saturating), and vpmaddwd with ones adds neighbouring int16 pairs into 8 int32 lanes: one block of kQ8Block = 32
// products in three instructions, against four widenings, conversions and multiply-adds of each operand in float32
// lanes (linear_hwy.cpp's TileQ8). Highway 1.0.3 has no op for the pair, so this file uses the intrinsics in
// functions compiled for AVX2; linear_hwy.cpp calls them only at x86 targets from AVX2 up.
//
// The arithmetic: the left operand is unsigned, so the weights enter as |w| and x's quants take w's sign (vpsignb:
// w x = |w| (x sign(w)); byte_products_avx2.h SignedSums): exact for every weight byte, -128 included (a GGUF file's
// Q8_0 quants, split bit for bit into q8 weights, may hold it; quantize_q8 never makes it). A pair's sum is at most
// 2 x 128 x 127 = 32512 in magnitude, below int16's saturation, so every lane is exact. Lane i of a block holds the exact sum of
// the products at columns 4i..4i+3 of the block; it is converted to float (exact, below 2^24), multiplied by the
// product of the weight block's scale and the activation block's (one rounding, in float) and added into the
// accumulator (one more). The same terms as the VNNI kernel's lanes within a block; 8 lanes instead of 16, so the
// sums differ from it (and from TileQ8) only in rounding. Every (token, row) sum has its own accumulator and the same
// sequence of operations in every tile shape, so the tile shape - and so what else is batched - changes no bit.
// A row's last block, when the columns end inside it, is read through a zeroed copy (nothing read past the row's
// end); x's quants are zero past the columns.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "linear_kernel.h"

#include "byte_products_avx2.h"

namespace rotary::linear_detail {

#if ROTARY_BYTE_PRODUCTS_AVX2

namespace {

using namespace avx2;

constexpr int kScaleGroup = 8;  // blocks whose scale products are made in one vector

// sums[t][r] = dot(row r, token t) for NT tokens of xq from t0 and NR rows at w + r * ws, their scales (f16 bits) at
// scales + r * ss; K columns.
template <int NT, int NR>
ROTARY_AVX2_TARGET inline void Tile(const int8_t* w, int64_t ws, const uint16_t* scales, int64_t ss,
                                       const Q8Activations& xq, int64_t t0, int64_t K, float* sums) {
  __m256 acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_setzero_ps();
  const int64_t blocks = xq.blocks, whole = K / kQ8Block;
  alignas(32) float scale[NT][NR][kScaleGroup];
  alignas(32) int8_t last[NR][kQ8Block];
  for (int64_t g = 0; g < blocks; g += kScaleGroup) {
    // The weight scale x activation scale products of blocks g.. (one rounding each, in float, as a scalar product)
    const int64_t n = std::min<int64_t>(kScaleGroup, blocks - g);
    __m256 sx[NT];
    for (int t = 0; t < NT; ++t) {
      const float* from = xq.scales + (t0 + t) * blocks + g;
      if (n == kScaleGroup) {
        sx[t] = _mm256_loadu_ps(from);
      } else {  // the row's last group: past its blocks, 0 (never read)
        alignas(32) float group[kScaleGroup] = {};
        for (int64_t i = 0; i < n; ++i) group[i] = from[i];
        sx[t] = _mm256_load_ps(group);
      }
    }
    for (int r = 0; r < NR; ++r) {
      const uint16_t* from = scales + r * ss + g;
      __m128i bits;
      if (n == kScaleGroup) {
        bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from));
      } else {
        alignas(16) uint16_t group[kScaleGroup] = {};
        for (int64_t i = 0; i < n; ++i) group[i] = from[i];
        bits = _mm_load_si128(reinterpret_cast<const __m128i*>(group));
      }
      const __m256 sw = _mm256_cvtph_ps(bits);
      for (int t = 0; t < NT; ++t) _mm256_store_ps(scale[t][r], _mm256_mul_ps(sw, sx[t]));
    }
    for (int64_t b = g; b < g + n; ++b) {
      const int64_t c = b * kQ8Block;
      __m256i wv[NR], wa[NR];
      if (b < whole) {
        for (int r = 0; r < NR; ++r) wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * ws + c));
      } else {  // the row's last columns
        for (int r = 0; r < NR; ++r) {
          std::memset(last[r], 0, sizeof(last[r]));
          std::memcpy(last[r], w + r * ws + c, size_t(K - c));
          wv[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(last[r]));
        }
      }
      for (int r = 0; r < NR; ++r) wa[r] = _mm256_abs_epi8(wv[r]);
      for (int t = 0; t < NT; ++t) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.quants + (t0 + t) * xq.stride + c));
        for (int r = 0; r < NR; ++r)
          acc[t][r] = _mm256_fmadd_ps(SignedSums(wa[r], wv[r], xv, _mm256_set1_epi16(1)), _mm256_broadcast_ss(&scale[t][r][b - g]), acc[t][r]);
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) sums[t * NR + r] = SumOfLanes(acc[t][r]);
}

template <int NT, int NR>
ROTARY_AVX2_TARGET inline void TileAt(const Job& j, int64_t t0, int64_t r0) {
  float sums[NT * NR];
  Tile<NT, NR>(static_cast<const int8_t*>(j.w) + r0 * j.row_stride, j.row_stride, j.scales + r0 * j.scale_stride,
               j.scale_stride, j.xq, t0, j.cols, sums);
  store_tile(j, t0, r0, NT, NR, sums);
}

}  // namespace

bool q8_avx2_supported() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return has;
}

ROTARY_AVX2_TARGET void q8_avx2_block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  if (t1 - t0 > kSmallBatch) return q8_avx2_panels(j, t0, t1, r0, r1);  // prefill: the same bits, 8 rows a register
  RowByRow(t0, t1, r0, r1, [&]<int NT, int NR>(int64_t t, int64_t r) { TileAt<NT, NR>(j, t, r); });
}

#else

bool q8_avx2_supported() { return false; }
void q8_avx2_block(const Job&, int64_t, int64_t, int64_t, int64_t) {}  // never called: q8_avx2_supported() is false

#endif

}  // namespace rotary::linear_detail
