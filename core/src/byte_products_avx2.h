// core/src/byte_products_avx2.h (internal): what the x86 byte-product kernels share - linear_q8_avx2.cpp (q8
// weights) and linear_blocks-inl.h (llama.cpp's block formats, compiled for AVX2 and for AVX512-VNNI), all with q8
// activations: the AVX2 target, their small-batch order, a block's exact integer sums and the fixed-order lane sum.
// x86-64 with GCC or Clang only (ROTARY_BYTE_PRODUCTS_AVX2); elsewhere the kernels compile to nothing and are never
// called.
#pragma once

#include <cstdint>

#include "linear_kernel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ROTARY_BYTE_PRODUCTS_AVX2 1
#define ROTARY_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

namespace rotary::linear_detail::avx2 {

// A small batch (decode's one token, a few sequences' steps: up to kSmallBatch tokens, linear_kernel.h) runs row by
// row, up to kTokens tokens against a row at a time (each row's units unpacked once for them; the block formats'
// batches of 3 or more take all their tokens at once in LaneTile, linear_blocks-inl.h); more tokens go in panels of
// kPanelRows rows (linear_blocks-inl.h). Panels from 5 tokens on were tried (2026-11-29, Zen 4): rows of
// 152 units 15-35% faster in the 32-value formats, but rows of 32 units (Qwen2.5-0.5B's) up to 20% slower at 5-6
// tokens in Q8_0 and 2x slower in the k-quants. 2026-11-29, Zen 4, 2 threads, 4864x1024 (/tmp A/B of the two
// builds' libraries, 3 alternated rounds, best of each): 4 tokens a tile against 2 took 4 tokens 279-453 -> 235-331
// us over Q4_0, Q5_0, Q4_K and Q6_K, 8 tokens 549-834 -> 481-714 (AVX2 target: 4 tokens 283-411 -> 261-346).
constexpr int kTokens = 4;

// The 8 lanes' sum, in a fixed order of adds.
ROTARY_AVX2_TARGET inline float SumOfLanes(__m256 v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
  return _mm_cvtss_f32(q);
}

// The exact sums of signed weight bytes w (wa = |w|, made once per row) times x's quants xv, lane i: the products at
// bytes 4i..4i+3, each pair of neighbours weighted by pair_weights' int16 lane (ones, or Q6_K's sub-block scales).
// vpmaddubsw takes an unsigned left operand, so w enters as |w| and x takes w's sign (vpsignb: w x = |w| (x sign(w))).
// That way round every weight byte is exact, -128 included (|-128| is 128 unsigned; a GGUF file's Q8_0 quants may
// hold it, though llama.cpp's quantizer never writes it), and x, our own quantizer's, is within +-127, so its
// negation never overflows. A pair's sum is at most 2 x 128 x 127 = 32512, below int16's saturation.
ROTARY_AVX2_TARGET inline __m256 SignedSums(__m256i wa, __m256i w, __m256i xv, __m256i pair_weights) {
  const __m256i pairs = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(xv, w));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, pair_weights));
}

// Tokens [t0, t1) (a small batch) x rows [r0, r1) row by row, each thread's weights one sequential stream, through
// tile(t, r, NT, NR) calls: kTokens x 1 while that many are left, then 2 x 1 and 1 x 1 for the rest.
template <class TileAt>
ROTARY_AVX2_TARGET inline void RowByRow(int64_t t0, int64_t t1, int64_t r0, int64_t r1, TileAt tile) {
  static_assert(kTokens == 4, "the tiles below are 4, 2 and 1 tokens");
  for (int64_t r = r0; r < r1; ++r) {
    int64_t t = t0;
    for (; t + kTokens <= t1; t += kTokens) tile.template operator()<kTokens, 1>(t, r);
    if (t + 2 <= t1) tile.template operator()<2, 1>(t, r), t += 2;
    if (t < t1) tile.template operator()<1, 1>(t, r);
  }
}

}  // namespace rotary::linear_detail::avx2
#else
#define ROTARY_BYTE_PRODUCTS_AVX2 0
#endif
