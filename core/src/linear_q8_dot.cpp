// core/src/linear_q8_dot.cpp: linear_forward's products with q8 weights and q8 activations (ActivationFormat::Q8)
// on AVX512-VNNI's vpdpbusd, which multiplies 64 unsigned bytes by 64 signed bytes and adds each group of four
// neighbouring products into one of 16 int32 lanes: two blocks of kQ8Block = 32 weights in one instruction, against
// eight widenings, conversions, scalings and multiply-adds in float32 lanes. Highway 1.0.3 has no op for it, so this
// file uses the intrinsic in functions compiled for that extension; linear_hwy.cpp calls them only at AVX-512 targets
// and only when the CPU reports AVX512-VNNI (q8_dot_supported).
//
// The arithmetic: the instruction's left operand is unsigned, so the weights enter as w + 128 (1..255: their bits
// with the top one flipped) and each lane starts from -128 times the sum of its four quants of x (made once per
// token when x is quantized), which leaves exactly the sum of the four products w x. A block's lane sums are
// integers below 2^16, exact in int32 and in float; lanes 0-7 hold the first block of a pair and 8-15 the second,
// so the converted lanes are multiplied by a vector of the two blocks' weight scale times activation scale (one
// rounding) and added into the accumulator (one more) - the same terms as linear_hwy.cpp's TileQ8 in other lanes
// and another order, so the results differ only in rounding. A row's last columns, past its last whole pair, are
// read by a masked load (nothing read past the row's end), where x's quants are zero; x's padding (to an even
// number of blocks) is zero, and a missing second block's scale is 0. Tiles as in linear_hwy.cpp: kRows weight rows
// x kTokens tokens of accumulators, and the tokens left (decode's one) row by row (kRows at a time past
// kLongRowBytes); every (token, row) sum has its own accumulator, so the tile shape changes no bit.
#include <algorithm>
#include <cstdint>

#include "linear_kernel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics pass a deliberately undefined vector as the unused source of their unmasked forms,
// which its -Wuninitialized then reports at every use: not a fault of the code here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define ROTARY_LINEAR_Q8_DOT 1
#else
#define ROTARY_LINEAR_Q8_DOT 0
#endif

namespace rotary::linear_detail {

#if ROTARY_LINEAR_Q8_DOT

namespace {

#define ROTARY_Q8_DOT_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

constexpr int kRows = 4, kTokens = 4;  // 16 accumulators + 4 weight vectors + 4 scale pairs of 32 registers

// The 16 lanes' sum, in a fixed order of vector adds.
ROTARY_Q8_DOT_TARGET inline float SumOfLanes(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));  // 256-bit halves swapped
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));  // 128-bit quarters swapped in pairs
  __m128 q = _mm512_castps512_ps128(v);
  q = _mm_add_ps(q, _mm_shuffle_ps(q, q, _MM_SHUFFLE(1, 0, 3, 2)));
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(q);
}

// Blocks b and b + 1's two scales (f16 bits, converted exactly) as one vector: lanes 0-7 the first, 8-15 the second
// (0 past the row's blocks).
ROTARY_Q8_DOT_TARGET inline __m512 ScalePair(const uint16_t* s, int64_t b, int64_t blocks) {
  const __m512 first = _mm512_set1_ps(_cvtsh_ss(s[b]));
  return b + 1 < blocks ? _mm512_mask_broadcastss_ps(first, 0xFF00, _mm_set_ss(_cvtsh_ss(s[b + 1])))
                        : _mm512_maskz_mov_ps(0x00FF, first);
}

// acc[t][r] += blocks b and b + 1's sums of row r and token t, each times its two scales; wu holds the rows' 64
// quants of the two blocks plus 128, as unsigned bytes (128 past the row's end, where x's quants are zero).
template <int NT, int NR>
ROTARY_Q8_DOT_TARGET inline void Q8Pair(const __m512i* wu, const uint16_t* scales, int64_t ss, int64_t blocks,
                                        const Q8Activations& xq, int64_t t0, int64_t b, __m512 (&acc)[NT][NR]) {
  __m512 sw[NR];
  for (int r = 0; r < NR; ++r) sw[r] = ScalePair(scales + r * ss, b, blocks);
  for (int t = 0; t < NT; ++t) {
    const int64_t at = (t0 + t) * xq.stride + b * kQ8Block;  // the pair's first quant
    const __m512i xv = _mm512_loadu_si512(xq.quants + at);
    const __m512i correction = _mm512_loadu_si512(xq.corrections + at / 4);
    const __m512 sx = _mm512_loadu_ps(xq.scale_pairs + at / 4);
    for (int r = 0; r < NR; ++r) {
      // sum of (w + 128) x - 128 sum of x = sum of w x, per lane of four products
      const __m512 s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(correction, wu[r], xv));
      acc[t][r] = _mm512_fmadd_ps(s, _mm512_mul_ps(sw[r], sx), acc[t][r]);
    }
  }
}

// sums[t][r] = dot(row r, token t) for NT tokens of xq from t0 and NR rows at w + r * ws with their scales at
// scales + r * ss; K columns, two blocks at a time.
template <int NT, int NR>
ROTARY_Q8_DOT_TARGET inline void Q8Tile(const int8_t* w, int64_t ws, const uint16_t* scales, int64_t ss,
                                        const Q8Activations& xq, int64_t t0, int64_t K, float* sums) {
  __m512 acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm512_setzero_ps();
  const int64_t whole = K / (2 * kQ8Block), blocks = xq.blocks;
  const __m512i bias = _mm512_set1_epi8(char(0x80));  // w + 128 as an unsigned byte: w's bits with the top one flipped
  for (int64_t p = 0; p < whole; ++p) {
    __m512i wu[NR];
    for (int r = 0; r < NR; ++r) wu[r] = _mm512_xor_si512(_mm512_loadu_si512(w + r * ws + p * 2 * kQ8Block), bias);
    Q8Pair<NT, NR>(wu, scales, ss, blocks, xq, t0, 2 * p, acc);
  }
  if (whole * 2 * kQ8Block < K) {  // the row's last columns, one or two blocks
    const __mmask64 m = _cvtu64_mask64((uint64_t(1) << (K - whole * 2 * kQ8Block)) - 1);
    __m512i wu[NR];
    for (int r = 0; r < NR; ++r)
      wu[r] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, w + r * ws + whole * 2 * kQ8Block), bias);
    Q8Pair<NT, NR>(wu, scales, ss, blocks, xq, t0, 2 * whole, acc);
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) sums[t * NR + r] = SumOfLanes(acc[t][r]);
}

// The same sums for one token (decode), NR rows: a pair's scale vector costs one permutation instead of two scalar
// conversions, two broadcasts and a product. Per group of 16 blocks (8 pairs), each row's 16 f16 scales are widened
// in one instruction and multiplied by x's 16 block scales (the same single rounding of weight scale x activation
// scale as Q8Pair's product, so the same bits); pair p's lanes are then blocks 2p (lanes 0-7) and 2p + 1 (8-15) of
// that vector. Scales past the row's blocks load as 0, as ScalePair's missing second block.
template <int NR>
ROTARY_Q8_DOT_TARGET inline void Q8Row(const int8_t* w, int64_t ws, const uint16_t* scales, int64_t ss,
                                       const Q8Activations& xq, int64_t t, int64_t K, float* sums) {
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t blocks = xq.blocks, pairs = (blocks + 1) / 2;
  const __m512i bias = _mm512_set1_epi8(char(0x80));
  const __m512i two = _mm512_set1_epi32(2);
  const __m512i first_pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const int8_t* xrow = xq.quants + t * xq.stride;
  const int32_t* crow = xq.corrections + t * xq.stride / 4;
  const float* xscale = xq.scales + t * blocks;
  for (int64_t g = 0; g < blocks; g += 16) {
    const int64_t n = std::min<int64_t>(16, blocks - g);
    const __mmask16 m = _cvtu32_mask16((1u << n) - 1);
    const __m512 sx = _mm512_maskz_loadu_ps(m, xscale + g);
    __m512 scale[NR];
    for (int r = 0; r < NR; ++r)
      scale[r] = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, scales + r * ss + g)), sx);
    __m512i idx = first_pair;
    for (int64_t p = g / 2; p < std::min(pairs, (g + 16) / 2); ++p, idx = _mm512_add_epi32(idx, two)) {
      const int64_t c = p * 2 * kQ8Block;  // the pair's first column
      const __m512i xv = _mm512_loadu_si512(xrow + c);
      const __m512i correction = _mm512_loadu_si512(crow + c / 4);
      __m512i wu[NR];
      if (c + 2 * kQ8Block <= K) {
        for (int r = 0; r < NR; ++r) wu[r] = _mm512_xor_si512(_mm512_loadu_si512(w + r * ws + c), bias);
      } else {  // the row's last columns (x's quants are zero past them)
        const __mmask64 mk = _cvtu64_mask64((uint64_t(1) << (K - c)) - 1);
        for (int r = 0; r < NR; ++r) wu[r] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, w + r * ws + c), bias);
      }
      for (int r = 0; r < NR; ++r) {
        const __m512 sum = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(correction, wu[r], xv));
        acc[r] = _mm512_fmadd_ps(sum, _mm512_permutexvar_ps(idx, scale[r]), acc[r]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) sums[r] = SumOfLanes(acc[r]);
}

template <int NT, int NR>
ROTARY_Q8_DOT_TARGET inline void Q8TileAt(const Job& j, int64_t t0, int64_t r0) {
  float sums[NT * NR];
  if constexpr (NT == 1) {
    Q8Row<NR>(static_cast<const int8_t*>(j.w) + r0 * j.row_stride, j.row_stride, j.scales + r0 * j.scale_stride,
              j.scale_stride, j.xq, t0, j.cols, sums);
    store_tile(j, t0, r0, NT, NR, sums);
    return;
  }
  Q8Tile<NT, NR>(static_cast<const int8_t*>(j.w) + r0 * j.row_stride, j.row_stride, j.scales + r0 * j.scale_stride,
                 j.scale_stride, j.xq, t0, j.cols, sums);
  store_tile(j, t0, r0, NT, NR, sums);
}

}  // namespace

bool q8_dot_supported() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return has;
}

ROTARY_Q8_DOT_TARGET void q8_dot_block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  const int64_t tiled = t0 + (t1 - t0) / kTokens * kTokens;
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows)
    for (int64_t t = t0; t < tiled; t += kTokens) Q8TileAt<kTokens, kRows>(j, t, r);
  for (; r < r1; ++r)
    for (int64_t t = t0; t < tiled; t += kTokens) Q8TileAt<kTokens, 1>(j, t, r);
  r = r0;
  if (j.cols > kLongRowBytes)
    for (; r + kRows <= r1; r += kRows)
      for (int64_t t = tiled; t < t1; ++t) Q8TileAt<1, kRows>(j, t, r);
  for (; r < r1; ++r)
    for (int64_t t = tiled; t < t1; ++t) Q8TileAt<1, 1>(j, t, r);
}

#else

bool q8_dot_supported() { return false; }
void q8_dot_block(const Job&, int64_t, int64_t, int64_t, int64_t) {}  // never called: q8_dot_supported() is false

#endif

}  // namespace rotary::linear_detail
