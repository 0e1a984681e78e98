// rotary/kv_memory.h: a retrieval memory for attention past a local window (seed 001, Memorizing Transformers).
//
// Keys and values of tokens that left the local window go into a KvMemory (one per layer; every kv head inside).
// A query then attends to two sets: the exact local window (kv_cache.h's decoder, or the fused attention) and the
// top-k memory keys by score, searched exactly over the whole memory here (approximate indexes live in the lab,
// over the same stored vectors). The two partial softmaxes are merged by log-sum-exp, the merge the kernels use:
//   lse = log(e^lse_local + e^lse_mem),  o = e^(lse_local - lse) o_local + e^(lse_mem - lse) o_mem
// so with top_k = the memory size the result IS attention over window + memory (tested against full attention).
//
// Where a retrieved key sits (the seed's problem: under RoPE the score q^T R(pos_j - pos_i) k depends on the
// distance, so a store of plain keys does not rank by the true logits). Each policy fixes what is stored and what
// the store is searched with, so that the inner product IS the attention logit it stands for
// (a = freqs.attention_factor, on the rotary pairs only as everywhere in the core; lambda = the log-n factor of the
// query's position, 1 without log-n):
//   Exact       stored a R(pos_j) k_j, query lambda a R(pos_i) q: RoPE with true positions (a RoPE model's logits)
//   Rerope      stored k_j, query lambda a^2 R(w) q: every memory key at distance w (a ReRoPE model's logits for
//               keys past its window - exact there; for a RoPE model, InfLLM's recipe)
//   NoRotation  stored k_j, query lambda a^2 q: retrieved keys at distance 0 (the seed's Experiment 2: is the
//               rotation of retrieved keys needed at all?)
//   Unlimiformer  the seed's account of Unlimiformer's decoder-only port, its two approximations kept:
//               search: stored k_j, query lambda a^2 (I + P)^T R(m') q with P the pair rotation (x_a, x_b) ->
//               (-x_b, x_a) - the rotated key R(n) k = cos * k + sin * P k taken with cos = sin (the constant
//               dropped), whatever n; Unlimiformer searches hidden states x_j with (W_k + P W_k)^T R(m') q, which
//               ranks the rows identically (k_j = W_k x_j + b_k; the bias adds one constant per query);
//               scoring: the retrieved keys re-rotated with the earliest retrieved one as origin (key j at
//               n'_j = pos_j - min over the retrieved rows) and the query at m' = q_position - query_origin (the
//               first query that retrieved: the first generated token), logit lambda a^2 q^T R(n'_j - m') k_j.
//               So neither the retrieved set nor its logits are the model's own (docs/memory.md measures by how
//               much).
// Values are stored as given (RoPER's value rotation is not supported here). Keys (as the policy stores them) and
// values are kept in KvMemoryConfig::storage - f32, or bf16 / f16 at half the bytes, each element rounded once
// (to nearest even) when appended; every score and sum is computed in fp32 (float64 in the oracle) from them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rotary/attention.h"
#include "rotary/dtype.h"
#include "rotary/kv_cache.h"
#include "rotary/rope.h"
#include "rotary/rope_spec.h"

namespace rotary {

enum class MemoryPolicy : uint8_t { Exact, Rerope, NoRotation, Unlimiformer };
const char* memory_policy_name(MemoryPolicy p);               // "exact", "rerope", "none", "unlimiformer"
MemoryPolicy parse_memory_policy(const std::string& name);  // rotary::Error naming "memory_policy" otherwise

struct KvMemoryConfig {
  int64_t kv_heads = 0;         // Hkv
  int head_dim = 0;             // D, 2..4096
  MemoryPolicy policy = MemoryPolicy::Exact;
  const RopeFreqs* freqs = nullptr;  // the model's rotation (copied); required unless NoRotation without log-n
  int64_t window = 0;           // Rerope: the distance every memory key is placed at, w >= 1
  int64_t logn_train_len = 0;   // L > 1: queries scaled by max(1, ln(pos + 1) / ln L), as attention.h; 0: off
  DType storage = DType::F32;   // keys and values as stored: f32, bf16 or f16
};

class KvMemory {
 public:
  // Validates the config, naming the field on error.
  explicit KvMemory(const KvMemoryConfig& config);
  ~KvMemory();
  KvMemory(KvMemory&&) noexcept;
  KvMemory& operator=(KvMemory&&) noexcept;

  // Writes the memory to `path` atomically - a temporary file beside it, fsync, rename, fsync of the directory
  // (files.h's sync_directory_of) - so the file is either complete or absent, and once save() returns it survives
  // a crash. `fingerprint`: the caller's hash of the model the keys came from (0: none), checked by
  // open(). Layout: docs/memory.md.
  void save(const std::string& path, uint64_t fingerprint = 0) const;
  // Maps a file written by save(), read-only (a million-token memory need not live in RAM). rotary::Error naming
  // the file and what does not fit: not a memory file, truncated or padded, another layout than `expected`
  // (kv_heads, head_dim, policy, window, log-n, the rotation, the storage dtype), another fingerprint. Such a
  // memory cannot append. Files of the first format (RTKVMEM1, before storage dtypes: f32) are read as f32.
  static KvMemory open(const std::string& path, const KvMemoryConfig& expected, uint64_t fingerprint = 0);
  // The reader open() runs on its mapping, for bytes already in memory (tests, fuzzing, a file read some other
  // way): the same checks, every count, length and offset of the header checked against `size` in overflow-safe
  // arithmetic, errors naming `source` as open() names the path. The bytes are BORROWED, not copied: the memory
  // returned points into them (read-only, cannot append), and the caller keeps them alive and unchanged for as
  // long as it (or a memory moved from it) is used. `data` must be aligned to 8 bytes (a mapping or a heap
  // buffer; refused otherwise).
  static KvMemory open_bytes(const void* data, size_t size, const KvMemoryConfig& expected, uint64_t fingerprint = 0,
                             const std::string& source = "memory bytes");
  bool read_only() const;
  // open() and then its rows copied into RAM: a memory that can append (a saved memory that goes on growing:
  // MemoryKvCache::open). The same checks and errors as open().
  static KvMemory read(const std::string& path, const KvMemoryConfig& expected, uint64_t fingerprint = 0);

  // Adds n tokens. k, v: [n, Hkv, D] strided views of `dtype` (any storage dtype; kept as fp32); positions: [n],
  // |pos| <= 2^53. A bad view or dtype is a rotary::Error and adds nothing. The memory grows without bound: it
  // never forgets (no reset when "full", unlike Memorizing Transformers' index).
  void append(int64_t n, const HeadsView& k, const HeadsView& v, const int64_t* positions, DType dtype = DType::F32);
  void clear();

  int64_t size() const;
  int64_t kv_heads() const;
  int head_dim() const;
  const KvMemoryConfig& config() const;  // config().freqs points at the memory's own copy
  // Storage, one contiguous block per kv head of config().storage elements, rows in token order: keys as the
  // policy stores them.
  DType storage() const;
  const void* key_data(int64_t kv_head) const;    // [size, D]
  const void* value_data(int64_t kv_head) const;  // [size, D]
  // The same blocks as fp32 (a memory stored in f32; otherwise a rotary::Error naming kv_memory.storage).
  const float* keys(int64_t kv_head) const;    // [size, D]
  const float* values(int64_t kv_head) const;  // [size, D]
  // Rows [first, first + n) of kv head h's keys as fp32, whatever the storage: out [n, D].
  void key_rows(int64_t kv_head, int64_t first, int64_t n, float* out) const;
  const int64_t* positions() const;            // [size]

  // The vector the store is searched with for query q (fp32 [D]) at position pos (the policy's table above),
  // times softmax_scale (0: 1/sqrt(D)): its inner product with keys(h) row j is the scaled attention logit
  // (Unlimiformer: the approximate search score, the query rotated at pos - query_origin).
  void search_query(const float* q, int64_t pos, double softmax_scale, float* out, int64_t query_origin = 0) const;
  void search_query(const float* q, int64_t pos, double softmax_scale, double* out,  // in float64 (the oracle)
                    int64_t query_origin = 0) const;
  // The scaled logit memory_attention gives row j of kv head h when it retrieves it for query q at pos, in
  // double. The search score for every policy but Unlimiformer, whose logit re-rotates the key with
  // `earliest_retrieved` (the smallest position among the rows retrieved with it) as origin.
  double row_logit(const float* q, int64_t pos, int64_t kv_head, int64_t row, double softmax_scale,
                   int64_t query_origin = 0, int64_t earliest_retrieved = 0) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct MemoryAttentionParams {
  int64_t tokens = 0;                    // queries (a decode step: 1 per sequence; a prefill chunk: several)
  HeadsView q;                           // [tokens, Hq, D] fp32, Hq % Hkv == 0
  const int64_t* q_positions = nullptr;  // [tokens]
  int top_k = 32;                        // memory keys per (query, head), 1..memory size
  double softmax_scale = 0;              // 0 means 1/sqrt(D)
  HeadsView o;                           // [tokens, Hq, D] fp32: in, the local window's output; out, merged
  float* lse = nullptr;                  // [tokens, Hq]: in, the local window's log-sum-exp of scaled scores
                                         // (-inf: no local keys); out, merged
  const int64_t* candidates = nullptr;   // optional [tokens, Hq, top_k]: the rows to attend to, found by an
                                         // approximate index over keys() (lab/memory); -1 = none (an index that
                                         // found fewer). Their scores are computed exactly here. Null: exact search.
  int64_t* retrieved = nullptr;          // optional [tokens, Hq, top_k]: memory rows retrieved, best first (-1
                                         // past the candidates given)
  float* retrieved_scores = nullptr;     // optional [tokens, Hq, top_k]: their scaled logits
  float* memory_mass = nullptr;          // optional [tokens, Hq]: the share of the merged softmax mass on the
                                         // retrieved keys, e^(lse_mem - lse)
  int64_t query_origin = 0;              // policy Unlimiformer: queries sit at q_position - query_origin (the
                                         // position of the first query that retrieved); <= every q_position
  int threads = 0;                       // OpenMP threads at most; 0: omp_get_max_threads()
};

// Throws rotary::Error naming the field (empty memory, top_k outside [1, size], head counts, null pointers, a
// candidate row outside [-1, size)). A (query, head) whose candidates are all -1 (an index that found nothing)
// attends to the window alone: o and lse stay as they came, its memory mass is 0.
void validate_memory_attention(const KvMemory& memory, const MemoryAttentionParams& p);

// Exact top-k over the whole memory (flat inner-product search, fp32, threads over (token, head)), softmax over
// the retrieved keys, merged into o / lse. Ties in score keep the earlier row.
void memory_attention(const KvMemory& memory, const MemoryAttentionParams& p);
// float64 oracle, written apart from the fast path and from search_query / row_logit
// (core/src/memory_attention_reference.cpp): every logit from the policy table above in double (cos/sin of the
// exact angle), a full sort of the rows (ties: the earlier row), the softmax and the merge in double, one thread.
// (The stronger check is against full attention: with top_k = size, window + memory equals
// attention_decode_reference over all the tokens - tests/core/test_kv_memory.cpp.)
void memory_attention_reference(const KvMemory& memory, const MemoryAttentionParams& p);

// A decoder's cache with a memory behind it: the most recent tokens in a KvCache (exact, every position mode of
// kv_cache.h), older ones moved to a KvMemory. The window holds at least `window` and fewer than 2 x `window`
// tokens: when it reaches 2 x window, the oldest `window` move to the memory in one go (an amortised O(1) move per
// token, and the window's cache is rebuilt from the un-rotated rows kept beside it). A decode step attends to the
// window with attention_decode and to the top-k of the memory with memory_attention, merged. fp32 arithmetic; the
// memory's rows stored in memory_storage.
struct MemoryKvCacheConfig {
  int64_t window = 0;              // W >= 1: tokens kept exact at least (>= the ReRoPE window for policy rerope)
  int64_t kv_heads = 0;
  int head_dim = 0;
  PositionParams pos;              // the window's position mode, as kv_cache.h (no RoPER)
  MemoryPolicy policy = MemoryPolicy::Exact;  // where retrieved keys sit; rerope places them at pos.window
  DType memory_storage = DType::F32;          // the memory's keys and values: f32, bf16 or f16 (KvMemoryConfig)
};

// One decode step of a MemoryKvCache: one query token, the window and the top-k of the memory.
struct MemoryDecodeParams {
  HeadsView q;                          // [Hq, D] fp32, Hq % Hkv == 0
  int64_t q_position = 0;               // >= the last position appended
  HeadsView o;                          // [Hq, D] fp32 output
  int top_k = 32;                       // memory keys per head; 0: the window alone; more than the memory holds:
                                        // all of it
  double softmax_scale = 0;             // 0 means 1/sqrt(D)
  float* memory_mass = nullptr;         // optional [Hq]: the share of the softmax mass on the memory
  int64_t* retrieved = nullptr;         // optional [Hq, top_k]: the memory rows retrieved, best first (-1 past
                                        // what there is)
  const int64_t* candidates = nullptr;  // optional [Hq, min(top_k, memory size)], rows or -1: the rows an index
                                        // proposed, attended instead of the exact top-k
                                        // (MemoryAttentionParams::candidates); null: the exact search
  int threads = 0;                      // OpenMP threads at most; 0: omp_get_max_threads()
};

class MemoryKvCache {
 public:
  explicit MemoryKvCache(const MemoryKvCacheConfig& config);  // rotary::Error naming the field
  ~MemoryKvCache();
  MemoryKvCache(MemoryKvCache&&) noexcept;
  MemoryKvCache& operator=(MemoryKvCache&&) noexcept;

  // n tokens, k, v [n, Hkv, D] fp32 un-rotated, positions increasing past the last one.
  void append(int64_t n, const HeadsView& k, const HeadsView& v, const int64_t* positions);
  // One decode step (MemoryDecodeParams above): the window through attention_decode, the memory's top-k through
  // memory_attention, merged into p.o.
  void decode(const MemoryDecodeParams& p) const;

  // Policy Unlimiformer's query origin: the position of the first query that retrieved. The first call fixes it
  // at `position` (decode() calls it when it retrieves; a chunked prefill that retrieves calls it too); later calls
  // return the fixed one.
  int64_t query_origin(int64_t position) const;

  int64_t window_size() const;   // tokens in the window now
  // The window's tokens as appended (un-rotated): keys, values [window_size, Hkv, D], positions [window_size]
  // (a chunked prefill attends to them together with the chunk before appending it). Valid until the next append.
  const float* window_keys() const;
  const float* window_values() const;
  const int64_t* window_positions() const;
  const KvMemory& memory() const;
  int64_t size() const;          // all tokens: window + memory
  const MemoryKvCacheConfig& config() const;

  // The cache to two files and back, so that a book read once is asked about in later runs: `memory_path` the
  // memory (KvMemory::save), `window_path` the window's rows as appended (un-rotated f32 keys and values and their
  // positions: a memory file of policy none). Each file is written atomically (KvMemory::save); `fingerprint` is
  // the caller's hash of the model and settings the rows came from, checked by open(). Policy unlimiformer is
  // refused by name (its query origin is not kept).
  void save(const std::string& memory_path, const std::string& window_path, uint64_t fingerprint = 0) const;
  // A cache with `config` that continues the saved one, appends included: its memory read into RAM
  // (KvMemory::read), its window rebuilt from the saved rows. rotary::Error naming the file and what does not fit:
  // the files' own checks (KvMemory::open: another layout, rotation, storage or fingerprint; damage), a window of
  // 2W rows or more, or of fewer than W behind a non-empty memory, window positions not past the memory's.
  static MemoryKvCache open(const MemoryKvCacheConfig& config, const std::string& memory_path,
                            const std::string& window_path, uint64_t fingerprint = 0);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rotary
