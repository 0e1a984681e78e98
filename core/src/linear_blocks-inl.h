// core/src/linear_blocks-inl.h (internal): linear_forward's products of llama.cpp's block formats (WeightFormat::Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, read in place) with q8 activations on x86's byte products, compiled twice:
// for AVX2 (linear_blocks_avx2.cpp: AVX2 targets, and AVX-512 ones of a CPU without VNNI) and for AVX512-VNNI
// (linear_blocks_vnni.cpp: AVX-512 targets of a CPU with it, where vpdpbusd sums four byte products into a lane in
// one instruction - the same 256-bit lanes, so the same bits). The including file defines ROTARY_BLOCKS_TARGET (the
// functions' target attribute) and ROTARY_BLOCKS_VNNI (0 or 1) and includes it once. As llama.cpp's own CPU products
// do: the weights stay in their blocks, each unit
// of 32 weights is unpacked into 32 bytes in registers (nibbles masked and shifted, Q5_0's, Q5_1's, Q5_K's and
// Q6_K's high bits merged), and its products with x's quants are summed exactly as integers (vpmaddubsw into int16
// pairs, vpmaddwd into 8 int32 lanes; or vpdpbusd), then scaled in float. Highway 1.0.3 has no op for the byte
// products, so this file uses the intrinsics.
//
// Per unit u of a row and token t (x = sx qx, block u of x's q8 quants):
//   Q8_0, Q4_0, Q5_0  w = d q (Q4_0: q = nibble - 8; Q5_0: q = nibble + 16 x fifth bit - 16):
//                                                        sum w x = (d sx) sum q qx
//   Q4_1, Q5_1        w = d q + m, q >= 0:               sum w x = (d sx) sum q qx + m (sx sum qx)
//   Q4_K, Q5_K        w = (d sc) q - (dmin m), q >= 0:   sum w x = (d sc sx) sum q qx - (dmin m) (sx sum qx)
//   Q6_K              w = d sc_s (q - 32), two sub-blocks s: sum w x = (d sx) sum_s sc_s sum q qx
// Signed quants (Q8_0, Q4_0, Q5_0, Q6_K) enter vpmaddubsw as |q| against qx with q's sign (exact for a Q8_0 quant
// of -128 too: byte_products_avx2.h SignedSums); unsigned ones (Q4_1's
// and Q5_1's, the k-quants' 4- and 5-bit q, all <= 31) as they are, against qx. Every pair sum is below int16's
// saturation (2 x 127 x 128; unsigned: 2 x 31 x 127), every lane sum below 2^24 (Q6_K's sub-block scales enter
// through vpmaddwd's second operand: |sum| <= 2 x 8128 x 128), so the integer sums are exact and convert to float
// exactly. Each unit's lanes are then multiplied by the unit's scale product (one rounding) and added into the
// (token, row)'s accumulator (one more); the min term of the formats with one (Q4_1, Q5_1, Q4_K, Q5_K) is summed
// apart, one fused multiply-add per unit, and subtracted at the end - the unit's min is dmin m for the k-quants and
// -m for Q4_1 / Q5_1, whose min is added. The same sequence of operations for every tile shape, so what else is
// batched changes no bit; the terms are those of the float64 reference, so results differ from it only in rounding
// (tests/core/cases_linear.cpp).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "block_weights.h"
#include "linear_kernel.h"

#include "byte_products_avx2.h"

#if !defined(ROTARY_BLOCKS_TARGET) || !defined(ROTARY_BLOCKS_VNNI) || !ROTARY_BYTE_PRODUCTS_AVX2
#error "include linear_blocks-inl.h once, on x86-64, with ROTARY_BLOCKS_TARGET and ROTARY_BLOCKS_VNNI defined"
#endif

namespace rotary::linear_detail {
namespace {

using namespace avx2;

ROTARY_BLOCKS_TARGET inline float F16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// A block's scales, decoded once for its units: unit i's integer sums are multiplied by scale[i]; the formats with a
// min have min[i], subtracted times x's block sum (Q4_K, Q5_K: dmin m; Q4_1, Q5_1: -m); Q6_K's 16 sub-block scales
// stay as int8 (sub_scales) for vpmaddwd.
template <WeightFormat F>
struct BlockScales {
  static constexpr int kUnits = int(weight_block_size(F) / kUnit);
  float scale[kUnits] = {}, min[kUnits] = {};
  const int8_t* sub_scales = nullptr;
};

template <WeightFormat F>
ROTARY_BLOCKS_TARGET inline void DecodeScales(const uint8_t* b, BlockScales<F>& s) {
  if constexpr (F == WeightFormat::Q8_0 || F == WeightFormat::Q4_0 || F == WeightFormat::Q5_0) {
    s.scale[0] = F16(b);
  } else if constexpr (F == WeightFormat::Q4_1 || F == WeightFormat::Q5_1) {
    s.scale[0] = F16(b);
    s.min[0] = -F16(b + 2);  // the min term is subtracted (the k-quants' sign): -m adds m
  } else if constexpr (F == WeightFormat::Q4_K || F == WeightFormat::Q5_K) {
    // The 12 packed bytes as three words, rearranged into the 8 scales (words 0-1) and 8 mins (words 2-3) as bytes,
    // a few word operations instead of 16 scalar unpackings (k_scale_min's packing: low six bits of bytes 0-7, the
    // rest from the nibbles of bytes 8-11 and the top two bits of bytes 0-7), then widened 8 at a time.
    uint32_t w[4];
    std::memcpy(w, b + 4, 12);
    constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
    w[3] = ((w[2] >> 4) & kLow4) | (((w[1] >> 6) & kLow2) << 4);
    const uint32_t mins_low = w[1] & kLow6;
    w[1] = (w[2] & kLow4) | (((w[0] >> 6) & kLow2) << 4);
    w[2] = mins_low;
    w[0] &= kLow6;
    const __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w)));
    const __m256i m = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + 2)));
    _mm256_storeu_ps(s.scale, _mm256_mul_ps(_mm256_set1_ps(F16(b)), _mm256_cvtepi32_ps(sc)));
    _mm256_storeu_ps(s.min, _mm256_mul_ps(_mm256_set1_ps(F16(b + 2)), _mm256_cvtepi32_ps(m)));
  } else {  // Q6_K
    const float d = F16(b + 208);
    for (int j = 0; j < 8; ++j) s.scale[j] = d;
    s.sub_scales = reinterpret_cast<const int8_t*>(b + 192);
  }
}

// The 32 nibbles of a 32-value block's qs[16] as bytes: value j < 16 the low nibble of qs[j], value j + 16 its high
// one (Q4_0, Q4_1, Q5_0, Q5_1).
ROTARY_BLOCKS_TARGET inline __m256i Nibbles32(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low4), _mm_and_si128(v, low4));
}

// Q5_0's and Q5_1's fifth bits as 16 or 0 in byte j, from qh's 4 bytes (bit j of the little-endian uint32 is value
// j's): each byte j gets qh's byte j / 8 (a shuffle within each 128-bit half of the broadcast word), keeps its bit
// j % 8, and is compared with that bit (0xFF where set), then masked to 0x10.
ROTARY_BLOCKS_TARGET inline __m256i FifthBits(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i byte_of = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(int32_t(bits)), byte_of);
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

constexpr bool Signed(WeightFormat f) {
  return f != WeightFormat::Q4_1 && f != WeightFormat::Q5_1 && f != WeightFormat::Q4_K && f != WeightFormat::Q5_K;
}
constexpr bool HasMin(WeightFormat f) { return !Signed(f); }

// With VNNI (ROTARY_BLOCKS_VNNI), the quants that are an unsigned byte minus a fixed offset - Q4_0's nibbles minus 8,
// Q5_0's five bits minus 16 - enter vpdpbusd unsigned, against x's quants as they are, and the lane's sum starts
// from minus the offset times x's four quants of the lane:
// Q8Activations::corrections holds -128 times those four quants' sum, so shifted right by OffsetShift it is -offset
// times it (exact: a multiple of 128). The lane is then sum_4 u qx - offset sum_4 qx = sum_4 (u - offset) qx, the
// integer the signed products give, so the same bits - for one vpdpbusd a unit and token in place of the signed
// products' vpsignb, vpmaddubsw and vpmaddwd (and their vpabsb and vpsubb a unit and row). Q6_K (its sub-block scales
// are vpmaddwd's operand) and Q8_0 keep the signed products: Q8_0 as q + 128 (q xor 0x80) from a start of -128 sum_4
// qx, or on vpdpbusd with the sign, decoded 5-10% slower than on vpmaddubsw (2026-11-29, Zen 4, 0.5B shape, 2
// threads, alternated runs; its prefill 3% faster). Without VNNI the byte form saves nothing: the correction's add
// costs what the sign did.
constexpr int OffsetShift(WeightFormat f) {
  return f == WeightFormat::Q4_0 ? 4 : f == WeightFormat::Q5_0 ? 3 : -1;
}
constexpr bool Offset(WeightFormat f) { return ROTARY_BLOCKS_VNNI && OffsetShift(f) >= 0; }

// start + the 8 int32 lanes of sum_4 u qx, u unsigned: one vpdpbusd with VNNI; without, vpmaddubsw's pairs (below
// int16's saturation for u <= 31: 2 x 31 x 127) summed by vpmaddwd (the add of a zero start folds away).
ROTARY_BLOCKS_TARGET inline __m256i UnsignedSums(__m256i start, __m256i u, __m256i xv) {
#if ROTARY_BLOCKS_VNNI
  return _mm256_dpbusd_epi32(start, u, xv);
#else
  return _mm256_add_epi32(start, _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), _mm256_set1_epi16(1)));
#endif
}

// -offset x (x's four quants' sum) for lanes 8u..8u+7 of token t (Offset formats).
template <WeightFormat F>
ROTARY_BLOCKS_TARGET inline __m256i OffsetStart(const Job& j, int64_t t, int64_t u) {
  const int32_t* c = j.xq.corrections + t * (j.xq.stride / 4) + u * 8;
  return _mm256_srai_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)), OffsetShift(F));
}

// Unit i of block b: its 32 quants as bytes (signed for Q8_0 / Q4_0 / Q5_0 / Q6_K, unsigned for Q4_1 / Q5_1 / Q4_K /
// Q5_K; with VNNI, Q4_0's and Q5_0's as unsigned bytes before their offset: Offset).
template <WeightFormat F>
ROTARY_BLOCKS_TARGET inline __m256i UnpackQuants(const uint8_t* b, int i) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  if constexpr (F == WeightFormat::Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
  } else if constexpr (F == WeightFormat::Q4_0) {
    return Offset(F) ? Nibbles32(b + 2) : _mm256_sub_epi8(Nibbles32(b + 2), _mm256_set1_epi8(8));
  } else if constexpr (F == WeightFormat::Q4_1) {
    return Nibbles32(b + 4);
  } else if constexpr (F == WeightFormat::Q5_0) {  // f16 d, qh[4], qs[16]
    const __m256i q = _mm256_or_si256(Nibbles32(b + 6), FifthBits(b + 2));
    return Offset(F) ? q : _mm256_sub_epi8(q, _mm256_set1_epi8(16));
  } else if constexpr (F == WeightFormat::Q5_1) {  // f16 d, f16 m, qh[4], qs[16]
    return _mm256_or_si256(Nibbles32(b + 8), FifthBits(b + 4));
  } else if constexpr (F == WeightFormat::Q4_K || F == WeightFormat::Q5_K) {
    constexpr bool kFive = F == WeightFormat::Q5_K;
    __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + (kFive ? 48 : 16) + 32 * (i / 2)));
    if (i % 2) q = _mm256_srli_epi16(q, 4);
    q = _mm256_and_si256(q, low4);
    if constexpr (kFive) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
      const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(i)), _mm256_set1_epi8(1));
      q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
    }
    return q;
  } else {  // Q6_K
    const int h = i / 4, g = i % 4;
    __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (g & 1)));
    if (g >= 2) lo = _mm256_srli_epi16(lo, 4);
    lo = _mm256_and_si256(lo, low4);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
    return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
  }
}

// sums[t][r] = dot(row r, token t) for NT tokens of xq from t0 and NR rows from row r0.
template <WeightFormat F, int NT, int NR>
ROTARY_BLOCKS_TARGET inline void Tile(const Job& j, int64_t t0, int64_t r0, float* sums) {
  constexpr int kUnits = BlockScales<F>::kUnits;
  constexpr int64_t kBytes = weight_block_bytes(F);
  __m256 acc[NT][NR];
  float min_sum[NT][NR] = {};
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_setzero_ps();
  const uint8_t* rows[NR];
  for (int r = 0; r < NR; ++r) rows[r] = block_row(F, j.w, j.row_stride, r0 + r);
  const int64_t blocks = j.cols / weight_block_size(F);
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < blocks; ++b) {
    BlockScales<F> scales[NR];
    for (int r = 0; r < NR; ++r) DecodeScales<F>(rows[r] + b * kBytes, scales[r]);
    for (int i = 0; i < kUnits; ++i) {
      const int64_t u = b * kUnits + i;  // the unit's index along the row: x's block
      __m256i q[NR], qa[NR], pair_weights[NR];
      for (int r = 0; r < NR; ++r) {
        q[r] = UnpackQuants<F>(rows[r] + b * kBytes, i);
        if constexpr (Signed(F) && !Offset(F)) qa[r] = _mm256_abs_epi8(q[r]);
        if constexpr (F == WeightFormat::Q6_K)
          pair_weights[r] = _mm256_set_m128i(_mm_set1_epi16(scales[r].sub_scales[2 * i + 1]),
                                             _mm_set1_epi16(scales[r].sub_scales[2 * i]));
        else
          pair_weights[r] = ones16;
      }
      for (int t = 0; t < NT; ++t) {
        const int64_t at = (t0 + t) * j.xq.stride + u * kUnit;
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(j.xq.quants + at));
        const float sx = j.xq.scales[(t0 + t) * j.xq.blocks + u];
        if constexpr (Offset(F)) {
          const __m256i start = OffsetStart<F>(j, t0 + t, u);
          for (int r = 0; r < NR; ++r) {
            acc[t][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(UnsignedSums(start, q[r], xv)),
                                        _mm256_set1_ps(scales[r].scale[i] * sx), acc[t][r]);
          }
        } else if constexpr (Signed(F)) {
          for (int r = 0; r < NR; ++r) {
            acc[t][r] = _mm256_fmadd_ps(SignedSums(qa[r], q[r], xv, pair_weights[r]),
                                        _mm256_set1_ps(scales[r].scale[i] * sx), acc[t][r]);
          }
        } else {
          const float xs = j.xq.scaled_sums[(t0 + t) * j.xq.blocks + u];  // the min term's activation side
          for (int r = 0; r < NR; ++r) {
            const __m256 lanes = _mm256_cvtepi32_ps(UnsignedSums(_mm256_setzero_si256(), q[r], xv));
            acc[t][r] = _mm256_fmadd_ps(lanes, _mm256_set1_ps(scales[r].scale[i] * sx), acc[t][r]);
            min_sum[t][r] = std::fma(scales[r].min[i], xs, min_sum[t][r]);
          }
        }
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r)
      sums[t * NR + r] = HasMin(F) ? SumOfLanes(acc[t][r]) - min_sum[t][r] : SumOfLanes(acc[t][r]);
}

template <WeightFormat F, int NT, int NR>
ROTARY_BLOCKS_TARGET inline void TileAt(const Job& j, int64_t t0, int64_t r0) {
  float sums[NT * NR];
  Tile<F, NT, NR>(j, t0, r0, sums);
  store_tile(j, t0, r0, NT, NR, sums);
}

// Prefill: a panel of kPanelRows rows, its units unpacked once per token chunk and transposed so that one register
// holds bytes 4g..4g+3 of unit u for each of the 8 rows (32-bit lane r: row r). A token's bytes 4g..4g+3, broadcast,
// then meet all 8 rows in one vpmaddubsw, and lane r of the 8 int32 sums is exactly lane g of Tile's sums for row r;
// so accumulator g of the panel (lane r) takes exactly the operations of Tile's lane g of row r, in the same order,
// and the fixed-order lane sum becomes the same adds across the 8 accumulators: every bit equals Tile's and so the
// decode path's (BlockFormatsSameBitsForAnyThreadCountAndTokenBatching). The unpacking, 7-8 operations a unit and
// row in Tile for 2 tokens, is paid once per chunk (16-96 tokens), and the scales and the float work are per 8 rows:
// 2026-11-29, Zen 3, Q4_0 prefill 512 of the 0.5B shape, see docs/gguf.md.
constexpr int kSliceUnits = 32;  // units of a panel slice: 16 KB of unpacked bytes (signed formats), L1-resident

// One slice of a panel: for unit u, group g: the 8 rows' quant bytes q[u][g] (and |q| for the signed formats), the
// rows' unit scales and mins, and Q6_K's pair weights for the unit's two sub-blocks (lane r: row r's int16 scale,
// twice).
struct alignas(32) PanelSlice {
  __m256i q[kSliceUnits][8], qa[kSliceUnits][8];
  __m256i pair_weights[kSliceUnits][2];
  float scale[kSliceUnits][kPanelRows], min[kSliceUnits][kPanelRows];
};

// Lanes r of the result g: dword g of rows[r] (an 8 x 8 transpose of 32-bit lanes).
ROTARY_BLOCKS_TARGET inline void Transpose8x8(const __m256i* rows, __m256i* out) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);      // dwords 0, 1 | 4, 5 of rows 2i, 2i+1
    t[2 * i + 1] = _mm256_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);  // dwords 2, 3 | 6, 7
  }
  for (int h = 0; h < 2; ++h) {  // rows 4h..4h+3
    u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);  // dword 0 | 4
    u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);  // dword 1 | 5
    u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);  // dword 2 | 6
    u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);  // dword 3 | 7
  }
  for (int g = 0; g < 4; ++g) {
    out[g] = _mm256_permute2x128_si256(u[g], u[4 + g], 0x20);
    out[g + 4] = _mm256_permute2x128_si256(u[g], u[4 + g], 0x31);
  }
}

// Unit u of row `row` as 32 bytes, with its scale, min and (Q6_K) two sub-block scales. rotary's q8
// (WeightFormat::Q8, linear_q8_avx2.cpp's Tile): the row's int8 weights at w + row x row_stride, one f16 scale per 32
// columns at scales + row x scale_stride, the row's last unit zero-padded where the columns end inside it (x's quants
// are zero there too); the block formats as Tile unpacks them.
template <WeightFormat F>
ROTARY_BLOCKS_TARGET inline __m256i RowUnit(const Job& j, int64_t row, int64_t u, float& scale, float& min,
                                          int16_t sub[2]) {
  if constexpr (F == WeightFormat::Q8) {
    const int8_t* w = static_cast<const int8_t*>(j.w) + row * j.row_stride;
    const int64_t c = u * kUnit;
    scale = _cvtsh_ss(j.scales[row * j.scale_stride + u]);
    if (c + kUnit <= j.cols) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c));
    alignas(32) int8_t last[kUnit] = {};
    std::memcpy(last, w + c, size_t(j.cols - c));
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(last));
  } else {
    constexpr int kUnits = BlockScales<F>::kUnits;
    const uint8_t* block = block_row(F, j.w, j.row_stride, row) + u / kUnits * weight_block_bytes(F);
    const int i = int(u % kUnits);
    BlockScales<F> scales;
    DecodeScales<F>(block, scales);
    scale = scales.scale[i], min = scales.min[i];
    if constexpr (F == WeightFormat::Q6_K) sub[0] = scales.sub_scales[2 * i], sub[1] = scales.sub_scales[2 * i + 1];
    return UnpackQuants<F>(block, i);
  }
}

// Units [u0, u0 + count) of rows [r0, r0 + nr) into the slice; rows past nr are zeros (their sums are not stored).
template <WeightFormat F>
ROTARY_BLOCKS_TARGET void PackSlice(const Job& j, int64_t r0, int nr, int64_t u0, int count, PanelSlice& s) {
  for (int k = 0; k < count; ++k) {
    __m256i q[kPanelRows];
    int16_t sub[kPanelRows][2] = {};
    for (int r = 0; r < kPanelRows; ++r) {
      s.scale[k][r] = s.min[k][r] = 0.0f;
      q[r] = r < nr ? RowUnit<F>(j, r0 + r, u0 + k, s.scale[k][r], s.min[k][r], sub[r]) : _mm256_setzero_si256();
    }
    Transpose8x8(q, s.q[k]);
    if constexpr (Signed(F) && !Offset(F))
      for (int g = 0; g < 8; ++g) s.qa[k][g] = _mm256_abs_epi8(s.q[k][g]);
    if constexpr (F == WeightFormat::Q6_K)
      for (int h = 0; h < 2; ++h) {
        alignas(32) int16_t lanes[16];
        for (int r = 0; r < kPanelRows; ++r) lanes[2 * r] = lanes[2 * r + 1] = sub[r][h];
        s.pair_weights[k][h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
      }
  }
}

// A token's accumulators over a panel: acc[g] lane r is Tile's lane g of row r; min_sum lane r its min_sum.
struct alignas(32) PanelSums {
  __m256 acc[8], min_sum;
};

// Adds units [u0, u0 + count) of token t to its sums (Tile's operations, 8 rows a register).
template <WeightFormat F>
ROTARY_BLOCKS_TARGET inline void PanelToken(const Job& j, int64_t t, int64_t u0, int count, const PanelSlice& s,
                                          PanelSums& sums) {
  __m256 acc[8];
  for (int g = 0; g < 8; ++g) acc[g] = sums.acc[g];
  __m256 min_sum = sums.min_sum;
  const __m256i ones16 = _mm256_set1_epi16(1);
  const int8_t* xt = j.xq.quants + t * j.xq.stride;
  for (int k = 0; k < count; ++k) {
    const int64_t u = u0 + k;
    const float sx = j.xq.scales[t * j.xq.blocks + u];
    const __m256 scale = _mm256_mul_ps(_mm256_load_ps(s.scale[k]), _mm256_set1_ps(sx));
    const int8_t* xu = xt + u * kUnit;
    alignas(32) int32_t start[8];  // Offset formats: lane g's start, broadcast from memory (a load, no shift)
    if constexpr (Offset(F)) _mm256_store_si256(reinterpret_cast<__m256i*>(start), OffsetStart<F>(j, t, u));
    for (int g = 0; g < 8; ++g) {
      int32_t word;
      std::memcpy(&word, xu + 4 * g, 4);
      const __m256i xv = _mm256_set1_epi32(word);
      __m256i lanes;
      if constexpr (Offset(F)) {
        lanes = UnsignedSums(_mm256_set1_epi32(start[g]), s.q[k][g], xv);
      } else if constexpr (Signed(F)) {
        const __m256i pw = F == WeightFormat::Q6_K ? s.pair_weights[k][g / 4] : ones16;
        lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(s.qa[k][g], _mm256_sign_epi8(xv, s.q[k][g])), pw);
      } else {
        lanes = UnsignedSums(_mm256_setzero_si256(), s.q[k][g], xv);
      }
      acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scale, acc[g]);
    }
    if constexpr (HasMin(F))
      min_sum = _mm256_fmadd_ps(_mm256_load_ps(s.min[k]), _mm256_set1_ps(j.xq.scaled_sums[t * j.xq.blocks + u]),
                                min_sum);
  }
  for (int g = 0; g < 8; ++g) sums.acc[g] = acc[g];
  sums.min_sum = min_sum;
}

// Tokens [t0, t1) x rows [r0, r1) in panels of kPanelRows rows, each panel's units in slices of kSliceUnits.
template <WeightFormat F>
ROTARY_BLOCKS_TARGET void Panels(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  static thread_local std::vector<PanelSums> token_sums;
  static thread_local std::unique_ptr<PanelSlice> slice;
  if (!slice) slice = std::make_unique<PanelSlice>();
  if (token_sums.size() < size_t(t1 - t0)) token_sums.resize(size_t(t1 - t0));
  const int64_t units = F == WeightFormat::Q8 ? q8_blocks(j.cols) : j.cols / kUnit;
  for (int64_t p = r0; p < r1; p += kPanelRows) {
    const int nr = int(std::min<int64_t>(kPanelRows, r1 - p));
    for (int64_t t = t0; t < t1; ++t) {
      PanelSums& sums = token_sums[size_t(t - t0)];
      for (int g = 0; g < 8; ++g) sums.acc[g] = _mm256_setzero_ps();
      sums.min_sum = _mm256_setzero_ps();
    }
    for (int64_t u0 = 0; u0 < units; u0 += kSliceUnits) {
      const int count = int(std::min<int64_t>(kSliceUnits, units - u0));
      PackSlice<F>(j, p, nr, u0, count, *slice);
      for (int64_t t = t0; t < t1; ++t) PanelToken<F>(j, t, u0, count, *slice, token_sums[size_t(t - t0)]);
    }
    for (int64_t t = t0; t < t1; ++t) {
      const PanelSums& sums = token_sums[size_t(t - t0)];
      // SumOfLanes' order over the accumulators: ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)), then the min term.
      const __m256* a = sums.acc;
      __m256 total = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                                   _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
      if constexpr (HasMin(F)) total = _mm256_sub_ps(total, sums.min_sum);
      alignas(32) float out[kPanelRows];
      _mm256_store_ps(out, total);
      store_tile(j, t, p, 1, nr, out);
    }
  }
}

template <WeightFormat F>
ROTARY_BLOCKS_TARGET void Block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  if (t1 - t0 > kSmallBatch) return Panels<F>(j, t0, t1, r0, r1);
  RowByRow(t0, t1, r0, r1, [&]<int NT, int NR>(int64_t t, int64_t r) { TileAt<F, NT, NR>(j, t, r); });
}


// Tokens [t0, t1) x rows [r0, r1) of a block-format job with xq filled.
ROTARY_BLOCKS_TARGET void ByteProductBlock(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  switch (j.format) {
    case WeightFormat::Q8_0: return Block<WeightFormat::Q8_0>(j, t0, t1, r0, r1);
    case WeightFormat::Q4_0: return Block<WeightFormat::Q4_0>(j, t0, t1, r0, r1);
    case WeightFormat::Q4_1: return Block<WeightFormat::Q4_1>(j, t0, t1, r0, r1);
    case WeightFormat::Q5_0: return Block<WeightFormat::Q5_0>(j, t0, t1, r0, r1);
    case WeightFormat::Q5_1: return Block<WeightFormat::Q5_1>(j, t0, t1, r0, r1);
    case WeightFormat::Q4_K: return Block<WeightFormat::Q4_K>(j, t0, t1, r0, r1);
    case WeightFormat::Q5_K: return Block<WeightFormat::Q5_K>(j, t0, t1, r0, r1);
    case WeightFormat::Q6_K: return Block<WeightFormat::Q6_K>(j, t0, t1, r0, r1);
    default: return;
  }
}

}  // namespace
}  // namespace rotary::linear_detail
