// rotary/kv_cache.h: a key/value cache for autoregressive decoding, and one-token attention over it for every
// position mode of attention.h (None, Rope, Rerope, LeakyRerope; log-n; RoPER; MHA/GQA/MQA). See docs/decode.md.
//
// One KvCache holds ONE sequence: sequences of a batch have their own lengths, positions and lifetimes, so a
// batch is a list of caches (attention_decode takes a span of them and spreads (sequence, kv head, key chunk)
// tasks over the threads). What a cache stores depends on the mode, so a step never re-rotates the cache
// (a = freqs.attention_factor, d = pos_i - pos_j):
//   None         k_j                      the keys as given
//   Rope         a R(pos_j) k_j           rotated once at append
//   Rerope(w)    k_j                      un-rotated. At a step, keys with d < w (a suffix of the cache, at most w
//                                         keys) are rotated by R(-d) from a table of cos/sin per distance; every
//                                         farther key is scored against ONE rotated query:
//                                         q . a^2 R(-w) k_j = (a^2 R(w) q) . k_j
//   LeakyRerope  k_j and a R(pos_j/k) k_j a second copy: a far key (distance w + (d - w)/k) costs one dot with
//                                         a R((pos_i - w)/k + w) q; near keys as Rerope
// So a ReRoPE step reads the same bytes as a RoPE step; only the <= w near keys cost a rotation.
// RoPER (any rotary mode; as attention_forward_reference defines it: value j is turned by R(-delta_ij), delta_ij
// the distance the score sees, clipped or leaky): Rope stores R(pos_j) v_j and turns the output by R(-pos_i);
// Rerope keeps v_j, turns near values by R(-d) with the key's table row and the far sum once by R(-w); Leaky
// also keeps R(pos_j/k) v_j and turns the far sum once by R(w/k - w - pos_i/k).
// Keys and values are stored with their features permuted to the half-split order, each half padded (see
// KvCacheLayout); the permutation changes no dot product and makes every rotation contiguous SIMD.
// Storage KvStorage::Q8 keeps each stored row (after its rotation, as above) as int8 in blocks of kQ8Block with one
// float scale per block, by the q8 activations' rule (linear.h: q8_quantize_block): 1.125 bytes a feature instead
// of 2 (bf16) or 4 (f32) - llama.cpp's q8_0 cache idea - for models whose cache outgrows the machine.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "rotary/attention.h"
#include "rotary/dtype.h"
#include "rotary/linear.h"
#include "rotary/rope.h"
#include "rotary/rope_spec.h"

namespace rotary {

// How a cache stores its keys and values.
enum class KvStorage : uint8_t {
  Dtype,  // in the cache's dtype
  Q8,     // int8 blocks of kQ8Block features with a float scale each (q8_quantize_block: scale = max |x| / 127,
          // round(x / scale)); an element's error <= its block's scale / 2; a NaN or infinity in a block makes its
          // scale non-finite, so the scores or outputs that read it turn NaN. dtype f32, bf16 or f16 (q, o and the
          // appended k, v); not f64, the reference precision. Rows padded to a multiple of kQ8Block.
};
const char* kv_storage_name(KvStorage s);  // "dtype", "q8"

struct KvCacheConfig {
  int64_t capacity = 0;      // most tokens the cache holds; append beyond it throws rotary::Error
  int64_t kv_heads = 0;      // Hkv
  int head_dim = 0;          // D, 1..4096
  DType dtype = DType::F32;  // storage of keys, values, q and o (with storage Q8: of q, o and appended k, v)
  PositionParams pos;        // as attention.h; *pos.freqs is copied into the cache
  int threads = 0;           // OpenMP threads of append at most; 0: omp_get_max_threads() (short appends use one)
  KvStorage storage = KvStorage::Dtype;
};

// How the cache lays out a stored key or value row (element offsets; every pad holds zeros). Rotary pair i of the
// caller's layout (features (2i, 2i+1) interleaved, (i, i + r/2) half-split) sits at [i] and [half + i];
// feature f >= rotary_dim at [2 * half + f - rotary_dim].
struct KvCacheLayout {
  int64_t row_stride = 0;  // elements per stored row: 2 * half + pass
  int half = 0;            // rotary pairs rounded up to kPad (0 for mode None)
  int pass = 0;            // D - rotary_dim rounded up to kPad (Q8: and to make row_stride a multiple of 32)
  static constexpr int kPad = 16;
};
// Bytes the cache of `config` allocates for keys and values (and Leaky's far copies, scales with Q8): what a
// caller budgets before constructing it. Needs config.pos valid (as the constructor checks).
int64_t kv_cache_bytes(const KvCacheConfig& config);

class KvCache {
 public:
  // Validates the config (names the field on error) and allocates capacity rows; the storage is not touched
  // until append writes it.
  explicit KvCache(const KvCacheConfig& config);
  ~KvCache();
  KvCache(KvCache&&) noexcept;
  KvCache& operator=(KvCache&&) noexcept;

  // Appends n tokens. k, v: [n, Hkv, D] strided views in the cache's dtype; positions: [n] int64, |pos| <= 2^53
  // (>= 0 with log-n), strictly increasing and greater than the last cached position. Throws rotary::Error (and
  // appends nothing) when the cache would overflow: "kv_cache.append: size 4096 + 1 exceeds capacity = 4096".
  void append(int64_t n, const HeadsView& k, const HeadsView& v, const int64_t* positions);
  void clear();  // size = 0; capacity kept
  // A new cache of this one's config with `capacity` rows holding this one's first n tokens (their stored rows and
  // positions copied, bit for bit): a prefix of a sequence kept for later requests that start with the same tokens
  // (`rotary serve`'s prefix cache). rotary::Error unless 0 <= n <= size() and n <= capacity.
  KvCache copy_prefix(int64_t n, int64_t capacity) const;

  // Saves the cache - its shape, dtype, storage, position params, positions and every stored array - to `path`
  // atomically (written beside it, synced, renamed: the file is whole or absent; docs/decode.md "Saved caches").
  // `fingerprint`: the caller's tag for what made the rows (a model), which open() must be given back. A
  // `rotary generate` prompt of 8k tokens on a 13B model is half an hour of CPU: this keeps it.
  void save(const std::string& path, uint64_t fingerprint = 0) const;
  // The cache saved at `path`, continued: its tokens, and room for expected.capacity more (the capacity is the
  // saved size + expected.capacity). The file must have been saved from a cache of exactly `expected`'s kv_heads,
  // head_dim, dtype, storage and position params (mode, frequencies and attention factor, window, leaky_k, log-n,
  // RoPER) with `fingerprint`: anything else, and a damaged, truncated or padded file, is a rotary::Error naming
  // the file and the field. The rows are read into the cache's own memory (the file is not kept open).
  static KvCache open(const std::string& path, const KvCacheConfig& expected, uint64_t fingerprint = 0);
  // The same from `bytes` bytes at `data` (8-byte aligned); `source` names them in errors.
  static KvCache open_bytes(const void* data, size_t bytes, const KvCacheConfig& expected, uint64_t fingerprint,
                            const std::string& source);

  int64_t size() const;
  int64_t capacity() const;
  int64_t kv_heads() const;
  int head_dim() const;
  DType dtype() const;
  KvStorage storage() const;
  const PositionParams& pos() const;  // pos().freqs points at the cache's own copy (null for None)
  const KvCacheLayout& layout() const;
  int64_t last_position() const;  // position of the newest token; requires size() > 0

  // Storage, head-major so one kv head's rows stream contiguously; rows in KvCacheLayout order; elements in the
  // dtype, or with Q8 int8 quants with a float scale per block: element e of an array (e from the array's start)
  // = quants[e] * scales[e / kQ8Block], the scales of keys() at key_scales() and so on (null unless Q8).
  const int64_t* positions() const;  // [size]
  const void* keys() const;          // [Hkv, capacity, row_stride]: Rope a R(pos_j) k_j, others k_j
  const void* keys_far() const;      // [Hkv, capacity, row_stride]: Leaky a R(pos_j / k) k_j; null otherwise
  const void* values() const;        // [Hkv, capacity, row_stride]: Rope with RoPER R(pos_j) v_j, others v_j
  const void* values_far() const;    // [Hkv, capacity, row_stride]: Leaky with RoPER R(pos_j / k) v_j; else null
  const float* key_scales() const;         // Q8: [Hkv, capacity, row_stride / kQ8Block]
  const float* key_far_scales() const;     // Q8 with keys_far()
  const float* value_scales() const;       // Q8
  const float* value_far_scales() const;   // Q8 with values_far()
  // Rerope/Leaky: cos (at [0, half)) and sin (at [half, 2 half)) of distance d = 0 .. near_table_rows()-1
  // (pure rotations, no attention factor), float64 for F64 caches and fp32 otherwise; null for None/Rope.
  const void* near_table() const;
  int64_t near_table_rows() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct DecodeParams {
  HeadsView q;                           // [batch, Hq, D] one new token per sequence, in the caches' dtype;
                                         // token_stride steps from one sequence to the next
  HeadsView o;                           // [batch, Hq, D] output
  void* lse = nullptr;                   // [batch, Hq] log-sum-exp of the scaled scores (f64 for F64 caches,
                                         // else f32); optional
  const int64_t* q_positions = nullptr;  // [batch], each >= its cache's last position; null: the last position
                                         // (the new token's k, v already appended, the usual decode step)
  double softmax_scale = 0;              // 0 means 1/sqrt(D)
  int threads = 0;                       // OpenMP threads at most; 0: omp_get_max_threads()
  int64_t split_keys = 0;                // keys per split-K chunk; 0: automatic (enough chunks for the threads)
};

// Throws rotary::Error naming the field on anything that does not fit (null cache, empty cache, mismatched
// dtype / head_dim / kv_heads across caches, Hq % Hkv != 0, overlapping views, q position before the cache).
void validate_decode_params(std::span<const KvCache* const> caches, const DecodeParams& p);

// Fast: Highway SIMD + OpenMP split-K (flash-decoding): each (sequence, kv head, key chunk) task keeps a partial
// softmax (max, sum, weighted values) for the Hq/Hkv query heads of its group; a combine step merges the chunks.
// Accumulation fp32 (fp64 for F64 caches).
void attention_decode(std::span<const KvCache* const> caches, const DecodeParams& p);
inline void attention_decode(const KvCache& cache, const DecodeParams& p) {
  const KvCache* one[1] = {&cache};
  attention_decode(std::span<const KvCache* const>(one, 1), p);
}

// float64 oracle with the same contract: scalar, straight from each mode's definition (std::cos/std::sin of the
// exact distance, no tables, no split).
void attention_decode_reference(std::span<const KvCache* const> caches, const DecodeParams& p);
inline void attention_decode_reference(const KvCache& cache, const DecodeParams& p) {
  const KvCache* one[1] = {&cache};
  attention_decode_reference(std::span<const KvCache* const>(one, 1), p);
}

// BASELINE, not for use: the ReRoPE reference implementation's decode step (seed 004), done in C++. Each step
// re-rotates the WHOLE un-rotated key cache by its clipped relative distance, R(max(pos_j - pos_i, -w)) k_j
// (Leaky: the leaky distance, cos/sin evaluated per key), into an fp32 buffer, then runs plain attention on it.
// F32 Rerope / LeakyRerope caches without RoPER only. `scratch` is reused across calls (like a caching allocator).
void attention_decode_rerotate_baseline(const KvCache& cache, const DecodeParams& p, std::vector<float>& scratch);

}  // namespace rotary
