// core/src/linear_hwy.cpp: the Highway kernels of linear_forward (rotary/linear.h). Every output is a dot product of
// a weight row and a token's activations, accumulated in float32 lanes and summed across lanes once at the end.
// A register tile holds kRows weight rows x kTokens tokens of accumulators, so each weight vector loaded (and
// widened from its storage format) is used kTokens times and each activation vector kRows times: prefill runs
// kTokens x kRows tiles over chunks of tokens small enough to stay in the core's L2 cache while the weight rows
// stream past; rows of floats (and f16 / bf16 rows, widened once per slice for all of a chunk's tiles) in column
// slices that keep a tile's rows in L1, the tiles' sums waiting in memory between slices (Tile's carries). Decode
// (and the tokens a chunk leaves past its last whole tile) runs one row at a time, all its
// tokens while the row is in L1: each thread's weights are then one sequential stream, which the hardware
// prefetcher follows at the bus's speed (a 4-row tile is four short streams a row apart: on Zen 4, 896-wide bf16
// rows read at 22 GB/s that way against 44 GB/s row by row, no software prefetch helping - docs/engine.md). Every
// (token, row) sum has its own accumulators in every tile shape, taken in one order (at targets of up to 8 float
// lanes two multiply-add chains: FloatTile), so the shape changes no result bit. bf16 activations
// (ActivationFormat::BF16) are rounded here once per call, then run on linear_bf16_dot.cpp's kernel at AVX-512
// targets of a CPU with AVX512-BF16, or through these tiles with the rounded activations widened like weights; q8
// activations (ActivationFormat::Q8) are quantized here once per call, then run on linear_q8_dot.cpp's int8 kernel at
// AVX-512 targets of a CPU with AVX512-VNNI, on linear_q8_avx2.cpp's byte products at other x86 targets from AVX2 up,
// or through TileQ8 (exact integer block sums in float32 lanes) below AVX2.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "block_weights.h"
#include "linear_kernel.h"
#include "simd_targets.h"
#include "stealing_ranges.h"
#include "rotary/linear.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "linear_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// (foreach_target must come first: it re-includes this file once per target)
#include <hwy/highway.h>

#include "storage-inl.h"

HWY_BEFORE_NAMESPACE();
namespace rotary::linear_detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

constexpr int kRows = 4;    // weight rows per tile (and per group of work)
constexpr int kTokens = 3;  // tokens per prefill tile: 12 sums, 3 activation vectors and a weight vector in AVX2's 16

// Lanes(df) weights from p as float lanes (int8: widened exactly; the q8 scale is applied by the caller).
template <class T>
HWY_INLINE hn::Vec<DF> LoadWeights(DF df, const T* p) {
  if constexpr (std::is_same_v<T, int8_t>) {
    const hn::Rebind<int8_t, DF> d8;
    const hn::RebindToSigned<DF> d32;
    return hn::ConvertTo(df, hn::PromoteTo(d32, hn::LoadU(d8, p)));
  } else {
    return simd::HWY_NAMESPACE::LoadStorage(df, p);
  }
}

// Lanes(df) activations from p: float as given, bf16 (ActivationFormat::BF16, already rounded) widened exactly.
template <class X>
HWY_INLINE hn::Vec<DF> LoadActivations(DF df, const X* p) {
  if constexpr (std::is_same_v<X, float>) return hn::LoadU(df, p);
  else return simd::HWY_NAMESPACE::LoadStorage(df, p);
}

// One weight (or bf16 activation) in float (scalar tails).
template <class T>
HWY_INLINE float WeightAt(const T* p, int64_t c) {
  if constexpr (std::is_same_v<T, int8_t>) return float(p[c]);
  else if constexpr (std::is_same_v<T, float>) return p[c];
  else if constexpr (std::is_same_v<T, hwy::bfloat16_t>) return bf16_to_float(reinterpret_cast<const uint16_t*>(p)[c]);
  else return f16_to_float(reinterpret_cast<const uint16_t*>(p)[c]);
}

// A q8 block's scale (f16 bits) as float, exactly: one F16C instruction at x86 targets from AVX2 up (Highway
// enables F16C there), dtype.h's conversion elsewhere.
HWY_INLINE float ScaleAt(const uint16_t* HWY_RESTRICT s, int64_t i) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  return _cvtsh_ss(s[i]);
#else
  return f16_to_float(s[i]);
#endif
}

// The columns [k, k + n) past a row's last whole vector (q8: block), n < Lanes, as zero-padded vectors of each of
// NR rows (q8: times its block's scale) and of a token's activations, so that they join the same lanes whatever NT
// is: a token's result has the same bits in a decode step and in any prefill tile. (Floats in memory, not vectors
// through a pointer, so the callers' accumulators stay in registers.)
template <int NR, class T>
HWY_INLINE void PaddedWeights(const T* HWY_RESTRICT w, int64_t ws, const uint16_t* HWY_RESTRICT scales, int64_t ss,
                              int64_t k, int64_t n, float (&pad)[NR][simd::HWY_NAMESPACE::kMaxLanes]) {
  for (int r = 0; r < NR; ++r)
    for (int64_t i = 0; i < n; ++i) {
      pad[r][i] = WeightAt(w + r * ws, k + i);
      if constexpr (std::is_same_v<T, int8_t>) pad[r][i] *= ScaleAt(scales + r * ss, (k + i) / kQ8Block);
    }
}
template <class X>
HWY_INLINE hn::Vec<DF> PaddedActivations(DF df, const X* HWY_RESTRICT x, int64_t k, int64_t n) {
  HWY_ALIGN float pad[simd::HWY_NAMESPACE::kMaxLanes] = {};
  for (int64_t i = 0; i < n; ++i) pad[i] = WeightAt(x, k + i);
  return hn::Load(df, pad);
}

// Float weights' (f32, f16, bf16) sums in kChains multiply-add chains. One chain bounds a decode row by the
// multiply-add's latency: 4 cycles a vector, at 8 lanes (AVX2) 14 GB/s of bf16 a core at 3.7 GHz, below the bus. So
// at targets of up to 8 float lanes a row's whole column vectors go in runs of kRun, alternating between two chains
// (vector v to chain (v / kRun) % 2), the zero-padded last vector joins the chain of its index, and the sum is the
// lane sum of chain 0 + chain 1 (2026-11-29, Zen 4, AVX2 target, 2 threads, bf16, one token: 4864x896 240 -> 135-159
// us, 896x4864 311-323 -> 174-191 us). At 16 lanes one chain reads 29 GB/s a core, near the bus, and a second
// would cost prefill the registers its tiles need (AVX-512 prefill 18% slower, decode 10-20% faster: 2026-11-29).
// Runs rather than single vectors so that a pass over one chain reads whole cache lines of the rows it reads in place
// (single alternate vectors, activations read in place too: 72-token tiles 10-80% slower); runs of 8 rather than 16
// or 32, so that 896-wide rows (112 vectors at AVX2) have most of their vectors in pairs of runs, which decode
// runs side by side (runs of 32: decode no faster than one chain).
// Every tile shape takes these operations in this order, so the shape changes no bit.
constexpr int kChains = hn::MaxLanes(DF()) <= 8 ? 2 : 1;
constexpr int64_t kRun = 8;
HWY_INLINE int ChainOf(int64_t vector) { return int(vector / kRun % kChains); }
// How many of a row's (or a slice's) first `vectors` vectors are in `chain`.
HWY_INLINE int64_t ChainVectors(int64_t vectors, int chain) {
  const int64_t pairs = vectors / (kChains * kRun), rest = vectors - pairs * kChains * kRun;
  return pairs * kRun + std::clamp<int64_t>(rest - chain * kRun, 0, kRun);
}

// Tile for float weights in the chains (w, x, K, carry_in and first_vector as Tile's; first_vector is a multiple of
// kChains x kRun, or this part has no whole vector). With two chains, tiles of up to 6 sums (decode's one token and
// one row, small batches' few tokens a row) hold both chains in registers and read each row once in order; larger
// ones (which have no registers for two sets of sums) run chain 0's vectors, park their sums, then chain 1's, their
// rows in L1 or L2 by then. Not inlined: inside the large kernels GCC keeps the chains on the stack, each
// multiply-add then waiting on a store and a load (decode 2x slower than one chain in registers).
template <int NT, int NR, class T, class X>
HWY_NOINLINE void FloatTile(const T* HWY_RESTRICT w, int64_t ws, const X* HWY_RESTRICT x, int64_t xs, int64_t K,
                            float sums[NT * NR], const float* carry_in, int64_t first_vector) {
  static_assert(kChains == 1 || kChains == 2, "the code below runs chain 0 and chain 1");
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df)), vectors = K / L, tail = K - vectors * L;
  const int tail_chain = ChainOf(first_vector + vectors);
  const auto carried = [&](int chain, int t, int r) {
    return carry_in ? hn::LoadU(df, carry_in + ((chain * NT + t) * NR + r) * L) : hn::Zero(df);
  };
  HWY_ALIGN float pad[NR][simd::HWY_NAMESPACE::kMaxLanes];
  if (tail > 0) {
    for (int r = 0; r < NR; ++r) std::fill(pad[r], pad[r] + L, 0.0f);
    PaddedWeights<NR>(w, ws, nullptr, 0, vectors * L, tail, pad);
  }
  hn::Vec<DF> acc[NT][NR];
  if constexpr (kChains == 2 && NT * NR <= 6) {
    hn::Vec<DF> odd[NT][NR];  // chain 1
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < NR; ++r) acc[t][r] = carried(0, t, r), odd[t][r] = carried(1, t, r);
    int64_t v = 0;
    for (; v + kChains * kRun <= vectors; v += kChains * kRun)
      for (int64_t i = v; i < v + kRun; ++i)
        for (int r = 0; r < NR; ++r) {
          const hn::Vec<DF> w0 = LoadWeights(df, w + r * ws + i * L), w1 = LoadWeights(df, w + r * ws + (i + kRun) * L);
          for (int t = 0; t < NT; ++t) {
            acc[t][r] = hn::MulAdd(w0, LoadActivations(df, x + t * xs + i * L), acc[t][r]);
            odd[t][r] = hn::MulAdd(w1, LoadActivations(df, x + t * xs + (i + kRun) * L), odd[t][r]);
          }
        }
    // The last vectors short of two runs: up to a run in chain 0, the rest in chain 1.
    const int64_t chain0_end = std::min(vectors, v + kRun);
    for (; v < chain0_end; ++v)
      for (int r = 0; r < NR; ++r) {
        const hn::Vec<DF> wv = LoadWeights(df, w + r * ws + v * L);
        for (int t = 0; t < NT; ++t) acc[t][r] = hn::MulAdd(wv, LoadActivations(df, x + t * xs + v * L), acc[t][r]);
      }
    for (; v < vectors; ++v)
      for (int r = 0; r < NR; ++r) {
        const hn::Vec<DF> wv = LoadWeights(df, w + r * ws + v * L);
        for (int t = 0; t < NT; ++t) odd[t][r] = hn::MulAdd(wv, LoadActivations(df, x + t * xs + v * L), odd[t][r]);
      }
    if (tail > 0) {  // into its chain by a mask (a branch between the arrays moves them to the stack)
      const auto into_0 = hn::FirstN(df, size_t(tail_chain == 0 ? L : 0));
      for (int t = 0; t < NT; ++t) {
        const hn::Vec<DF> xv = PaddedActivations(df, x + t * xs, vectors * L, tail);
        for (int r = 0; r < NR; ++r) {
          const hn::Vec<DF> wv = hn::Load(df, pad[r]);
          acc[t][r] = hn::IfThenElse(into_0, hn::MulAdd(wv, xv, acc[t][r]), acc[t][r]);
          odd[t][r] = hn::IfThenElse(into_0, odd[t][r], hn::MulAdd(wv, xv, odd[t][r]));
        }
      }
    }
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < NR; ++r) acc[t][r] = hn::Add(acc[t][r], odd[t][r]);
  } else {
    HWY_ALIGN float chain0[NT * NR * simd::HWY_NAMESPACE::kMaxLanes];
    for (int chain = 0; chain < kChains; ++chain) {
      for (int t = 0; t < NT; ++t)
        for (int r = 0; r < NR; ++r) acc[t][r] = carried(chain, t, r);
      // One flat loop over the chain's vectors, v stepped (nested loops over the runs: GCC parks the sums on the
      // stack after each run; v computed from the count: GCC recomputes every token's address each vector).
      const int64_t count = ChainVectors(vectors, chain);
      int64_t v = chain * kRun, in_run = 0;
      for (int64_t i = 0; i < count; ++i, ++v) {
        if constexpr (kChains > 1) {
          if (in_run == kRun) in_run = 0, v += (kChains - 1) * kRun;
          ++in_run;
        }
        hn::Vec<DF> xv[NT];  // x's NT vectors held, each row's vector loaded once
        for (int t = 0; t < NT; ++t) xv[t] = LoadActivations(df, x + t * xs + v * L);
        for (int r = 0; r < NR; ++r) {
          const hn::Vec<DF> wv = LoadWeights(df, w + r * ws + v * L);
          for (int t = 0; t < NT; ++t) acc[t][r] = hn::MulAdd(wv, xv[t], acc[t][r]);
        }
      }
      if (tail > 0 && tail_chain == chain)
        for (int t = 0; t < NT; ++t) {
          const hn::Vec<DF> xv = PaddedActivations(df, x + t * xs, vectors * L, tail);
          for (int r = 0; r < NR; ++r) acc[t][r] = hn::MulAdd(hn::Load(df, pad[r]), xv, acc[t][r]);
        }
      if (kChains > 1 && chain == 0)
        for (int t = 0; t < NT; ++t)
          for (int r = 0; r < NR; ++r) hn::Store(acc[t][r], df, chain0 + (t * NR + r) * L);
    }
    if constexpr (kChains > 1)
      for (int t = 0; t < NT; ++t)
        for (int r = 0; r < NR; ++r) acc[t][r] = hn::Add(hn::Load(df, chain0 + (t * NR + r) * L), acc[t][r]);
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) sums[t * NR + r] = hn::GetLane(hn::SumOfLanes(df, acc[t][r]));
}

// sums[t][r] = dot(weight row r, x row t) for NT tokens and NR rows. Rows at w + r * ws (elements of T), tokens at
// x + t * xs (elements of X: float, or bf16 activations). Q8 (T = int8_t): `scales` + r * ss holds row r's block
// scales (f16 bits); a block's widened quants are multiplied by its scale before the multiply-add (one rounding more
// per product than a float weight, within the tolerance), in one chain. Float weights: in kChains chains.
// `carry_in` (float weights' column slices, SlicedTiles): the chains' accumulators the earlier columns left (chain
// c's at carry_in + c NT NR L, token t's row r at + (t NR + r) L) to start from instead of zeros; the row's first
// `first_vector` vectors were those columns (w and x point past them).
template <int NT, int NR, class T, class X>
HWY_INLINE void Tile(const T* HWY_RESTRICT w, int64_t ws, const uint16_t* HWY_RESTRICT scales, int64_t ss,
                     const X* HWY_RESTRICT x, int64_t xs, int64_t K, float sums[NT * NR],
                     const float* carry_in = nullptr, int64_t first_vector = 0) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  hn::Vec<DF> acc[NT][NR];
  if constexpr (std::is_same_v<T, int8_t>) {
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < NR; ++r) acc[t][r] = hn::Zero(df);
    int64_t k = 0;
    // Whole blocks, kQ8Block / L vectors each (x86 vectors hold at most 16 floats, so L divides the block).
    static_assert(kQ8Block % 16 == 0);
    if (kQ8Block % L == 0) {
      for (; k + kQ8Block <= K; k += kQ8Block) {
        hn::Vec<DF> scale[NR];
        for (int r = 0; r < NR; ++r) scale[r] = hn::Set(df, ScaleAt(scales + r * ss, k / kQ8Block));
        for (int64_t j = k; j < k + kQ8Block; j += L) {
          hn::Vec<DF> wv[NR];
          for (int r = 0; r < NR; ++r) wv[r] = hn::Mul(LoadWeights(df, w + r * ws + j), scale[r]);
          for (int t = 0; t < NT; ++t) {
            const hn::Vec<DF> xv = LoadActivations(df, x + t * xs + j);
            for (int r = 0; r < NR; ++r) acc[t][r] = hn::MulAdd(wv[r], xv, acc[t][r]);
          }
        }
      }
    }
    for (; k < K; k += L) {
      const int64_t n = std::min(L, K - k);
      HWY_ALIGN float pad[NR][simd::HWY_NAMESPACE::kMaxLanes] = {};
      PaddedWeights<NR>(w, ws, scales, ss, k, n, pad);
      for (int t = 0; t < NT; ++t) {
        const hn::Vec<DF> xv = PaddedActivations(df, x + t * xs, k, n);
        for (int r = 0; r < NR; ++r) acc[t][r] = hn::MulAdd(hn::Load(df, pad[r]), xv, acc[t][r]);
      }
    }
  } else {
    FloatTile<NT, NR>(w, ws, x, xs, K, sums, carry_in, first_vector);
    return;
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) sums[t * NR + r] = hn::GetLane(hn::SumOfLanes(df, acc[t][r]));
}

// The same sums for q8 weights and q8 activations (ActivationFormat::Q8): per block, the products of the widened
// quants are integers below 2^14 and their lane sums below 2^24, so each block's sums are exact in float32 lanes;
// they are then scaled by the weight block's scale times the activation block's into the accumulators. A block
// shorter than kQ8Block (a row's last, or every block where the lanes do not divide kQ8Block) is summed as integers
// apart and added at the end. x: `NT` tokens of xq from token t0.
template <int NT, int NR>
HWY_INLINE void TileQ8(const int8_t* HWY_RESTRICT w, int64_t ws, const uint16_t* HWY_RESTRICT scales, int64_t ss,
                       const Q8Activations& xq, int64_t t0, int64_t K, float sums[NT * NR]) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df)), xs = xq.stride;
  const int8_t* HWY_RESTRICT x = xq.quants + t0 * xs;
  const float* HWY_RESTRICT xsc = xq.scales + t0 * xq.blocks;
  hn::Vec<DF> acc[NT][NR];
  float apart[NT][NR] = {};
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = hn::Zero(df);
  const int64_t whole = kQ8Block % L == 0 ? K / kQ8Block : 0;
  for (int64_t b = 0; b < whole; ++b) {
    const int64_t k = b * kQ8Block;
    hn::Vec<DF> block[NT][NR];
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < NR; ++r) block[t][r] = hn::Zero(df);
    for (int64_t j = k; j < k + kQ8Block; j += L) {
      hn::Vec<DF> wv[NR];
      for (int r = 0; r < NR; ++r) wv[r] = LoadWeights(df, w + r * ws + j);
      for (int t = 0; t < NT; ++t) {
        const hn::Vec<DF> xv = LoadWeights(df, x + t * xs + j);
        for (int r = 0; r < NR; ++r) block[t][r] = hn::MulAdd(wv[r], xv, block[t][r]);
      }
    }
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < NR; ++r)
        acc[t][r] =
            hn::MulAdd(block[t][r], hn::Set(df, ScaleAt(scales + r * ss, b) * xsc[t * xq.blocks + b]), acc[t][r]);
  }
  for (int64_t b = whole; b < xq.blocks; ++b) {
    const int64_t k = b * kQ8Block, n = std::min<int64_t>(kQ8Block, K - k);
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < NR; ++r) {
        int32_t sum = 0;
        for (int64_t i = 0; i < n; ++i) sum += int32_t(w[r * ws + k + i]) * int32_t(x[t * xs + k + i]);
        apart[t][r] += float(sum) * (ScaleAt(scales + r * ss, b) * xsc[t * xq.blocks + b]);
      }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) sums[t * NR + r] = hn::GetLane(hn::SumOfLanes(df, acc[t][r])) + apart[t][r];
}

template <int NT, int NR, class T>
HWY_INLINE void TileAt(const Job& j, int64_t t0, int64_t r0) {
  const T* w = static_cast<const T*>(j.w) + r0 * j.row_stride;
  const uint16_t* sc = j.scales ? j.scales + r0 * j.scale_stride : nullptr;
  float sums[NT * NR];
  if constexpr (std::is_same_v<T, int8_t>) {
    if (j.activations == ActivationFormat::Q8) {
      TileQ8<NT, NR>(w, j.row_stride, sc, j.scale_stride, j.xq, t0, j.cols, sums);
      store_tile(j, t0, r0, NT, NR, sums);
      return;
    }
  }
  if (j.xb != nullptr) {
    const auto* xb = reinterpret_cast<const hwy::bfloat16_t*>(j.xb);
    Tile<NT, NR>(w, j.row_stride, sc, j.scale_stride, xb + t0 * j.cols, j.cols, j.cols, sums);
  } else {
    Tile<NT, NR>(w, j.row_stride, sc, j.scale_stride, j.x + t0 * j.x_stride, j.x_stride, j.cols, sums);
  }
  store_tile(j, t0, r0, NT, NR, sums);
}

// Whether the tokens a block leaves past its whole tiles (decode's one, or a small batch of sequences) run kRows rows
// at a time or row by row. Row by row each thread's weights are one sequential stream, which the hardware
// prefetcher follows at the bus's speed; kRows rows at a time are kRows short streams a row apart, which it follows
// badly - on Zen 4 (docs/engine.md: 896-wide bf16 rows 20 -> 33 GB/s row by row) and on Zen 3 alike (2026-11-28,
// one thread, 4864x896 bf16 past the caches: one token 1860 -> 1320 us, two 1950-2270 -> 1370-1750 us). Only rows
// longer than kLongRowBytes, whose single multiply-add chain bounds them, go kRows at a time. Each (token, row) sum
// is the same chain of operations either way, so the choice changes no bit.
template <class T>
HWY_INLINE bool RowsTogether(const Job& j) {
  return j.cols * int64_t(sizeof(T)) > kLongRowBytes;
}

// Tokens [t0, t1) left past the whole tiles (a small batch's, or fewer than kTokens) against rows [r, r + NR): up to
// 8 at a time against one row (one chain: 8 sums and 8 activation vectors; 2026-11-29, Zen 4, 2 threads, 8 tokens,
// AVX2 target, 8 a row rather than 4: 700-865 -> 536-721 us), but 6 of two chains' float sums (12 sums and the two
// chains' weight vectors in AVX2's 16 registers: 8 tokens as 8 in two passes were 25-70% slower than one chain,
// as 4 + 4 in one pass 25%, as 6 + 2 1-18%), then 4, 3 (up to kTokens against kRows rows), then the rest.
template <int NR, class T>
HWY_INLINE void LeftTokens(const Job& j, int64_t t0, int64_t t1, int64_t r) {
  constexpr int kMost = NR > 1 ? kTokens : kChains == 2 && !std::is_same_v<T, int8_t> ? 6 : 8;
  int64_t t = t0;
  for (; t + kMost <= t1; t += kMost) TileAt<kMost, NR, T>(j, t, r);
  if (NR == 1 && t + 4 <= t1) TileAt<4, NR, T>(j, t, r), t += 4;
  if (NR == 1 && t + 3 <= t1) TileAt<3, NR, T>(j, t, r), t += 3;
  if (t + 2 <= t1) TileAt<2, NR, T>(j, t, r), t += 2;
  if (t < t1) TileAt<1, NR, T>(j, t, r);
}

// Columns per slice of a float-weight prefill tile: a tile's rows (4 x 4 KB of floats) and its tokens' activations
// stay in L1 while the chunk's tiles pass over them, and the accumulators wait in memory between slices.
constexpr int64_t kSliceColumns = 1024;
constexpr int64_t kSlicedTokens = 24;  // fewer tokens a chunk pay too much for the widening and the carries

// Tile's loop over one chain's vectors of a packed slice: `vectors` column vectors of NR rows, vector i of row r at
// panel + (i NR + r) lanes (one pointer for all the rows), against NT tokens of x in the same order (vector i of
// token t at x + t xs + i lanes: ChainOrderActivations). The accumulators come from carry_in (zero
// without) and go to carry_out, or, given `sums` (the row's last columns, chain kChains - 1), are added to the other
// chain's (`other_chain`, as carry_out) and summed across lanes into sums (FloatTile's last steps).
template <int NT, int NR, class X>
HWY_INLINE void PanelColumns(const float* HWY_RESTRICT panel, int64_t vectors, const X* HWY_RESTRICT x, int64_t xs,
                             const float* carry_in, float* carry_out, const float* other_chain = nullptr,
                             float* sums = nullptr) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  hn::Vec<DF> acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = carry_in ? hn::LoadU(df, carry_in + (t * NR + r) * L) : hn::Zero(df);
  for (int64_t i = 0; i < vectors; ++i) {
    hn::Vec<DF> xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = LoadActivations(df, x + t * xs + i * L);
    for (int r = 0; r < NR; ++r) {
      const hn::Vec<DF> wv = hn::LoadU(df, panel + (i * NR + r) * L);
      for (int t = 0; t < NT; ++t) acc[t][r] = hn::MulAdd(wv, xv[t], acc[t][r]);
    }
  }
  if (sums != nullptr) {
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < NR; ++r) {
        hn::Vec<DF> sum = acc[t][r];
        if constexpr (kChains > 1) sum = hn::Add(hn::LoadU(df, other_chain + (t * NR + r) * L), sum);
        sums[t * NR + r] = hn::GetLane(hn::SumOfLanes(df, sum));
      }
    return;
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) hn::StoreU(acc[t][r], df, carry_out + (t * NR + r) * L);
}

// Where vector v of a slice goes in chain order: the slice's `chain0` chain-0 vectors (ChainVectors(vectors, 0)), then
// chain 1's.
HWY_INLINE int64_t ChainOrderAt(int64_t v, int64_t chain0) {
  const int64_t in_chain = v / (kChains * kRun) * kRun + v % kRun;
  return ChainOf(v) == 0 ? in_chain : chain0 + in_chain;
}

// `tokens` tokens of x (row stride xs) over the whole vectors of every kSliceColumns slice, each slice in chain
// order, token t's at the result + t whole, on a 64-byte boundary (whole is whole vectors, so every vector is on
// one). With two chains each pass of SlicedTiles then reads its vectors one after the other; read in place, every
// run of kRun vectors skips the other chain's (4864x896 bf16, 512 tokens, AVX2 target, 2 threads: 15-20% slower
// than one chain on a loaded machine, 2-3% read in order). With one chain (AVX-512) the order is x's own and the
// copy is for the boundaries: x as a caller's std::vector holds it, 16-byte aligned, splits 3 of 4 512-bit loads
// across two cache lines, and such a load costs two (with the panel aligned too, 2026-11-29, Zen 4, 2 threads, bf16,
// 512 tokens: 4864x896 35.3 -> 18.5 ms, 896x896 6.1 -> 3.3 ms; the panel alone: 22.4 and 4.0). Made once per
// thread for a call's token chunk and kept for the next row groups of the same chunk (Job::call tells a new call).
template <class X>
HWY_INLINE const X* ChainOrderActivations(const Job& j, const X* x, int64_t xs, int64_t tokens, int64_t whole) {
  struct Held {
    uint64_t call = 0;
    const X* x = nullptr;
    int64_t tokens = 0, whole = 0;
    std::vector<X> data;
  };
  static thread_local Held held;
  const auto aligned = [] { return aligned_to_64(held.data.data()); };
  if (held.call == j.call && held.x == x && held.tokens == tokens && held.whole == whole) return aligned();
  constexpr int64_t L = int64_t(hn::MaxLanes(DF()));
  held.data.resize(size_t(tokens * whole) + 64 / sizeof(X));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t k0 = 0; k0 < whole; k0 += kSliceColumns) {
      const int64_t vectors = (std::min(k0 + kSliceColumns, whole) - k0) / L, chain0 = ChainVectors(vectors, 0);
      X* to = aligned() + t * whole + k0;
      for (int64_t v = 0; v < vectors; ++v)
        std::memcpy(to + ChainOrderAt(v, chain0) * L, x + t * xs + k0 + v * L, size_t(L) * sizeof(X));
    }
  held.call = j.call, held.x = x, held.tokens = tokens, held.whole = whole;
  return aligned();
}

// The whole kTokens-token tiles of tokens [t0, tiled) against rows [r, r + NR) of a float, f16 or bf16 matrix, in
// column slices. Each slice's rows are packed once for all the tiles, as floats (f16 / bf16 widened, exactly),
// chain 0's vectors first and then chain 1's, the rows' vectors side by side, so the tiles run on floats from one
// pointer, bound by their multiply-adds instead of the widening (2026-11-29, Zen 3, 2 threads, 512 tokens: see
// docs/checkpoints.md). Each (token, row) sum takes FloatTile's operations in its order (PanelColumns is its loop
// over a chain; FloatTile adds the last columns and the chains).
template <int NR, class T>
HWY_INLINE void SlicedTiles(const Job& j, int64_t t0, int64_t tiled, int64_t r) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df)), K = j.cols, whole = K / L * L;
  const int64_t chain_sums = int64_t(kTokens) * NR * L, per_tile = kChains * chain_sums;
  // A slice starts chain 0's run, so its vectors' chains are the row's.
  static_assert(kSliceColumns % (kChains * kRun * hn::MaxLanes(DF())) == 0);
  static thread_local std::vector<float> carry, panel;
  carry.resize(size_t((tiled - t0) / kTokens * per_tile));
  panel.resize(size_t(NR * kSliceColumns + 16));
  // vectors on 64-byte boundaries, as ChainOrderActivations' (a 512-bit load across two cache lines costs two)
  float* const packed = aligned_to_64(panel.data());
  const T* rows = static_cast<const T*>(j.w) + r * j.row_stride;
  const auto* xb = reinterpret_cast<const hwy::bfloat16_t*>(j.xb);
  // The chunk's x in chain order (xo's row 0 is token t0; bf16 activations: xbo's), row stride `whole`.
  const hwy::bfloat16_t* xbo = xb != nullptr ? ChainOrderActivations(j, xb + t0 * j.cols, j.cols, tiled - t0, whole)
                                             : nullptr;
  const float* xo =
      xb != nullptr ? nullptr : ChainOrderActivations(j, j.x + t0 * j.x_stride, j.x_stride, tiled - t0, whole);
  for (int64_t k0 = 0; k0 < whole; k0 += kSliceColumns) {
    const int64_t vectors = (std::min(k0 + kSliceColumns, whole) - k0) / L;
    const int64_t chain0 = ChainVectors(vectors, 0);
    for (int64_t v = 0; v < vectors; ++v) {
      const int64_t at = ChainOrderAt(v, chain0);
      for (int i = 0; i < NR; ++i)
        hn::StoreU(LoadWeights(df, rows + i * j.row_stride + k0 + v * L), df, packed + (at * NR + i) * L);
    }
    // Rows with no columns past the whole vectors end in the last slice's last chain: sums and outputs from there.
    const bool ends = whole == K && k0 + kSliceColumns >= whole;
    for (int64_t t = t0; t < tiled; t += kTokens) {
      float* c = carry.data() + (t - t0) / kTokens * per_tile;
      float sums[kTokens * NR];
      for (int chain = 0; chain < kChains; ++chain) {
        const float* p = packed + (chain == 0 ? 0 : chain0 * NR * L);
        const int64_t n = chain == 0 ? chain0 : vectors - chain0, x0 = k0 + (chain == 0 ? 0 : chain0 * L);
        float* cc = c + chain * chain_sums;
        const float* in = k0 > 0 ? cc : nullptr;
        float* last = ends && chain == kChains - 1 ? sums : nullptr;
        if (xb != nullptr) PanelColumns<kTokens, NR>(p, n, xbo + (t - t0) * whole + x0, whole, in, cc, c, last);
        else PanelColumns<kTokens, NR>(p, n, xo + (t - t0) * whole + x0, whole, in, cc, c, last);
      }
      if (ends) store_tile(j, t, r, kTokens, NR, sums);
    }
  }
  if (whole == K) return;
  // The columns past the whole vectors (fewer than the lanes, so FloatTile has no whole vector) and the chains' sum:
  // on the rows as stored, from the carried chains.
  for (int64_t t = t0; t < tiled; t += kTokens) {
    const float* c = whole > 0 ? carry.data() + (t - t0) / kTokens * per_tile : nullptr;
    float sums[kTokens * NR];
    if (xb != nullptr)
      Tile<kTokens, NR>(rows + whole, j.row_stride, nullptr, 0, xb + t * j.cols + whole, j.cols, K - whole, sums, c,
                        whole / L);
    else
      Tile<kTokens, NR>(rows + whole, j.row_stride, nullptr, 0, j.x + t * j.x_stride + whole, j.x_stride, K - whole,
                        sums, c, whole / L);
    store_tile(j, t, r, kTokens, NR, sums);
  }
}

// The whole tiles of tokens [t0, tiled) against rows [r0, r1): float rows (f16 / bf16 widened) in column slices
// when the chunk has tokens enough, q8's rows (which need their scales) and short chunks tile by tile.
template <class T>
HWY_INLINE void WholeTiles(const Job& j, int64_t t0, int64_t tiled, int64_t r0, int64_t r1) {
  int64_t r = r0;
  if constexpr (!std::is_same_v<T, int8_t>) {
    if (tiled - t0 >= kSlicedTokens) {
      for (; r + kRows <= r1; r += kRows) SlicedTiles<kRows, T>(j, t0, tiled, r);
      for (; r < r1; ++r) SlicedTiles<1, T>(j, t0, tiled, r);
      return;
    }
  }
  for (; r + kRows <= r1; r += kRows)
    for (int64_t t = t0; t < tiled; t += kTokens) TileAt<kTokens, kRows, T>(j, t, r);
  for (; r < r1; ++r)
    for (int64_t t = t0; t < tiled; t += kTokens) TileAt<kTokens, 1, T>(j, t, r);
}

// Tokens [t0, t1) against rows [r0, r1): the whole kTokens x kRows tiles, then the tokens left (decode's one, or a
// small batch of up to kSmallBatch: all of them against each row while it is in L1) row by row, or kRows rows at
// a time for long rows (RowsTogether).
template <class T>
HWY_INLINE void Block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  const int64_t tiled = t1 - t0 <= kSmallBatch ? t0 : t0 + (t1 - t0) / kTokens * kTokens;
  WholeTiles<T>(j, t0, tiled, r0, r1);
  if (tiled == t1) return;
  int64_t r = r0;
  if (RowsTogether<T>(j))
    for (; r + kRows <= r1; r += kRows) LeftTokens<kRows, T>(j, tiled, t1, r);
  for (; r < r1; ++r) LeftTokens<1, T>(j, tiled, t1, r);
}

// A block format's rows (WeightFormat::Q8_0 ... Q5_1) in float32 lanes: each row decoded to its float values once
// per token chunk (block_weights.h: the exact values, but a min's one rounding), q8 activations decoded to
// quant x scale (exact in float), then the float tiles row by row. The portable path: AVX2 and up run the integer
// kernels of linear_blocks-inl.h for q8 activations (vpdpbusd at AVX-512 targets of a CPU with AVX512-VNNI).
HWY_INLINE void BlockFormatBlock(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  static thread_local std::vector<float> row, xs;
  const int64_t K = j.cols, T = t1 - t0;
  row.resize(size_t(K));
  const float* x = j.x + t0 * j.x_stride;
  int64_t x_stride = j.x_stride;
  if (j.activations == ActivationFormat::Q8) {
    xs.resize(size_t(T * K));
    for (int64_t t = 0; t < T; ++t) {
      const int8_t* q = j.xq.quants + (t0 + t) * j.xq.stride;
      const float* sc = j.xq.scales + (t0 + t) * j.xq.blocks;
      for (int64_t c = 0; c < K; ++c) xs[size_t(t * K + c)] = float(q[c]) * sc[c / kQ8Block];
    }
    x = xs.data(), x_stride = K;
  }
  const int64_t tiled = T / kTokens * kTokens;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* blocks = block_row(j.format, j.w, j.row_stride, r);
    for (int64_t u = 0; u < K / kUnit; ++u) unit_values(j.format, blocks, u, row.data() + u * kUnit);
    float sums[kTokens];
    for (int64_t t = 0; t < tiled; t += kTokens) {
      Tile<kTokens, 1>(row.data(), K, nullptr, 0, x + t * x_stride, x_stride, K, sums);
      store_tile(j, t0 + t, r, kTokens, 1, sums);
    }
    for (int64_t t = tiled; t < T; ++t) {
      Tile<1, 1>(row.data(), K, nullptr, 0, x + t * x_stride, x_stride, K, sums);
      store_tile(j, t0 + t, r, 1, 1, sums);
    }
  }
}

void BlockOf(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  if (is_block_format(j.format)) return BlockFormatBlock(j, t0, t1, r0, r1);
  switch (j.format) {
    case WeightFormat::F32: return Block<float>(j, t0, t1, r0, r1);
    case WeightFormat::F16: return Block<hwy::float16_t>(j, t0, t1, r0, r1);
    case WeightFormat::BF16: return Block<hwy::bfloat16_t>(j, t0, t1, r0, r1);
    case WeightFormat::Q8: return Block<int8_t>(j, t0, t1, r0, r1);
    default: return;
  }
}

// bf16 activations on the CPU's bf16 dot products: at AVX-512 targets of an x86 CPU that has them.
bool UsesBf16Dot() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return bf16_dot_supported();
#else
  return false;
#endif
}

// int8 dot products for q8 activations: at AVX-512 targets of an x86 CPU that has AVX512-VNNI.
bool UsesQ8Dot() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return q8_dot_supported();
#else
  return false;
#endif
}

// AVX2's byte products for q8 activations (linear_q8_avx2.cpp): at x86 targets from AVX2 up, where the int8 dot
// products (UsesQ8Dot) are not there.
bool UsesQ8Bytes() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return q8_avx2_supported();
#else
  return false;
#endif
}

// AVX-VNNI's vpdpbusd for the block formats' q8-activation products (linear_blocks_avx_vnni.cpp): where AVX2's byte
// products run (q8_bytes) and the int8 dot products do not (q8_dot), on a CPU with AVX-VNNI, unless a test turned it
// off (detail::allow_avx_vnni). Takes the other two answers so RunJobs asks each question once.
bool AvxVnniBesideByteProducts(bool q8_dot, bool q8_bytes) {
  return !q8_dot && q8_bytes && avx_vnni_supported() && detail::avx_vnni_allowed();
}
bool UsesQ8AvxVnni() { return AvxVnniBesideByteProducts(UsesQ8Dot(), UsesQ8Bytes()); }

// A whole block of kQ8Block finite floats quantized in lanes by q8_quantize_block's rule (the same float division,
// and round_away's truncation and step, so the same quants): returns the scale.
HWY_INLINE float QuantizeWholeBlock(const float* HWY_RESTRICT v, int8_t* HWY_RESTRICT q, float amax) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<int8_t, DF> d8;
  const int64_t L = int64_t(hn::Lanes(df));
  const float scale = amax / 127.0f;
  const auto s = hn::Set(df, scale), half = hn::Set(df, 0.5f), one = hn::Set(df, 1.0f), top = hn::Set(df, 127.0f);
  for (int64_t i = 0; i < kQ8Block; i += L) {
    auto r = hn::Zero(df);
    if (scale > 0) {
      const auto x = hn::Div(hn::LoadU(df, v + i), s);
      const auto t = hn::ConvertTo(df, hn::ConvertTo(di, x));  // truncation (|x| <= 127 + rounding)
      const auto f = hn::Sub(x, t);
      r = hn::Sub(hn::Add(t, hn::IfThenElseZero(hn::Ge(f, half), one)),
                  hn::IfThenElseZero(hn::Le(f, hn::Neg(half)), one));
      r = hn::Min(hn::Max(r, hn::Neg(top)), top);
    }
    hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, r)), d8, q + i);
  }
  return scale;
}

// One token's x quantized (ActivationFormat::Q8) into row t of xq: the quants and scales, the padding zero, and the
// int8 kernel's corrections and scale pairs. Whole blocks of finite values in lanes, the rest (a short last block,
// a NaN or an infinity) by q8_quantize_block.
void QuantizeToken(const float* x, int64_t cols, const Q8Activations& xq, int64_t t) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df)), xs = xq.stride;
  int8_t* q = xq.quants + t * xs;
  for (int64_t b = 0; b < xq.blocks; ++b) {
    const int64_t k = b * kQ8Block, n = std::min<int64_t>(kQ8Block, cols - k);
    float& scale = xq.scales[t * xq.blocks + b];
    bool lanes = n == kQ8Block && kQ8Block % L == 0;
    if (lanes) {
      auto amax = hn::Zero(df);
      auto finite = hn::Zero(df);  // 0 while every value is finite (|v| < infinity)
      const auto inf = hn::Set(df, std::numeric_limits<float>::infinity());
      for (int64_t i = 0; i < kQ8Block; i += L) {
        const auto a = hn::Abs(hn::LoadU(df, x + k + i));
        amax = hn::Max(amax, a);
        finite = hn::Or(finite, hn::IfThenZeroElse(hn::Lt(a, inf), hn::Set(df, 1.0f)));
      }
      lanes = hn::GetLane(hn::MaxOfLanes(df, finite)) == 0.0f;
      if (lanes) scale = QuantizeWholeBlock(x + k, q + k, hn::GetLane(hn::MaxOfLanes(df, amax)));
    }
    if (!lanes) scale = q8_quantize_block(x + k, n, q + k);
    for (int64_t i = n; i < kQ8Block; ++i) q[k + i] = 0;
  }
  for (int64_t i = xq.blocks * kQ8Block; i < xs; ++i) q[i] = 0;  // the pair's padding
  // The int8 kernel's operands per pair of blocks (Q8Activations).
  for (int64_t b = 0; b < xq.blocks; ++b) {  // the block formats' min term (linear_blocks-inl.h)
    int32_t sum = 0;
    for (int64_t i = 0; i < kQ8Block; ++i) sum += q[b * kQ8Block + i];
    xq.sums[t * xq.blocks + b] = sum;
    xq.scaled_sums[t * xq.blocks + b] = xq.scales[t * xq.blocks + b] * float(sum);
  }
  int32_t* corrections = xq.corrections + t * xs / 4;
  float* pairs = xq.scale_pairs + t * xs / 4;
  for (int64_t i = 0; i < xs / 4; ++i) {
    corrections[i] = -128 * (int32_t(q[4 * i]) + q[4 * i + 1] + q[4 * i + 2] + q[4 * i + 3]);
    const int64_t b = i / 8;  // lane i of pair i / 16 sums block b's quants
    pairs[i] = b < xq.blocks ? xq.scales[t * xq.blocks + b] : 0.0f;
  }
}

// Converts the x rows of the jobs that own a bf16 or q8 copy (Job::round_x, Job::quantize_x) into it, rows shared
// among the team.
void ConvertActivations(const Job* jobs, int count) {
  for (int i = 0; i < count; ++i) {
    const Job& j = jobs[i];
    if (!j.round_x && !j.quantize_x) continue;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < j.tokens; ++t) {
      const float* x = j.x + t * j.x_stride;
      if (j.quantize_x) {
        QuantizeToken(x, j.cols, j.xq, t);
        continue;
      }
      uint16_t* xb = j.xb + t * j.cols;
      for (int64_t c = 0; c < j.cols; ++c) xb[c] = float_to_bf16(x[c]);
    }
  }
}

void RunJobs(const Job* jobs, int count, int threads) {
  // Row groups of every job, numbered one after another, are the unit of work: a thread streams its rows'
  // weights once per token chunk. Tokens go in chunks whose activations (chunk x cols floats) stay in L2 while the
  // rows pass (the smallest chunk of any job; chunking changes no result bit).
  const bool dot = UsesBf16Dot(), q8_dot = UsesQ8Dot(), q8_bytes = UsesQ8Bytes();
  const bool q8_avx_vnni = AvxVnniBesideByteProducts(q8_dot, q8_bytes);
  // A group is kRows rows, or a panel of kPanelRows for the byte products of the block formats and of q8 weights
  // without VNNI (their prefill packs a panel's units once per chunk: linear_blocks-inl.h).
  const auto group_rows = [&](const Job& j) -> int64_t {
    const bool panels = (is_block_format(j.format) || (j.format == WeightFormat::Q8 && !q8_dot)) && q8_bytes &&
                        j.activations == ActivationFormat::Q8 && j.tokens > kSmallBatch;
    return panels ? kPanelRows : kRows;
  };
  std::vector<int64_t> first(size_t(count) + 1, 0);  // job i's groups are [first[i], first[i + 1])
  int64_t chunk = std::numeric_limits<int64_t>::max(), tokens = 0;
  for (int i = 0; i < count; ++i) {
    const Job& j = jobs[i];
    first[size_t(i) + 1] = first[size_t(i)] + (j.rows + group_rows(j) - 1) / group_rows(j);
    // One token's activations: float32, bf16, or q8's quants, corrections and scale pairs (3 bytes an element).
    // The panels read only the quants, scales and scaled sums (1.25 bytes an element).
    const int64_t element = j.activations == ActivationFormat::BF16 ? 2 : j.activations == ActivationFormat::Q8 ? 3 : 4;
    const int64_t cols = std::max<int64_t>(j.cols, 1);
    const int64_t x_bytes = group_rows(j) == kPanelRows ? cols + cols / 4 : element * cols;
    chunk = std::min(chunk, std::max<int64_t>(kTokens, (kChunkBytes / x_bytes) / kTokens * kTokens));
    tokens = std::max(tokens, j.tokens);
  }
  const int64_t groups = first.back();
  threads = int(std::min<int64_t>(threads, groups));
  // Tokens [t0, t1) of job j against rows [r0, r1), on the kernel its formats and this CPU take.
  const auto run_block = [&](const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
    const bool q8 = j.activations == ActivationFormat::Q8;
    if (is_block_format(j.format)) {
      if (q8_dot && q8) blocks_vnni_block(j, t0, t1, r0, r1);
      else if (q8_avx_vnni && q8) blocks_avx_vnni_block(j, t0, t1, r0, r1);
      else if (q8_bytes && q8) blocks_avx2_block(j, t0, t1, r0, r1);
      else BlockOf(j, t0, t1, r0, r1);
    } else if (dot && j.activations == ActivationFormat::BF16) bf16_dot_block(j, t0, t1, r0, r1);
    else if (q8_dot && q8) q8_dot_block(j, t0, t1, r0, r1);
    else if (q8_bytes && q8) q8_avx2_block(j, t0, t1, r0, r1);
    else BlockOf(j, t0, t1, r0, r1);
  };
  // Each token chunk's groups in contiguous runs per thread, a thread that is done taking over the back of another's
  // (stealing_ranges.h); no barrier between chunks (their outputs are apart), one at the region's end.
  const int64_t chunks = (tokens + chunk - 1) / chunk;
  detail::StealingRanges ranges(groups, threads, chunks);
#pragma omp parallel num_threads(threads)
  {
    ConvertActivations(jobs, count);  // ends with the team's barrier: every converted row is there before any tile
    const int me = omp_get_thread_num();
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t t0 = c * chunk;
      int i = 0;  // the job of group g (a run's groups come in increasing order)
      for (int64_t g0, g1; ranges.next(c, me, g0, g1);) {
        if (g0 < first[size_t(i)]) i = 0;
        for (int64_t g = g0; g < g1; ++g) {
          while (g >= first[size_t(i) + 1]) ++i;
          const Job& j = jobs[i];
          if (t0 >= j.tokens) continue;
          const int64_t r0 = (g - first[size_t(i)]) * group_rows(j), t1 = std::min(j.tokens, t0 + chunk);
          run_block(j, t0, t1, r0, std::min(j.rows, r0 + group_rows(j)));
        }
      }
    }
  }
}

const char* LinearTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace rotary::linear_detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary::linear_detail {
HWY_EXPORT(RunJobs);
HWY_EXPORT(LinearTargetName);
HWY_EXPORT(UsesBf16Dot);
HWY_EXPORT(UsesQ8Dot);
HWY_EXPORT(UsesQ8Bytes);
HWY_EXPORT(UsesQ8AvxVnni);

void run(const Job* jobs, int count, int threads) { HWY_DYNAMIC_DISPATCH(RunJobs)(jobs, count, threads); }

}  // namespace rotary::linear_detail

const char* rotary::detail::linear_simd_target() { return HWY_DYNAMIC_DISPATCH(linear_detail::LinearTargetName)(); }
bool rotary::linear_uses_bf16_dot() { return HWY_DYNAMIC_DISPATCH(linear_detail::UsesBf16Dot)(); }
bool rotary::linear_uses_q8_dot() { return HWY_DYNAMIC_DISPATCH(linear_detail::UsesQ8Dot)(); }
const char* rotary::linear_q8_products() {
  if (linear_uses_q8_dot()) return "int8 dot products (AVX512-VNNI)";
  if (HWY_DYNAMIC_DISPATCH(linear_detail::UsesQ8AvxVnni)())
    return "int8 dot products (AVX-VNNI) for the block formats, byte products (AVX2) for q8 weights";
  if (HWY_DYNAMIC_DISPATCH(linear_detail::UsesQ8Bytes)()) return "byte products (AVX2)";
  return "float32 lanes";
}
#endif  // HWY_ONCE
