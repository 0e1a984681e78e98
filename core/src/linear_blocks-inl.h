// core/src/linear_blocks-inl.h (internal): linear_forward's products of llama.cpp's block formats (WeightFormat::Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, read in place) with q8 activations on x86's byte products, compiled three
// times: for AVX2 (linear_blocks_avx2.cpp: AVX2 targets of a CPU without VNNI, and AVX-512 ones of a CPU without
// AVX512-VNNI), for AVX512-VNNI (linear_blocks_vnni.cpp: AVX-512 targets of a CPU with it, where vpdpbusd sums four
// byte products into a lane in one instruction) and for AVX-VNNI (linear_blocks_avx_vnni.cpp: the same vpdpbusd in its
// VEX encoding, at AVX2 targets of a CPU with it - Intel's client CPUs from Alder Lake on have it without AVX-512) -
// the same 256-bit lanes, so the same bits. The including file defines ROTARY_BLOCKS_TARGET (the functions' target
// attribute) and ROTARY_BLOCKS_VNNI (0: none; 1: AVX512-VNNI; 2: AVX-VNNI) and includes it once. As llama.cpp's own
// CPU products do: the weights stay in their blocks, each unit
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
// Signed quants (Q8_0, Q6_K) enter vpmaddubsw as |q| against qx with q's sign (exact for a Q8_0 quant of -128 too);
// unsigned ones (Q4_1's and Q5_1's, the k-quants' 4- and 5-bit q, all <= 31) as they are, against qx, and Q4_0's and
// Q5_0's before their offset (Offset). Every pair sum is below int16's saturation (2 x 127 x 128; unsigned: 2 x 31 x
// 127), and a unit's whole sum below 2^24 (Q6_K's sub-block scales enter through vpmaddwd's second operand: |sum| <=
// 32 x 32 x 127 x 128), so each unit's sum of 32 products is an exact integer, converted to float exactly. It is then
// multiplied by the unit's scale product d sx (one rounding) and added into the (token, row)'s accumulator lane u % 8
// (one more); the min term of the formats with one (Q4_1, Q5_1, Q4_K, Q5_K) likewise into a second accumulator - the
// unit's min is dmin m for the k-quants and -m for Q4_1 / Q5_1, whose min is added - and subtracted at the end, each
// accumulator's 8 lanes summed in one fixed order. Decode (Tile: 8 units of a row in a register's lanes), small
// batches (LaneTile: 4 tokens in the lanes) and prefill (Panels: 8 rows in the lanes) take the same operations, so
// what else is batched changes no bit; the terms are those of the float64 reference, so results differ from it only
// in rounding (tests/core/cases_linear.cpp).
#include <algorithm>
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
// one (Q4_0, Q4_1, Q5_0, Q5_1). The 16 bytes loaded into both halves, the upper half's 64-bit lanes shifted by 4 (a
// byte's high nibble moves down; what its neighbour shifts in is masked off): a load and two operations.
ROTARY_BLOCKS_TARGET inline __m256i Nibbles32(const uint8_t* qs) {
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
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

// The quants that are an unsigned byte minus a fixed offset - Q4_0's nibbles minus 8, Q5_0's five bits minus 16 -
// enter the byte products unsigned, against x's quants as they are, and the offset times the sum of x's quants over
// the unit (Q8Activations::sums) is subtracted from the unit's integer sum: sum u qx - offset sum qx = sum (u - offset)
// qx, exact, one shift and subtract per unit and token in place of a vpsubb and vpabsb per unit and row and a vpsignb
// per unit, row and token. With VNNI, Q8_0 too: q + 128 (q xor 0x80, one operation per unit and row) against qx in
// one vpdpbusd, which sums each lane's four products into int32 - without VNNI, vpmaddubsw's int16 pairs would
// saturate (2 x 255 x 127 > 32767), so there Q8_0 keeps the signed products, as Q6_K does everywhere (|q| against qx
// with q's sign). The unit's integer sum is the same either way, so the bits are too. (2026-11-29, Zen 4, 2 threads,
// A/B of the two libraries, Q8_0 4864x1024 and 1024x4864: 1 token 128-138 -> 120-125 us, 8 tokens 476-612 -> 432-544,
// 64 tokens 2424-2638 -> 1980-2020.)
constexpr int OffsetLog2(WeightFormat f) {
  return f == WeightFormat::Q4_0 ? 3 : f == WeightFormat::Q5_0 ? 4 : f == WeightFormat::Q8_0 && ROTARY_BLOCKS_VNNI ? 7 : -1;
}
constexpr bool Offset(WeightFormat f) { return OffsetLog2(f) >= 0; }
// Quants multiplied as signed bytes (vpsignb on x, |q| unsigned): Q6_K, and Q8_0 without VNNI; the others enter unsigned.
constexpr bool SignedProducts(WeightFormat f) { return Signed(f) && !Offset(f); }

// start + the 8 int32 lanes of sum_4 u qx, u unsigned: one vpdpbusd with VNNI; without, vpmaddubsw's pairs (below
// int16's saturation for u <= 31: 2 x 31 x 127) summed by vpmaddwd (the add of a zero start folds away).
ROTARY_BLOCKS_TARGET inline __m256i UnsignedSums(__m256i start, __m256i u, __m256i xv) {
#if ROTARY_BLOCKS_VNNI == 2
  return _mm256_dpbusd_avx_epi32(start, u, xv);
#elif ROTARY_BLOCKS_VNNI
  return _mm256_dpbusd_epi32(start, u, xv);
#else
  return _mm256_add_epi32(start, _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), _mm256_set1_epi16(1)));
#endif
}

// start + a unit's 8 int32 lanes against x's quants xv: the signed products for Q8_0 and Q6_K (q and |q| = qa, pair
// weights pw: ones, or Q6_K's two sub-block scales), UnsignedSums for the rest.
template <WeightFormat F>
ROTARY_BLOCKS_TARGET inline __m256i UnitLanes(__m256i start, __m256i q, __m256i qa, __m256i pw, __m256i xv) {
  if constexpr (SignedProducts(F))
    return _mm256_add_epi32(start, _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(xv, q)), pw));
  else
    return UnsignedSums(start, q, xv);
}

// Unit i of block b: its 32 quants as bytes (signed for Q6_K and, without VNNI, Q8_0; unsigned for Q4_1 / Q5_1 /
// Q4_K / Q5_K, and for Q4_0 / Q5_0 / Q8_0 with VNNI before their offset: Offset).
template <WeightFormat F>
ROTARY_BLOCKS_TARGET inline __m256i UnpackQuants(const uint8_t* b, int i) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  if constexpr (F == WeightFormat::Q8_0) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    return Offset(F) ? _mm256_xor_si256(q, _mm256_set1_epi8(char(0x80))) : q;  // q + 128 as an unsigned byte
  } else if constexpr (F == WeightFormat::Q4_0) {
    return Nibbles32(b + 2);  // minus 8: Offset
  } else if constexpr (F == WeightFormat::Q4_1) {
    return Nibbles32(b + 4);
  } else if constexpr (F == WeightFormat::Q5_0) {  // f16 d, qh[4], qs[16]
    return _mm256_or_si256(Nibbles32(b + 6), FifthBits(b + 2));  // minus 16: Offset
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

// Lane k of the result: the sum of unit k's 8 lanes v[k], from quads[h] = vphaddd(pairs[2h], pairs[2h + 1]) and
// pairs[m] = vphaddd(v[2m], v[2m + 1]) (exact integers, so the order of the adds is free; pairs and quads are formed
// as the units come, so at most two vectors a token are live between units: 4 tokens a tile fit AVX2's 16
// registers).
ROTARY_BLOCKS_TARGET inline __m256i LaneTotals(__m256i quad0, __m256i quad1) {
  return _mm256_add_epi32(_mm256_permute2x128_si256(quad0, quad1, 0x20), _mm256_permute2x128_si256(quad0, quad1, 0x31));
}

// Lanes k < n of 8 floats or int32s from p, zeros past n (a row's last units: never read past x's blocks). One
// vector load, not 8 scalar stores and a reload (a stall on store forwarding).
ROTARY_BLOCKS_TARGET inline __m256i LaneMask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
ROTARY_BLOCKS_TARGET inline __m256 Load8(const float* p, int n, __m256i mask) {
  return n == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask);
}
ROTARY_BLOCKS_TARGET inline __m256i Load8(const int32_t* p, int n, __m256i mask) {
  return n == 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                : _mm256_maskload_epi32(reinterpret_cast<const int*>(p), mask);
}

// The f16 in the low 16 bits of each 32-bit lane (the high 16 bits zero), converted exactly.
ROTARY_BLOCKS_TARGET inline __m256 LowHalvesToFloat(__m256i h) {
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
  return _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
}

// The f16 scale d and (Q4_1, Q5_1) f16 min m of 8 blocks from their first 4 bytes (lane k: block k's), converted
// exactly; the mins negated (BlockScales).
template <WeightFormat F>
ROTARY_BLOCKS_TARGET inline void ScalesOfWords(__m256i words, __m256& scale, __m256& min) {
  scale = LowHalvesToFloat(_mm256_and_si256(words, _mm256_set1_epi32(0xFFFF)));
  min = HasMin(F) ? _mm256_xor_ps(LowHalvesToFloat(_mm256_srli_epi32(words, 16)), _mm256_set1_ps(-0.0f))
                  : _mm256_setzero_ps();
}

// The 8 blocks' first words without a gather (a gather of 8 words costs AMD's cores several times this: 2026-11-29,
// Zen 4, it took a fifth of Q4_0's decode tile in `perf annotate`): blocks 2i and 2i + 1 in one 32-byte register,
// block 2i in its lower half and block 2i + 1 in its upper one - one load where both start within 32 bytes (blocks of
// at most 28 bytes: Q4_0, Q4_1, Q5_0, Q5_1), else two 16-byte loads (Q8_0's 34) -, a byte shuffle each (word i of
// its half), three ors and one lane permutation.
template <WeightFormat F>
constexpr bool kOneLoadPairs = weight_block_bytes(F) + 4 <= 32;

// The shuffles' controls: lower half bytes 0-3 into word i, upper half bytes upper .. upper + 3 into word i.
struct alignas(32) WordPicks {
  int8_t pick[4][32];
};
constexpr WordPicks PairedWordPicks(int upper) {
  WordPicks p{};
  for (int i = 0; i < 4; ++i)
    for (int b = 0; b < 16; ++b) {
      const bool here = b / 4 == i;
      p.pick[i][b] = here ? int8_t(b % 4) : int8_t(-1);
      p.pick[i][16 + b] = here ? int8_t(upper + b % 4) : int8_t(-1);
    }
  return p;
}

// The scales and mins (ScalesOfWords) of the 8 blocks from `blocks` of a format of one unit a block, lanes k < n
// (zeros past n: a row's last group reads no block past the row).
template <WeightFormat F>
ROTARY_BLOCKS_TARGET inline void GroupScales(const uint8_t* blocks, int n, __m256i mask, __m256& scale, __m256& min) {
  static_assert(weight_block_size(F) == kUnit, "formats of several units a block decode their scales per block");
  constexpr int kBytes = int(weight_block_bytes(F));
  if (n == 8) {
    static constexpr WordPicks kPicks = PairedWordPicks(kOneLoadPairs<F> ? kBytes - 16 : 0);
    __m256i words = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      const uint8_t* pair_at = blocks + 2 * i * kBytes;
      const __m256i pair = kOneLoadPairs<F> ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pair_at))
                                            : _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(pair_at + kBytes),
                                                                  reinterpret_cast<const __m128i*>(pair_at));
      words = _mm256_or_si256(
          words, _mm256_shuffle_epi8(pair, _mm256_load_si256(reinterpret_cast<const __m256i*>(kPicks.pick[i]))));
    }
    // Words 0-3 hold blocks 0, 2, 4, 6 and words 4-7 blocks 1, 3, 5, 7.
    ScalesOfWords<F>(_mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)), scale, min);
    return;
  }
  const __m256i offsets = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(kBytes));
  ScalesOfWords<F>(_mm256_mask_i32gather_epi32(_mm256_setzero_si256(), reinterpret_cast<const int*>(blocks), offsets,
                                               mask, 1),
                   scale, min);
}

// How far ahead of its reads a small batch's tile asks for the weights. A tile reads its rows as one sequential
// stream, but on Zen 3 the hardware prefetcher alone left it waiting on each group's first load (a quarter of the
// one-token tile's samples on that load); with the lines 1 KB ahead requested (2026-11-30, AMD EPYC Zen 3, 2 threads,
// `bench checkpoint` of the Q4_0 file, decode after 8 tokens, 5 alternations) decode went from 28.9-30.1 to
// 31.3-35.6 tok/s (768-2048 bytes: alike within the noise).
inline constexpr uintptr_t kPrefetchBytes = 1024;

// Requests the cache lines of [p, p + span) kPrefetchBytes ahead: the lines a group of units will read a few groups
// later (past a row's end: the next row's, which the thread reads next; past the weights' end a prefetch is
// dropped, never faults).
ROTARY_BLOCKS_TARGET inline void PrefetchAhead(const uint8_t* p, uintptr_t span) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) + kPrefetchBytes;
  for (uintptr_t line = first & ~uintptr_t(63); line < first + span; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
}

// sums[t] = dot(row r0, token t0 + t) for NT tokens (NR = 1: decode's one token and batches of two, row by row).
// Each unit's 32 products are summed exactly as an integer (LaneTotals over 8 units at a time), then scaled: lane k
// of the accumulator takes units k, k + 8, k + 16, ... of the row (one multiply-add each, in order), and the 8 lanes
// are summed in SumOfLanes' order - the panels' accumulators take the same operations (Panels), so batching changes
// no bit.
template <WeightFormat F, int NT, int NR>
ROTARY_BLOCKS_TARGET inline void Tile(const Job& j, int64_t t0, int64_t r0, float* sums) {
  static_assert(NR == 1, "the block formats' small batches run row by row");
  constexpr int kUnits = BlockScales<F>::kUnits;
  constexpr int64_t kBytes = weight_block_bytes(F);
  const uint8_t* row = block_row(F, j.w, j.row_stride, r0);
  const int64_t units = j.cols / kUnit;
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256 acc[NT], min_acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = min_acc[t] = _mm256_setzero_ps();
  BlockScales<F> scales;
  // Without VNNI, unsigned quants' vpmaddubsw pairs (|pair| <= 2 x 31 x 127 = 7874) of two units are summed in int16
  // by one vphaddw (|sum| <= 15748) and widened by one vpmaddwd: lane for lane the int32 sums that two
  // vpmaddwd and a vphaddd give, one vpmaddwd fewer per unit pair (2026-11-30, Zen 3, one token of 4864x1024 in cache,
  // four alternations: Q4_0 209-231 -> 177-209 us, Q4_K 224-236 -> 190-225, Q5_0 323-335 -> 235-284). The signed
  // products' pairs (up to 32512) would overflow, and vpdpbusd has no int16 step.
  constexpr bool kPairsIn16 = !ROTARY_BLOCKS_VNNI && !SignedProducts(F);
  // Units u0 .. u0 + 7 (whole: all 8 in the row, so no unit is checked against the row's end; the row's last group
  // may have fewer).
  const auto group = [&](int64_t u0, auto whole) ROTARY_BLOCKS_TARGET {
    constexpr bool kWhole = decltype(whole)::value;
    const int n = kWhole ? 8 : int(units - u0);
    const __m256i mask = LaneMask(n);
    const uint8_t* blocks = row + u0 / kUnits * kBytes;
    PrefetchAhead(blocks, 8 / kUnits * kBytes);
    __m256 scale, min;
    if constexpr (kUnits == 1) {
      GroupScales<F>(blocks, n, mask, scale, min);
    } else {  // the group is one block (rows are whole blocks of 8 units)
      DecodeScales<F>(blocks, scales);
      scale = _mm256_loadu_ps(scales.scale), min = _mm256_loadu_ps(scales.min);
    }
    const int8_t* x0 = j.xq.quants + t0 * j.xq.stride + u0 * kUnit;
    __m256i pair[NT], quads[NT][2];
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
      __m256i two[NT][2];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const int k = 2 * m + h;
        if (!kWhole && k >= n) {
          for (int t = 0; t < NT; ++t) two[t][h] = _mm256_setzero_si256();
          continue;
        }
        const int i = k % kUnits;
        const __m256i q = UnpackQuants<F>(blocks + k / kUnits * kBytes, i);
        __m256i qa = q, pw = ones16;
        if constexpr (SignedProducts(F)) qa = _mm256_abs_epi8(q);
        if constexpr (F == WeightFormat::Q6_K)
          pw = _mm256_set_m128i(_mm_set1_epi16(scales.sub_scales[2 * i + 1]), _mm_set1_epi16(scales.sub_scales[2 * i]));
        for (int t = 0; t < NT; ++t) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + t * j.xq.stride + k * kUnit));
          if constexpr (kPairsIn16) two[t][h] = _mm256_maddubs_epi16(q, xv);
          else two[t][h] = UnitLanes<F>(_mm256_setzero_si256(), q, qa, pw, xv);
        }
      }
      for (int t = 0; t < NT; ++t) {
        const __m256i p = kPairsIn16 ? _mm256_madd_epi16(_mm256_hadd_epi16(two[t][0], two[t][1]), ones16)
                                     : _mm256_hadd_epi32(two[t][0], two[t][1]);
        if (m % 2 == 0) pair[t] = p;
        else quads[t][m / 2] = _mm256_hadd_epi32(pair[t], p);
      }
    }
    for (int t = 0; t < NT; ++t) {
      const int64_t at = (t0 + t) * j.xq.blocks + u0;
      __m256i totals = LaneTotals(quads[t][0], quads[t][1]);
      if constexpr (Offset(F))
        totals = _mm256_sub_epi32(totals, _mm256_slli_epi32(Load8(j.xq.sums + at, n, mask), OffsetLog2(F)));
      const __m256 unit_scale = _mm256_mul_ps(scale, Load8(j.xq.scales + at, n, mask));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(totals), unit_scale, acc[t]);
      if constexpr (HasMin(F)) min_acc[t] = _mm256_fmadd_ps(min, Load8(j.xq.scaled_sums + at, n, mask), min_acc[t]);
    }
  };
  int64_t u0 = 0;
  for (; u0 + 8 <= units; u0 += 8) group(u0, std::true_type{});
  if (u0 < units) group(u0, std::false_type{});
  for (int t = 0; t < NT; ++t)
    sums[t] = HasMin(F) ? SumOfLanes(acc[t]) - SumOfLanes(min_acc[t]) : SumOfLanes(acc[t]);
}

template <WeightFormat F, int NT, int NR>
ROTARY_BLOCKS_TARGET inline void TileAt(const Job& j, int64_t t0, int64_t r0) {
  float sums[NT * NR];
  Tile<F, NT, NR>(j, t0, r0, sums);
  store_tile(j, t0, r0, NT, NR, sums);
}

// A small batch of kLaneTokensFrom to kSmallBatch tokens (a server's step of several sequences) with the tokens in
// the lanes. Tile reduces each token's 8 unit sums across lanes (vphaddd trees and the float work, more than half of
// its work a token), so a 4-token call cost 2.8x a one-token call and 8 tokens 5x. Here a lane set is 4 tokens x 2
// groups (a group: 4 of a unit's 32 quants): x is laid out once per call (TokenLanes) so that the 32 bytes of lane
// set s, unit u, piece p hold each of its 4 tokens' quants 8p..8p+7, and a row's unpacked unit meets them as its
// 64-bit piece p broadcast to the 4 lane pairs (vpermq): after the unit's 4 pieces, lanes (t, 0) and (t, 1) hold
// token t's two halves of the unit's exact integer sum, and one vphaddd of two units gives both units' sums for the
// 4 tokens. The float work is then Tile's per (row, token): the unit's sum converted, times (d sx), into the
// accumulator of lane u % 8 - here lane (t, u % 2) of accumulator (u % 8) / 2 -, the min term likewise, and the 8
// accumulators summed in SumOfLanes' order; the integer sums are exact in any order. So every bit is Tile's and the
// panels' (BlockFormatsSameBitsForAnyThreadCountAndTokenBatching). A batch of 3 pays for 4 tokens and one of 5-7 for
// 8 (zeros), still less than Tile's 2 + 1 or 4 + 2 + 1 tiles that unpack the row again each. 2026-11-30, Zen 4, 2
// threads, Q4_0 4864x1024 (weights from memory, a loop over 32 MiB of copies, best / median us, Tile -> LaneTile):
// AVX512-VNNI 3 tokens 184 / 300 -> 147 / 190, 4 tokens 201 / 320 -> 150 / 200, 8 tokens 419 / 617 -> 273 / 347
// (one token: 77 / 119); AVX2 without VNNI (AVX-VNNI turned off) 4 tokens 200 / 290 -> 190 / 210, 8 tokens 390 /
// 590 -> 305 / 380.
constexpr int kLaneTokens = 4;        // tokens of a lane set
constexpr int64_t kLaneTokensFrom = 3;  // smaller batches run on Tile

// Tokens [t0, t1) of xq in lane sets of kLaneTokens (tokens past t1 are zeros). Lane (t, h) of a unit pair's
// 8 floats or int32s is unit 2v + h of the set's token t at index (t / 2) * 4 + h * 2 + t % 2 (vphaddd's order).
struct TokenLanes {
  int sets = 0;
  int64_t units = 0;
  // Unit-major, so that a row's group of units finds every set's lanes at fixed offsets from one pointer.
  std::vector<int8_t> quants;      // [unit][piece p][set][token t][8]: quants 8p..8p+7 of the token's unit
  std::vector<int32_t> starts;     // [unit][set][8]: a unit's integer sums start from -(sum of x's quants) x the
                                   // format's offset (Offset) in lane 2t, token t's first group
  std::vector<float> scales;       // [unit pair][set][8]
  std::vector<float> scaled_sums;  // [unit pair][set][8]
};
constexpr int PairLane(int t, int h) { return (t / 2) * 4 + h * 2 + t % 2; }

// The lanes of tokens [t0, t1) of j's x for a format of offset 2^offset_log2 (none: -1), made once per thread for a
// call's chunk and kept for its next row groups (Job::call tells a new call).
ROTARY_BLOCKS_TARGET inline const TokenLanes& HeldTokenLanes(const Job& j, int64_t t0, int64_t t1, int offset_log2) {
  struct Held {
    uint64_t call = 0;
    const int8_t* quants = nullptr;
    int64_t t0 = 0, t1 = 0;
    int offset_log2 = 0;
    TokenLanes lanes;
  };
  static thread_local Held held;
  TokenLanes& x = held.lanes;
  if (held.call == j.call && held.quants == j.xq.quants && held.t0 == t0 && held.t1 == t1 &&
      held.offset_log2 == offset_log2)
    return x;
  const Q8Activations& xq = j.xq;
  x.sets = int((t1 - t0 + kLaneTokens - 1) / kLaneTokens);
  x.units = j.cols / kUnit;
  const int sets = x.sets;
  const int64_t unit_pairs = (x.units + 1) / 2;
  x.quants.assign(size_t(x.units * 4 * sets * 32), 0);
  x.starts.assign(size_t(x.units * sets * 8), 0);
  x.scales.assign(size_t(unit_pairs * sets * 8), 0.0f);
  x.scaled_sums.assign(x.scales.size(), 0.0f);
  for (int s = 0; s < x.sets; ++s)
    for (int t = 0; t < kLaneTokens; ++t) {
      const int64_t token = t0 + s * kLaneTokens + t;
      if (token >= t1) break;
      for (int64_t u = 0; u < x.units; ++u) {
        for (int p = 0; p < 4; ++p)
          std::memcpy(&x.quants[size_t(((u * 4 + p) * sets + s) * 32 + t * 8)],
                      xq.quants + token * xq.stride + u * kUnit + 8 * p, 8);
        const size_t at = size_t((u / 2 * sets + s) * 8 + PairLane(t, int(u % 2)));
        const int64_t b = token * xq.blocks + u;
        x.scales[at] = xq.scales[b], x.scaled_sums[at] = xq.scaled_sums[b];
        if (offset_log2 >= 0) x.starts[size_t((u * sets + s) * 8 + 2 * t)] = -(xq.sums[b] << offset_log2);
      }
    }
  held.call = j.call, held.quants = j.xq.quants, held.t0 = t0, held.t1 = t1, held.offset_log2 = offset_log2;
  return x;
}

// The index vectors that spread lanes k and k + 1 of 8 (a group's units' scales) as lanes (t, 0) and (t, 1).
struct alignas(32) PairPicks {
  int32_t pick[4][8];
};
constexpr PairPicks kPairPicks = {{{0, 0, 1, 1, 0, 0, 1, 1},
                                   {2, 2, 3, 3, 2, 2, 3, 3},
                                   {4, 4, 5, 5, 4, 4, 5, 5},
                                   {6, 6, 7, 7, 6, 6, 7, 7}}};

// v's four 64-bit pieces, each broadcast to all four.
ROTARY_BLOCKS_TARGET inline void BroadcastPieces(__m256i v, __m256i pieces[4]) {
  pieces[0] = _mm256_permute4x64_epi64(v, 0x00), pieces[1] = _mm256_permute4x64_epi64(v, 0x55);
  pieces[2] = _mm256_permute4x64_epi64(v, 0xAA), pieces[3] = _mm256_permute4x64_epi64(v, 0xFF);
}

// Token t's sum of a lane set's 8 accumulators at lane PairLane(t, 0), in SumOfLanes' order: ((a0 + a4) + (a2 + a6))
// + ((a1 + a5) + (a3 + a7)), a_k in lane (t, k % 2) of a[k / 2] - the sums of even and of odd k, then the two.
ROTARY_BLOCKS_TARGET inline __m256 PairLaneSums(const __m256 a[4]) {
  const __m256 c = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
  return _mm256_add_ps(c, _mm256_permute_ps(c, _MM_SHUFFLE(1, 0, 3, 2)));
}

// Row r against S lane sets of x (tokens t0 .. t0 + 4S, those before t1 stored).
template <WeightFormat F, int S>
ROTARY_BLOCKS_TARGET inline void LaneTile(const Job& j, const TokenLanes& x, int64_t t0, int64_t t1, int64_t r) {
  constexpr int kUnits = BlockScales<F>::kUnits;
  constexpr int64_t kBytes = weight_block_bytes(F);
  const uint8_t* row = block_row(F, j.w, j.row_stride, r);
  const int64_t units = x.units;
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256 acc[S][4], min_acc[S][4];
  for (int s = 0; s < S; ++s)
    for (int a = 0; a < 4; ++a) acc[s][a] = min_acc[s][a] = _mm256_setzero_ps();
  BlockScales<F> scales;
  const auto group = [&](int64_t u0, auto whole) ROTARY_BLOCKS_TARGET {
    constexpr bool kWhole = decltype(whole)::value;
    const int n = kWhole ? 8 : int(units - u0);
    const uint8_t* blocks = row + u0 / kUnits * kBytes;
    const int8_t* xq = x.quants.data() + u0 * 4 * S * 32;
    const int32_t* starts = x.starts.data() + u0 * S * 8;
    const float* xs = x.scales.data() + u0 / 2 * S * 8;
    const float* xss = x.scaled_sums.data() + u0 / 2 * S * 8;
    PrefetchAhead(blocks, 8 / kUnits * kBytes);
    __m256 scale, min;
    if constexpr (kUnits == 1) {
      GroupScales<F>(blocks, n, LaneMask(n), scale, min);
    } else {
      DecodeScales<F>(blocks, scales);
      scale = _mm256_loadu_ps(scales.scale), min = _mm256_loadu_ps(scales.min);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
      if (!kWhole && k >= n) break;
      __m256i total[S][2];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        if (!kWhole && k + h >= n) {
          for (int s = 0; s < S; ++s) total[s][h] = _mm256_setzero_si256();
          continue;
        }
        const int v = k + h;  // the unit in the group
        for (int s = 0; s < S; ++s)
          total[s][h] = Offset(F) ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(starts + (v * S + s) * 8))
                                  : _mm256_setzero_si256();
        const int i = v % kUnits;
        const __m256i q = UnpackQuants<F>(blocks + v / kUnits * kBytes, i);
        __m256i qp[4], qap[4];
        BroadcastPieces(q, qp);
        if constexpr (SignedProducts(F)) BroadcastPieces(_mm256_abs_epi8(q), qap);
        else std::copy(qp, qp + 4, qap);
        const auto xv = [&](int p, int s) ROTARY_BLOCKS_TARGET {
          return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + ((v * 4 + p) * S + s) * 32));
        };
        if constexpr (!ROTARY_BLOCKS_VNNI && !SignedProducts(F)) {
          // vpmaddubsw's pairs of unsigned quants (<= 31) and x's (|qx| <= 127) are at most 7874, so the 4 pieces'
          // pairs add in int16 (<= 31496) and take one vpmaddwd instead of 4.
          for (int s = 0; s < S; ++s) {
            __m256i pairs = _mm256_maddubs_epi16(qp[0], xv(0, s));
            for (int p = 1; p < 4; ++p) pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(qp[p], xv(p, s)));
            total[s][h] = _mm256_add_epi32(total[s][h], _mm256_madd_epi16(pairs, ones16));
          }
        } else {
#pragma GCC unroll 4
          for (int p = 0; p < 4; ++p) {
            __m256i pw = ones16;
            if constexpr (F == WeightFormat::Q6_K) pw = _mm256_set1_epi16(scales.sub_scales[2 * i + p / 2]);
            for (int s = 0; s < S; ++s) total[s][h] = UnitLanes<F>(total[s][h], qp[p], qap[p], pw, xv(p, s));
          }
        }
      }
      const __m256i pick = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPairPicks.pick[k / 2]));
      const __m256 pair_scale = _mm256_permutevar8x32_ps(scale, pick);
      for (int s = 0; s < S; ++s) {
        const int at = (k / 2 * S + s) * 8;
        const __m256i totals = _mm256_hadd_epi32(total[s][0], total[s][1]);
        const __m256 unit_scale = _mm256_mul_ps(pair_scale, _mm256_loadu_ps(xs + at));
        acc[s][k / 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(totals), unit_scale, acc[s][k / 2]);
        if constexpr (HasMin(F))
          min_acc[s][k / 2] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(min, pick),
                                              _mm256_loadu_ps(xss + at), min_acc[s][k / 2]);
      }
    }
  };
  int64_t u0 = 0;
  for (; u0 + 8 <= units; u0 += 8) group(u0, std::true_type{});
  if (u0 < units) group(u0, std::false_type{});
  for (int s = 0; s < S; ++s) {
    const int64_t first = t0 + s * kLaneTokens;
    const int nt = int(std::min<int64_t>(kLaneTokens, t1 - first));
    if (nt <= 0) break;
    __m256 total = PairLaneSums(acc[s]);
    if constexpr (HasMin(F)) total = _mm256_sub_ps(total, PairLaneSums(min_acc[s]));
    alignas(32) float lanes[8], sums[kLaneTokens];
    _mm256_store_ps(lanes, total);
    for (int t = 0; t < nt; ++t) sums[t] = lanes[PairLane(t, 0)];
    store_tile(j, first, r, nt, 1, sums);
  }
}

// Prefill: a panel of kPanelRows rows, its units unpacked once per token chunk and transposed so that one register
// holds bytes 4g..4g+3 of unit u for each of the 8 rows (32-bit lane r: row r). A token's bytes 4g..4g+3, broadcast,
// then meet all 8 rows in one vpmaddubsw (or vpdpbusd), and the 8 groups' int32 sums add up to the unit's exact sum
// for each row; its one multiply-add goes into accumulator u % 8 (lane r), which is what Tile's lane u % 8 of row r
// takes, in the same order, and the accumulators are summed in SumOfLanes' order: every bit equals Tile's
// (BlockFormatsSameBitsForAnyThreadCountAndTokenBatching). The unpacking, 7-8 operations a unit and row in Tile, is
// paid once per chunk (16-96 tokens), the scales and the float work are per 8 rows and unit, and each weight vector is
// loaded once for kPanelTokens tokens (2026-11-29, Zen 3 and Zen 4, Q4_0 prefill 512 of the 0.5B shape: docs/gguf.md).
constexpr int kPanelTokens = 4;  // tokens sharing each load of a slice's weight vector (PanelTokens; 8 was slower with AVX-512's 32 registers)
constexpr int kSliceUnits = 32;  // units of a panel slice: 16 KB of unpacked bytes (signed formats), L1-resident

// One slice of a panel: for unit u, group g: the 8 rows' quant bytes q[u][g] (and |q| for Q8_0, Q6_K and q8), the
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
// are zero there too); the block formats as Tile unpacks them, their block's scales decoded into `scales` at the
// block's first unit, which is also where every slice starts (the k-quants' 8 units a block then read them 8 times,
// decoded once: 2026-11-29, Zen 4, 2 threads, 512 tokens of 4864x1024 / 1024x4864 in Q4_K 20.7 / 24.9 -> 15.8 /
// 18.2 ms, Q6_K 22.3 / 26.6 -> 18.5 / 22.1 ms).
template <WeightFormat F>
ROTARY_BLOCKS_TARGET inline __m256i RowUnit(const Job& j, int64_t row, int64_t u, BlockScales<F>& scales, float& scale,
                                          float& min, int16_t sub[2]) {
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
    static_assert(kSliceUnits % kUnits == 0, "a slice starts at a block's first unit, so its scales are decoded there");
    const uint8_t* block = block_row(F, j.w, j.row_stride, row) + u / kUnits * weight_block_bytes(F);
    const int i = int(u % kUnits);
    if (i == 0) DecodeScales<F>(block, scales);
    scale = scales.scale[i], min = scales.min[i];
    if constexpr (F == WeightFormat::Q6_K) sub[0] = scales.sub_scales[2 * i], sub[1] = scales.sub_scales[2 * i + 1];
    return UnpackQuants<F>(block, i);
  }
}

// Units [u0, u0 + count) of rows [r0, r0 + nr) into the slice; rows past nr are zeros (their sums are not stored).
template <WeightFormat F>
ROTARY_BLOCKS_TARGET void PackSlice(const Job& j, int64_t r0, int nr, int64_t u0, int count, PanelSlice& s) {
  BlockScales<F> block_scales[kPanelRows];  // each row's block of the unit, decoded at its first unit
  for (int k = 0; k < count; ++k) {
    __m256i q[kPanelRows];
    int16_t sub[kPanelRows][2] = {};
    for (int r = 0; r < kPanelRows; ++r) {
      s.scale[k][r] = s.min[k][r] = 0.0f;
      q[r] = r < nr ? RowUnit<F>(j, r0 + r, u0 + k, block_scales[r], s.scale[k][r], s.min[k][r], sub[r])
                    : _mm256_setzero_si256();
    }
    Transpose8x8(q, s.q[k]);
    if constexpr (SignedProducts(F))
      for (int g = 0; g < 8; ++g) s.qa[k][g] = _mm256_abs_epi8(s.q[k][g]);
    if constexpr (F == WeightFormat::Q6_K)
      for (int h = 0; h < 2; ++h) {
        alignas(32) int16_t lanes[16];
        for (int r = 0; r < kPanelRows; ++r) lanes[2 * r] = lanes[2 * r + 1] = sub[r][h];
        s.pair_weights[k][h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
      }
  }
}

// A token's accumulators over a panel, lane r row r: acc[k] (and min_acc[k]) take units k, k + 8, ... - Tile's lane
// k of the row. rotary's q8 weights (linear_q8_avx2.cpp's tiles) sum per lane g instead: acc[g] is lane g.
struct alignas(32) PanelSums {
  __m256 acc[8], min_acc[8];
};

// Adds units [u0, u0 + count) of token t to its sums (rotary's q8 weights: linear_q8_avx2.cpp's tiles' operations,
// 8 rows a register).
ROTARY_BLOCKS_TARGET inline void PanelTokenQ8(const Job& j, int64_t t, int64_t u0, int count, const PanelSlice& s,
                                              PanelSums& sums) {
  const __m256i ones16 = _mm256_set1_epi16(1);
  const int8_t* xt = j.xq.quants + t * j.xq.stride;
  __m256 acc[8];
  for (int g = 0; g < 8; ++g) acc[g] = sums.acc[g];
  for (int k = 0; k < count; ++k) {
    const int64_t u = u0 + k;
    const __m256 scale = _mm256_mul_ps(_mm256_load_ps(s.scale[k]), _mm256_set1_ps(j.xq.scales[t * j.xq.blocks + u]));
    for (int g = 0; g < 8; ++g) {
      int32_t word;
      std::memcpy(&word, xt + u * kUnit + 4 * g, 4);
      const __m256i xv = _mm256_set1_epi32(word);
      const __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(s.qa[k][g], _mm256_sign_epi8(xv, s.q[k][g])), ones16);
      acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scale, acc[g]);
    }
  }
  for (int g = 0; g < 8; ++g) sums.acc[g] = acc[g];
}

// Adds units [u0, u0 + count) of NT tokens from t to their sums (Tile's operations, 8 rows a register): each unit's
// integer sum (two chains of 4 groups a token, exact in any order), then one multiply-add into lane u % 8. Each of the
// slice's weight vectors is loaded once for the NT tokens.
template <WeightFormat F, int NT>
ROTARY_BLOCKS_TARGET inline void PanelTokens(const Job& j, int64_t t, int64_t u0, int count, const PanelSlice& s,
                                             PanelSums* sums) {
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int k = 0; k < count; ++k) {
    const int64_t u = u0 + k;
    __m256i total[NT][2];
    for (int n = 0; n < NT; ++n) {
      total[n][0] = total[n][1] = _mm256_setzero_si256();
      if constexpr (Offset(F)) total[n][0] = _mm256_set1_epi32(-(j.xq.sums[(t + n) * j.xq.blocks + u] << OffsetLog2(F)));
    }
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const __m256i q = s.q[k][g], qa = s.qa[k][g];
      const __m256i pw = F == WeightFormat::Q6_K ? s.pair_weights[k][g / 4] : ones16;
      for (int n = 0; n < NT; ++n) {
        int32_t word;
        std::memcpy(&word, j.xq.quants + (t + n) * j.xq.stride + u * kUnit + 4 * g, 4);
        total[n][g % 2] = UnitLanes<F>(total[n][g % 2], q, qa, pw, _mm256_set1_epi32(word));
      }
    }
    const int lane = int(u % 8);
    for (int n = 0; n < NT; ++n) {
      const int64_t at = (t + n) * j.xq.blocks + u;
      const __m256 scale = _mm256_mul_ps(_mm256_load_ps(s.scale[k]), _mm256_set1_ps(j.xq.scales[at]));
      const __m256 unit = _mm256_cvtepi32_ps(_mm256_add_epi32(total[n][0], total[n][1]));
      sums[n].acc[lane] = _mm256_fmadd_ps(unit, scale, sums[n].acc[lane]);
      if constexpr (HasMin(F))
        sums[n].min_acc[lane] =
            _mm256_fmadd_ps(_mm256_load_ps(s.min[k]), _mm256_set1_ps(j.xq.scaled_sums[at]), sums[n].min_acc[lane]);
    }
  }
}

// SumOfLanes' order over 8 accumulators: ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)).
ROTARY_BLOCKS_TARGET inline __m256 SumOfAccumulators(const __m256 a[8]) {
  return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                       _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
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
      for (int k = 0; k < 8; ++k) sums.acc[k] = sums.min_acc[k] = _mm256_setzero_ps();
    }
    for (int64_t u0 = 0; u0 < units; u0 += kSliceUnits) {
      const int count = int(std::min<int64_t>(kSliceUnits, units - u0));
      PackSlice<F>(j, p, nr, u0, count, *slice);
      if constexpr (F == WeightFormat::Q8) {
        for (int64_t t = t0; t < t1; ++t) PanelTokenQ8(j, t, u0, count, *slice, token_sums[size_t(t - t0)]);
      } else {
        int64_t t = t0;
        for (; t + kPanelTokens <= t1; t += kPanelTokens)
          PanelTokens<F, kPanelTokens>(j, t, u0, count, *slice, &token_sums[size_t(t - t0)]);
        for (; t < t1; ++t) PanelTokens<F, 1>(j, t, u0, count, *slice, &token_sums[size_t(t - t0)]);
      }
    }
    for (int64_t t = t0; t < t1; ++t) {
      const PanelSums& sums = token_sums[size_t(t - t0)];
      __m256 total = SumOfAccumulators(sums.acc);
      if constexpr (HasMin(F)) total = _mm256_sub_ps(total, SumOfAccumulators(sums.min_acc));
      alignas(32) float out[kPanelRows];
      _mm256_store_ps(out, total);
      store_tile(j, t, p, 1, nr, out);
    }
  }
}

template <WeightFormat F>
ROTARY_BLOCKS_TARGET void Block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  if (t1 - t0 > kSmallBatch) return Panels<F>(j, t0, t1, r0, r1);
  if (t1 - t0 >= kLaneTokensFrom) {
    static_assert(kSmallBatch <= 2 * kLaneTokens, "a small batch is at most two lane sets");
    const TokenLanes& x = HeldTokenLanes(j, t0, t1, OffsetLog2(F));
    for (int64_t r = r0; r < r1; ++r)
      x.sets == 1 ? LaneTile<F, 1>(j, x, t0, t1, r) : LaneTile<F, 2>(j, x, t0, t1, r);
    return;
  }
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
