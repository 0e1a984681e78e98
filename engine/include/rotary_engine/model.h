// rotary_engine/model.h: a decoder-only checkpoint run without torch. The weights stay where they are stored (a
// memory-mapped safetensors file: bf16, f16, f32) and the linear layers read them in place through the core's
// kernels (rotary/linear.h), or are converted once at load (LoadOptions::weights: bf16, f16, f32, or q8 - int8
// blocks of 32 with a scale); attention is the core's fused kernel for a prompt and its KV cache (every position
// mode: RoPE with any scaling, ReRoPE, Leaky ReRoPE, log-n) for each new token.
//
//   Model    the architecture and the weights (shared, read-only): Model::load.
//   Session  one sequence: a KV cache per layer and the scratch of its steps (no allocation per decode step).
//
// Families: Llama / Mistral / Qwen2 (RMSNorm, SwiGLU, optional biases, GQA, tied or untied head) and GPT-NeoX /
// Pythia (LayerNorm, GELU, parallel residual, a fused per-head [q | k | v] projection used as one matrix). The
// architecture comes from a Hugging Face config.json through rotary_engine/hf_model.h; the numbers are tested
// against the float64 transcription of transformers (tests/engine) and the nn float32 model (tests/nn).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "rotary/attention.h"
#include "rotary/dtype.h"
#include "rotary/kv_cache.h"
#include "rotary/kv_memory.h"
#include "rotary/memory_pages.h"
#include "rotary/linear.h"
#include "rotary/rope_spec.h"
#include "rotary_engine/kinds.h"

namespace rotary::engine {

struct Architecture {
  int64_t vocab_size = 0, d_model = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, d_ff = 0;
  NormKind norm = NormKind::RmsNorm;
  double norm_eps = 1e-6;
  MlpKind mlp = MlpKind::SwiGlu;
  bool qkv_bias = false, out_bias = false, mlp_bias = false;
  bool parallel_residual = false;  // x + attn(norm1 x) + mlp(norm2 x) (GPT-NeoX)
  bool fused_qkv = false;          // one [3 n_heads head_dim, d_model] projection, per head [q | k | v] (GPT-NeoX)
  bool tie_embeddings = false;     // the LM head is the embedding
  int64_t sliding_window = 0;      // > 0: sequences longer than this are refused (no sliding-window attention)
  void validate() const;           // rotary::Error naming the field
};

// A tensor where it is stored; the engine reads it and never writes it.
struct StoredTensor {
  DType dtype = DType::F32;
  const void* data = nullptr;
  std::vector<int64_t> shape;
  std::string source;  // where it is stored (a checkpoint's tensor name), for messages; empty: the slot's name
  // llama.cpp's block format (a GGUF file's Q8_0, Q4_0, Q4_K, Q5_K or Q6_K tensor; `dtype` is unused): each row of
  // the shape is whole blocks (rotary/ggml_quants.h), used in place by the linear layers (rotary/linear.h); Q8_0 is
  // split into the engine's q8 arrays, bit for bit, when --weights q8 asks for it.
  std::optional<WeightFormat> blocks;
};

// One tensor the engine reads: its name in the engine's terms ("embed", "layers.3.q.weight", ...) and shape, and
// the same name in parts, so that a table of a format's names (rotary_engine/hf_model.h) or of another model's
// parameters maps it without taking the name apart: the block (-1 outside the blocks), the part ("embed",
// "attn_norm", "q", "k", "v", "qkv", "o", "mlp_norm", "gate", "up", "down", "final_norm", "lm_head") and whether it
// is the weight or the bias.
struct TensorSlot {
  std::string name;
  std::vector<int64_t> shape;
  int64_t layer = -1;
  std::string part;
  bool bias = false;
};
// Every tensor the architecture reads, in a fixed order.
std::vector<TensorSlot> tensor_slots(const Architecture& a);

struct LoadOptions {
  std::optional<WeightFormat> weights;  // convert every matrix at load; unset: as stored (f64 becomes f32)
  // The activations' precision in every linear product (rotary/linear.h ActivationFormat): f32, or bf16 - rounded
  // to bf16 as llama.cpp's bf16 products do, for the CPU's bf16 dot products (~1.5-2x prefill where it has them);
  // or q8 - quantized per block of 32 as llama.cpp's Q8_0 products do, for the CPU's int8 dot products (AVX512-VNNI).
  // bf16 needs every matrix in bf16, q8 weights converted to q8 (rotary::Error naming "activations" otherwise).
  // Unset: the weights decide, as llama.cpp's products do - q8 where every matrix as run is q8 (--weights q8) or a
  // block format (a GGUF file's Q8_0, Q4_0, Q4_K, ... as stored), whose integer products are the fast path (their
  // float path dequantizes every weight of every product); f32 otherwise. Model::activations() says which.
  std::optional<ActivationFormat> activations;
  int threads = 0;                      // 0: OpenMP's default
};

class Model {
 public:
  // `lookup(name)` returns the stored tensor for each slot (rotary::Error when absent); its shape must equal the
  // slot's. `keep_alive` holds whatever owns the stored bytes (the mapped files) for as long as the model lives.
  static std::shared_ptr<const Model> load(const Architecture& arch,
                                           const std::function<StoredTensor(const std::string&)>& lookup,
                                           const LoadOptions& options, std::shared_ptr<const void> keep_alive);
  ~Model();

  const Architecture& arch() const;
  WeightFormat matrix_format() const;  // the format of the linear layers' weights as run
  ActivationFormat activations() const;  // LoadOptions::activations, or what the weights chose when it was unset
  int64_t weight_bytes_per_token() const;  // bytes of weights a decode step reads (every matrix and the head)
  int64_t owned_bytes() const;  // bytes the model allocated itself (converted weights, norms, biases)
  // The weights by content: every tensor read, in slot order - its name, stored dtype, shape and bytes as stored
  // (rotary/content_hash.h), hashed at load in the pass that checks them finite. The same weights give the same value
  // wherever and however they are stored on disk (a copy, another mtime); other weights - a fine-tune with the same
  // embeddings - another. Not the conversion: matrix_format() and activations() say that.
  uint64_t weights_hash() const;
  // The LM head: logits [n, vocab_size] of final hidden states [n, d_model] (it reads no sequence state).
  void logits(const float* hidden, int64_t n, float* out, int threads = 0) const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Where positions enter attention, as the core's kernels take it. rope: head_dim and rotary_dim filled; its
// scaling's frequencies are taken at the session's current length for the length-dependent types (dynamic NTK,
// longrope), as transformers does, and the cache is rebuilt from its keys when they change.
struct PositionMethod {
  PositionMode mode = PositionMode::Rope;  // Rope, Rerope or LeakyRerope
  RopeSpec rope;
  int64_t window = 0;          // Rerope / LeakyRerope
  double leaky_k = 1.0;        // LeakyRerope
  int64_t logn_train_len = 0;  // > 1: log-n query scaling
};

// A search over one layer's memory whose code the engine does not hold (the lab's FAISS indexes,
// lab/memory/memory_index.h): MemoryOptions::search_factory makes one per layer over that layer's memory. sync()
// takes in the rows appended since its last call; candidates() proposes p.top_k rows per (token, query head) of p's
// queries, which memory_attention then scores exactly (an approximate search loses rows, never scores them wrong).
class MemorySearch {
 public:
  virtual ~MemorySearch() = default;
  virtual void sync() = 0;
  // out: [p.tokens, Hq, p.top_k] rows, -1 past what it found. Returns the vectors of length D it scored (its work:
  // MemoryStats::scored_share; NaN where it does not count them).
  virtual double candidates(const MemoryAttentionParams& p, int64_t* out) = 0;
  // A saved context (Session::save_context) keeps what a search built, so that a later run over the same memory
  // does not build it again (the lab's query-routed graph: seconds per layer at 100k rows). save: take in the
  // memory's rows and write to `path`, or write nothing when the search keeps nothing. open: called on a search
  // fresh from the factory over an opened context's memory, before its first sync; reads what save wrote at `path`
  // (rotary::Error naming the file when it is damaged or was written for another memory or other build settings),
  // and when there is nothing there for it, leaves the search to build as usual. Defaults: nothing kept.
  virtual void save(const std::string& path) { (void)path; }
  virtual void open(const std::string& path) { (void)path; }
};
using MemorySearchFactory = std::function<std::unique_ptr<MemorySearch>(const KvMemory& memory)>;

// A retrieval memory behind every layer's cache (seed 001; rotary/kv_memory.h, MemoryKvCache): the most recent
// tokens stay exact in a window of `window` to 2 x `window` tokens, older ones move to a KvMemory, and each query
// attends to the window and to the top-k rows of the memory, the two merged by log-sum-exp - so with top_k >= the
// memory's size a session equals one without a memory. Tokens go through in chunks of `chunk` (each chunk attends
// to the window and to itself in one fused call, then to the memory, then joins the window), at any point of a
// sequence, so a book-length prompt needs activations for one chunk only when fed a chunk per forward() call.
struct MemoryOptions {
  MemoryPolicy policy = MemoryPolicy::Exact;  // where retrieved keys sit (kv_memory.h)
  int64_t window = 0;                         // W >= 1 (>= the ReRoPE window with policy rerope)
  int top_k = 32;                             // memory rows per (query, head); 0: the window alone
  DType storage = DType::F32;                 // the memory's keys and values: f32, bf16 or f16
  int64_t chunk = 0;                          // tokens per attention step of a multi-token forward (0: window)
  // How the top-k rows are found: unset, the exact scan of every row; set, rotary/memory_pages.h's page search
  // (pages of consecutive tokens or of alike keys, best bound first; pages_read 0 certifies the scan's top-k up to
  // fp32 ties, P > 0 reads the best P pages).
  std::optional<MemoryPagesConfig> search;
  // Set: the caller's search instead (MemorySearch; with `search` set too, refused). The memory it is made over
  // outlives it.
  MemorySearchFactory search_factory;
  // search_factory's bytes for one kv head's search over `rows` rows of head_dim (Session::bytes_needed counts
  // them; unset: none).
  std::function<int64_t(int64_t rows, int64_t head_dim)> search_bytes;
  int64_t chunk_tokens() const { return chunk > 0 ? chunk : window; }  // tokens per chunk, as run
};

// What the memory did so far (Session::memory_stats).
struct MemoryStats {
  int64_t memory_tokens = 0;       // rows in each layer's memory now
  int64_t retrieving_queries = 0;  // (token, layer) queries that searched a non-empty memory
  double memory_mass = 0;          // their mean share of the softmax mass on the retrieved rows (mean over heads)
  double scored_share = 0;         // vectors the search scored (keys; a page bound counts two) over what exact
                                   // scans of the same queries score: 1 for the exact scan
};

struct SessionOptions {
  int64_t capacity = 0;         // most tokens the session holds (the KV caches are allocated for it)
  DType kv_dtype = DType::F32;  // storage of the KV cache (f32, bf16, f16; f32 with a memory)
  // Q8: the KV cache in int8 blocks of 32 with a float scale each (rotary/kv_cache.h KvStorage::Q8; 1.125 bytes
  // a feature), kv_dtype f32 (queries and outputs); not with a memory.
  KvStorage kv_storage = KvStorage::Dtype;
  PositionMethod positions;
  int64_t prefill_chunk = 512;  // tokens per chunk of a prompt's work in each layer - projections, attention (the
                                // chunk's queries against every key before them), MLP: bounds the activations'
                                // memory to one chunk's plus the residual stream and one layer's keys and values
  int threads = 0;              // 0: OpenMP's default
  std::optional<MemoryOptions> memory;  // set: a retrieval memory behind the caches (MemoryOptions)
  // false: a one-pass session (scoring a window, as `rotary perplexity` does): one forward() call whose keys and
  // values are dropped once each layer has attended over them, so no KV cache is allocated (at 8k tokens a 13B
  // model's cache alone is 6.7 GB in bf16); a later forward() before clear() is refused. Not with a memory.
  bool keep_caches = true;
};

class Session {
 public:
  Session(std::shared_ptr<const Model> model, const SessionOptions& options);  // rotary::Error naming the field
  ~Session();
  Session(Session&&) noexcept;

  // Runs n tokens at `positions` (increasing, after the cached ones) through every layer and appends them to the
  // caches: a first call of several tokens is one fused causal attention over them (a prompt), later tokens
  // attend to the cache one at a time (with a memory: every call in chunks, MemoryOptions). hidden: [n, d_model],
  // the final norm's output (null: not wanted).
  void forward(const int64_t* tokens, const int64_t* positions, int64_t n, float* hidden);
  // The LM head (Model::logits) at the session's thread count.
  void logits(const float* hidden, int64_t n, float* out) const;
  int64_t size() const;      // tokens cached (with a memory: window and memory)
  int64_t capacity() const;  // SessionOptions::capacity
  const SessionOptions& options() const;
  MemoryStats memory_stats() const;  // zeros without a memory
  const Model& model() const;
  void clear();              // back to an empty sequence (a piece in progress dropped)
  // The (token, layer) rows SessionBatch steps ran of a piece still in progress (BatchStep::layer_rows); 0: none.
  // While one is, forward(), saving and copying are refused.
  int64_t piece_rows_done() const;
  // Frees the scratch of its steps (activations of a prompt piece), keeping the cached rows: a session kept for later
  // (a prefix cache's entry) holds its rows only. The next forward() allocates the scratch again.
  void release_scratch();
  // The position the next token takes when a sequence goes on: 0 when empty, else the last one's + 1.
  int64_t next_position() const;
  // The ids of the tokens the session holds, in order (size() of them): what forward() ran, a copied prefix's, a
  // saved context's. Empty for a context saved before saves kept them (open_context of an older save).
  const std::vector<int64_t>& tokens() const;
  // What shaped the cached rows besides the weights - positions (rotation, method, window, log-n), the cache's dtype
  // and storage, the memory's policy, window and storage: sessions of equal fingerprints cache the same rows for the
  // same tokens (a saved context's settings check; the server's prefix cache).
  uint64_t settings_fingerprint() const;
  // Bytes of cached rows the session holds now (its caches' rows for size() tokens, not their capacity): what
  // keeping it costs.
  int64_t held_bytes() const;

  // This empty session continues `source`'s first n tokens: their cached rows copied, bit for bit, into caches of
  // this session's capacity (which counts them) - a prompt's prefix read once and reused by later requests
  // (`rotary serve`'s prefix cache). rotary::Error naming the field unless both are sessions of the same model with
  // equal settings_fingerprint, n in [1, source.size()] and <= this capacity, and caches that can be cut: no memory,
  // no length-dependent scaling (dynamic NTK, LongRoPE), caches kept.
  void copy_prefix_from(const Session& source, int64_t n);
  // Whether copy_prefix_from takes this session as its source: caches kept, no memory, no length-dependent scaling.
  bool can_copy_prefix() const;

  // The session saved to the directory `dir` (created if missing) and continued in a later run - a book read once,
  // asked about many times; a long prompt read once. The directory is one unit (engine/src/saved_context.h): each
  // layer's files - its KV cache as layer<i>.kv (KvCache::save, in the cache's dtype or q8 storage), or with a memory
  // layer<i>.memory and layer<i>.window (MemoryKvCache::save) and layer<i>.search where the search keeps what it
  // built (MemorySearch::save) - and the manifest context.json, written last, naming every file with its size and
  // content hash, the model by content (weights_hash, the matrices' format, the activations) and the settings that
  // shaped the rows; each layer file carries a fingerprint of the model, the settings, the save and its layer. A save
  // holds context.lock, removes the earlier save's manifest before anything else and all its files after, so a save
  // killed half-way leaves no context, never a mix. Not for length-dependent scalings (dynamic NTK, LongRoPE: their
  // caches are rebuilt from un-rotated rows the files do not hold), a memory of policy unlimiformer, or a session
  // that keeps no caches.
  void save_context(const std::string& dir) const;
  // What save_context(dir) would refuse, refused now, before any work: a session that cannot be saved, a `dir`
  // that is a file or cannot be made, a directory another save or a reader holds. (Creates `dir`.)
  void check_save_context(const std::string& dir) const;
  // Continues the session saved in `dir` in this empty session with the same options (the rows read into RAM); the
  // next token goes at next_position(), and capacity() grows by the context's tokens (the capacity given counts the
  // tokens after them). rotary::Error naming the file or field when it is not one finished save of this model's
  // weights with these settings: no manifest, a file missing, changed or swapped, other weights, another
  // --weights / --activations, other positions or memory settings.
  void open_context(const std::string& dir);
  // The bytes of the files of the context saved in `dir` (its manifest's sum): what open_context reads into RAM.
  static int64_t saved_context_bytes(const std::string& dir);

  // Bytes a session with these options allocates (KV caches unless keep_caches is false, and scratch for a prompt
  // of `prompt_tokens`), so a caller can check a run against the machine's memory before starting it.
  static int64_t bytes_needed(const Model& model, const SessionOptions& options, int64_t prompt_tokens);

 private:
  friend class SessionBatch;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One session's part of a SessionBatch::forward: n tokens at `positions`, as Session::forward takes them.
struct BatchStep {
  Session* session = nullptr;
  const int64_t* tokens = nullptr;
  const int64_t* positions = nullptr;
  int64_t n = 0;
  float* hidden = nullptr;  // [n, d_model]: the final norm's output (null: not wanted)
  // (token, layer) rows of the piece to run this call (0: all that remain), layer by layer and in a layer token by
  // token. Fewer: the piece stops there, its residual rows kept in the session, and a later step with the same
  // tokens and positions goes on from there (`rotary serve` reads a long prompt's piece a part per step beside other
  // streams' decode tokens, so no step takes the whole piece's time). `hidden` is written, and size() grows by n, by
  // the step that ends the last layer; the bits are those of the piece run whole. A session the batch runs by its
  // own forward() runs the whole piece.
  int64_t layer_rows = 0;
};

// Ends the calling thread's OpenMP team: its idle worker threads exit, and the thread's next parallel region starts
// a new one. A process whose model steps all run on one other thread (`rotary serve`'s scheduler) calls it on the
// thread that loaded the model: libgomp spin-waits in its barriers only while its threads do not outnumber the CPUs
// (past that, about 100 spins and then a futex sleep and wake in every parallel region), and a docked team counts.
// rotary::Error if called inside a parallel region.
void end_thread_team();

// Continuous batching (`rotary serve`): several sessions' tokens - one sequence's decode token, another's chunk of
// its prompt - through the model with the linear layers of all of them in one pass over the weights per layer, so N
// sequences' decode steps cost about one read of the weights, not N. Each session's tokens go through its caches and
// attention exactly as its own Session::forward would run them: the same bits, whatever else is in the batch (the
// linear kernels' rows and the norms do not depend on their neighbours), in one call or a part per call
// (BatchStep::layer_rows). A session with a memory, a length-dependent
// scaling (dynamic NTK, LongRoPE) or no caches runs its own forward() after the others. The scratch is kept between
// calls: decode steps allocate nothing.
class SessionBatch {
 public:
  explicit SessionBatch(std::shared_ptr<const Model> model, int threads = 0);  // threads 0: OpenMP's default
  ~SessionBatch();
  // rotary::Error naming steps[i] and the field, before any work, for a step its session refuses (Session::forward's
  // checks), a session of another model or one given twice.
  void forward(const std::vector<BatchStep>& steps);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rotary::engine
