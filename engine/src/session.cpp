// Session: one sequence through the model - embedding rows, then per layer norm, q / k / v projections, attention
// (the core's fused kernel for a prompt, its KV cache one token at a time after that), output projection added to
// the residual, norm, MLP added to the residual; the final norm, and the LM head on request. Buffers are sized once
// (decode allocates nothing per step) and grown only by a longer prompt.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>

#include "model_impl.h"
#include "rotary/content_hash.h"
#include "saved_context.h"
#include "rotary/activations.h"
#include "rotary/error.h"
#include "rotary/files.h"
#include "rotary_engine/model.h"

namespace rotary::engine {

void apply_norm(NormKind kind, const NormWeights& w, double eps, const float* x, int64_t n, int64_t d, float* out,
                int threads) {
  // Token by token, each on its own: the threads change no bit (a prompt's chunk; decode's one token stays serial).
#pragma omp parallel for num_threads(std::max(threads, 1)) schedule(static) if (threads > 1 && n >= 8)
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * d;
    float* o = out + t * d;
    if (kind == NormKind::RmsNorm) {
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
      const float inv = float(1.0 / std::sqrt(ss / double(d) + eps));
      for (int64_t i = 0; i < d; ++i) o[i] = w.weight[i] * (xr[i] * inv);
    } else {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < d; ++i) mean += xr[i];
      mean /= double(d);
      for (int64_t i = 0; i < d; ++i) var += (xr[i] - mean) * (xr[i] - mean);
      const double inv = 1.0 / std::sqrt(var / double(d) + eps);
      for (int64_t i = 0; i < d; ++i) o[i] = float((xr[i] - mean) * inv) * w.weight[i] + w.bias[i];
    }
  }
}

namespace {

constexpr int64_t kPad = KvCacheLayout::kPad;
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// One layer's bytes in a session with a memory holding `rows` tokens in it: the memory's keys, values and
// positions, the window's cache (2W rows per kv head of keys and values, and Leaky's far copies, f32) and the
// window's un-rotated rows. `rotary`: the rotated features of a head.
int64_t memory_layer_bytes(const Architecture& arch, const SessionOptions& options, int64_t rotary, int64_t rows) {
  const int64_t hkv = arch.n_kv_heads * arch.head_dim, ms = int64_t(dtype_size(options.memory->storage));
  const int64_t w2 = 2 * std::max<int64_t>(options.memory->window, 1);
  const int64_t row = 2 * round_up(rotary / 2, kPad) + round_up(arch.head_dim - rotary, kPad);
  const int64_t copies = options.positions.mode == PositionMode::LeakyRerope ? 4 : 2;
  return copies * arch.n_kv_heads * w2 * row * 4 + w2 * (2 * hkv * 4 + 8) + rows * (2 * hkv * ms + 8);
}

bool length_dependent(const RopeSpec& r) {
  return r.scaling == RopeScaling::Dynamic || r.scaling == RopeScaling::LongRope;
}

// Tokens per chunk of a layer's work on a prompt: prefill_chunk, rounded down to whole memory chunks with a memory
// (at least one), so that the memory's chunks start where they would over the whole call.
int64_t layer_chunk(const SessionOptions& options) {
  if (!options.memory) return options.prefill_chunk;
  const int64_t memory_chunk = options.memory->chunk_tokens();
  return memory_chunk * std::max<int64_t>(1, options.prefill_chunk / memory_chunk);
}

float gelu(float x, bool tanh_form) {
  if (tanh_form) return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  return float(0.5 * double(x) * (1.0 + std::erf(double(x) * 0.7071067811865476)));
}

// The method's name in messages, as the command line spells it.
const char* position_mode_name(PositionMode m) {
  return m == PositionMode::Rope ? "rope" : m == PositionMode::Rerope ? "rerope" : m == PositionMode::LeakyRerope ? "leaky_rerope" : "none";
}

// The core's page search (rotary/memory_pages.h) as a MemorySearch; its work: a page bound counts two vectors.
class PageSearch final : public MemorySearch {
 public:
  PageSearch(const KvMemory& memory, const MemoryPagesConfig& config) : pages_(memory, config) {}
  void sync() override { pages_.sync(); }
  double candidates(const MemoryAttentionParams& p, int64_t* out) override {
    PageSearchStats ps;
    pages_.candidates(p, out, &ps);
    return 2.0 * double(ps.bounds) + double(ps.rows_scored);
  }

 private:
  MemoryPages pages_;
};

// The linear half of a layer on rows of a residual stream, around attention - one body for a session's forward
// and for forward_batch's rows of several sessions. Each row is computed on its own (norms token by token, the
// linear kernels' rows independent of how many they run together), so a row's bits do not depend on its neighbours.
struct LayerRows {
  LayerRows(const Model& m, const Architecture& a, int t) : model(m), arch(a), threads(t) {}
  const Model& model;
  const Architecture& arch;
  int threads;
  // The norms' outputs (attn_in, mlp_in), a fused projection's rows (qkv) and the MLP's (ff_up, ff_gate) for `rows`.
  std::vector<float> attn_in, mlp_in, qkv, ff_up, ff_gate;

  void grow(int64_t rows) {
    auto need = [](std::vector<float>& v, int64_t size) {
      if (int64_t(v.size()) < size) v.resize(size_t(size));
    };
    need(attn_in, rows * arch.d_model), need(mlp_in, rows * arch.d_model);
    if (arch.fused_qkv) need(qkv, rows * 3 * arch.n_heads * arch.head_dim);
    need(ff_up, rows * arch.d_ff);
    if (arch.mlp == MlpKind::SwiGlu) need(ff_gate, rows * arch.d_ff);
  }
  LinearParams product(const Linear& l, const float* in, int64_t n, int64_t in_stride, float* out, int64_t out_stride,
                       bool accumulate) const {
    LinearParams p;
    p.w = l.w, p.bias = l.bias, p.tokens = n, p.x = in, p.x_stride = in_stride, p.y = out, p.y_stride = out_stride;
    p.accumulate = accumulate, p.activations = model.activations(), p.threads = threads;
    return p;
  }
  void project(const Linear& l, const float* in, int64_t n, int64_t in_stride, float* out, int64_t out_stride,
               bool accumulate) const {
    linear_forward(product(l, in, n, in_stride, out, out_stride, accumulate));
  }

  // Before attention, c rows xs: the norm, then q [c, hq] and k, v [c, hkv] rows.
  void before_attention(const Layer& l, const float* xs, int64_t c, float* qo, float* ko, float* vo) {
    const int64_t d = arch.d_model, hd = arch.head_dim, hq = arch.n_heads * hd, hkv = arch.n_kv_heads * hd;
    apply_norm(arch.norm, l.attn_norm, arch.norm_eps, xs, c, d, attn_in.data(), threads);
    if (arch.fused_qkv) {  // per head [q | k | v] rows: one product, then the heads' thirds
      project(l.qkv, attn_in.data(), c, d, qkv.data(), 3 * hq, false);
      for (int64_t t = 0; t < c; ++t)
        for (int64_t hh = 0; hh < arch.n_heads; ++hh) {
          const float* src = qkv.data() + t * 3 * hq + hh * 3 * hd;
          std::memcpy(qo + t * hq + hh * hd, src, size_t(hd) * 4);
          std::memcpy(ko + t * hkv + hh * hd, src + hd, size_t(hd) * 4);
          std::memcpy(vo + t * hkv + hh * hd, src + 2 * hd, size_t(hd) * 4);
        }
    } else {
      // One team of threads for the three (the small k and v share q's work: decode wakes the threads once).
      const LinearParams qkv_products[] = {product(l.q, attn_in.data(), c, d, qo, hq, false),
                                           product(l.k, attn_in.data(), c, d, ko, hkv, false),
                                           product(l.v, attn_in.data(), c, d, vo, hkv, false)};
      linear_forward_group(qkv_products, 3);
    }
  }

  // After attention: the output projection of att [c, hq] added to the c rows xs, the MLP's norm, the MLP added.
  void after_attention(const Layer& l, const float* att, float* xs, int64_t c) {
    const int64_t d = arch.d_model, hq = arch.n_heads * arch.head_dim, ff = arch.d_ff;
    if (arch.parallel_residual) apply_norm(arch.norm, l.mlp_norm, arch.norm_eps, xs, c, d, mlp_in.data(), threads);
    project(l.o, att, c, hq, xs, d, true);
    if (!arch.parallel_residual) apply_norm(arch.norm, l.mlp_norm, arch.norm_eps, xs, c, d, mlp_in.data(), threads);
    const LinearParams up_gate[] = {product(l.up, mlp_in.data(), c, d, ff_up.data(), ff, false),
                                    product(l.gate, mlp_in.data(), c, d, ff_gate.data(), ff, false)};
    linear_forward_group(up_gate, arch.mlp == MlpKind::SwiGlu ? 2 : 1);
    if (arch.mlp == MlpKind::SwiGlu) {
      swiglu_forward(ff_gate.data(), ff_up.data(), c * ff, threads);
    } else {  // each element on its own: the threads change no bit
      const bool tanh_form = arch.mlp == MlpKind::GeluTanh;
      const int64_t count = c * ff;
      float* up = ff_up.data();
#pragma omp parallel for num_threads(threads) schedule(static) if (count >= 16384)
      for (int64_t i = 0; i < count; ++i) up[i] = gelu(up[i], tanh_form);
    }
    project(l.down, ff_up.data(), c, ff, xs, d, true);
  }
};

}  // namespace

struct Session::Impl {
  std::shared_ptr<const Model> model;
  const Model::Impl& weights;  // the model's tensors (engine/src/model_impl.h)
  const Architecture& arch;
  SessionOptions options;
  int threads;
  RopeFreqs freqs;
  int64_t freqs_len = -1;  // the length the frequencies were taken at (length-dependent scalings)
  std::vector<KvCache> caches;
  std::vector<MemoryKvCache> memory_caches;  // SessionOptions::memory set: these instead of `caches`
  std::vector<std::unique_ptr<MemorySearch>> searches;  // MemoryOptions::search or search_factory set: one per
                                                        // layer, over its memory
  MemoryStats memory_stats;
  double scored_vectors = 0, scan_vectors = 0;  // MemoryStats::scored_share's terms
  std::vector<int64_t> candidates;  // [tokens, Hq, top_k] rows the page search proposes
  // A memory chunk's keys and values: the window's rows, then the chunk's ([rows, heads, head_dim] f32); lse and
  // the memory's share of the attention for the chunk's queries.
  std::vector<float> chunk_k, chunk_v, chunk_lse, chunk_mass;
  std::vector<int64_t> chunk_pos;
  int64_t last_position = 0;
  std::vector<int64_t> token_ids;  // Session::tokens
  // A SessionBatch piece in progress (BatchStep::layer_rows): the (token, layer) rows run so far (0: none) - whole
  // layers, then the first tokens of the next -, its tokens, positions and whether it is a prompt (decided at its
  // start), and its residual rows, each after the layers it has been through. The caches of the layers begun hold its
  // rows there already (size() does not count them).
  int64_t piece_done = 0;
  std::vector<int64_t> piece_tokens, piece_positions;
  bool piece_prompt = false;
  std::vector<float> piece_residual;
  int64_t passed = 0;  // keep_caches false: the tokens of the one forward() call so far (0 or its n)
  // Length-dependent scalings rebuild the caches from the un-rotated keys and values when the frequencies change.
  std::vector<std::vector<float>> hist_k, hist_v;
  std::vector<int64_t> hist_pos;
  // Scratch, [tokens, width] float32 unless said otherwise.
  // residual: every token's residual stream; attn_out: attention's output (heads concatenated) before the output
  // projection; rows: the linear half's own (one chunk's).
  std::vector<float> residual, q, k, v, attn_out;
  LayerRows rows;
  std::vector<uint8_t> q_conv, k_conv, v_conv, out_conv;  // q, k, v, attn_out converted to a bf16 / f16 cache's
                                                          // dtype (unused for f32)

  Impl(std::shared_ptr<const Model> mod, const SessionOptions& opt)
      : model(std::move(mod)), weights(model->impl()), arch(weights.arch), options(opt),
        threads(opt.threads > 0 ? opt.threads : omp_get_max_threads()), rows(*model, arch, threads) {
    check(options.capacity >= 1, "capacity", options.capacity, ">= 1 token");
    check(arch.sliding_window == 0 || options.capacity <= arch.sliding_window, "capacity", options.capacity,
          "<= the checkpoint's sliding_window = " + std::to_string(arch.sliding_window) +
              " (rotary has no sliding-window attention; longer sequences would differ from the checkpoint's code)");
    check(options.kv_dtype == DType::F32 || options.kv_dtype == DType::BF16 || options.kv_dtype == DType::F16, "kv_dtype",
          dtype_name(options.kv_dtype), "f32, bf16, f16");
    check(options.kv_storage == KvStorage::Dtype || options.kv_storage == KvStorage::Q8, "kv_storage", int(options.kv_storage),
          "dtype, q8");
    if (options.kv_storage == KvStorage::Q8) {
      check(options.kv_dtype == DType::F32, "kv_dtype", dtype_name(options.kv_dtype),
            "f32 with kv_storage q8 (the queries and outputs; the cache quantizes what it stores)");
      check(!options.memory, "kv_storage", "q8", "dtype with a memory (memory.storage sets the memory's dtype)");
    }
    check(options.prefill_chunk >= 1, "prefill_chunk", options.prefill_chunk, ">= 1");
    check(options.keep_caches || !options.memory, "keep_caches", "false",
          "true with a memory (the memory and its window are the caches it keeps)");
    check(options.threads >= 0, "threads", options.threads, ">= 0 (0: OpenMP's default)");
    const PositionMethod& p = options.positions;
    check(p.mode != PositionMode::None, "positions.mode", "none", "rope, rerope, leaky_rerope");
    check(p.rope.head_dim == arch.head_dim, "positions.rope.head_dim", p.rope.head_dim,
          "the model's head_dim = " + std::to_string(arch.head_dim));
    take_freqs(options.capacity);  // validates the rope; the length-dependent ones are taken again per forward
    // The caches' settings (a ReRoPE window, ...) checked now, not at the first forward: the core's count of their
    // bytes checks the configuration they will be made with.
    if (!options.memory && options.keep_caches) kv_cache_bytes(cache_config());
    if (options.memory) {
      const MemoryOptions& mo = *options.memory;
      check(options.kv_dtype == DType::F32, "kv_dtype", dtype_name(options.kv_dtype),
            "f32 with a memory (its window is kept in f32; memory.storage sets the memory's dtype)");
      check(!length_dependent(p.rope), "positions.rope.scaling", scaling_name(p.rope.scaling),
            "a scaling whose frequencies do not change with the length (a memory keeps keys rotated once)");
      check(mo.top_k >= 0, "memory.top_k", mo.top_k, ">= 0 (0: the window alone)");
      check(mo.chunk >= 0, "memory.chunk", mo.chunk, ">= 0 (0: the window)");
      if (mo.search) mo.search->validate();
      check(!mo.search || !mo.search_factory, "memory.search_factory", "set",
            "unset when memory.search (the core's page search) is set: one search per memory");
      MemoryKvCache checked(memory_config());  // checks the rest (window, policy against the positions, storage)
    }
  }

  MemoryKvCacheConfig memory_config() const {
    MemoryKvCacheConfig c;
    c.window = options.memory->window, c.kv_heads = arch.n_kv_heads, c.head_dim = int(arch.head_dim);
    c.pos = position_params(), c.policy = options.memory->policy, c.memory_storage = options.memory->storage;
    return c;
  }

  PositionParams position_params() const {
    PositionParams pp;
    pp.mode = options.positions.mode, pp.freqs = &freqs, pp.window = options.positions.window, pp.leaky_k = options.positions.leaky_k;
    pp.logn_train_len = options.positions.logn_train_len;
    return pp;
  }
  void take_freqs(int64_t len) {
    freqs = options.positions.rope.freqs(len);
    freqs_len = len;
  }
  uint64_t settings_fingerprint() const;  // a saved context's: what shaped the cached rows besides the weights
  std::string settings_text() const;      // the same in words
  uint64_t context_fingerprint() const;   // the weights (as run) and the settings
  void check_context_session(const char* who) const;

  // Empty caches for every layer (with a memory: `opened`, a saved context's, when given) and their searches.
  void new_caches(std::vector<MemoryKvCache> opened = {}) {
    caches.clear();
    memory_caches.clear();
    searches.clear();
    if (options.memory) {
      memory_caches = std::move(opened);
      if (memory_caches.empty())
        for (int64_t i = 0; i < arch.n_layers; ++i) memory_caches.emplace_back(memory_config());
      // (each cache holds its KvMemory on the heap: the address a search keeps does not move with the vector)
      for (const MemoryKvCache& c : memory_caches) {
        if (options.memory->search) searches.push_back(std::make_unique<PageSearch>(c.memory(), *options.memory->search));
        if (options.memory->search_factory) {
          searches.push_back(options.memory->search_factory(c.memory()));
          check(searches.back() != nullptr, "memory.search_factory", "a null search", "a MemorySearch");
        }
      }
      return;
    }
    if (!options.keep_caches) return;
    const KvCacheConfig c = cache_config();
    for (int64_t i = 0; i < arch.n_layers; ++i) caches.emplace_back(c);
  }
  KvCacheConfig cache_config() const {
    KvCacheConfig c;
    c.capacity = options.capacity, c.kv_heads = arch.n_kv_heads, c.head_dim = int(arch.head_dim), c.dtype = options.kv_dtype;
    c.pos = position_params(), c.threads = threads, c.storage = options.kv_storage;
    return c;
  }

  int64_t size() const {
    if (options.memory) return memory_caches.empty() ? 0 : memory_caches.front().size();
    if (!options.keep_caches) return passed;
    if (caches.empty()) return 0;
    // (the last layer's, less a piece in progress's tokens it holds already)
    const int64_t n = int64_t(piece_tokens.size());
    return caches.back().size() - std::max<int64_t>(0, piece_done - (arch.n_layers - 1) * n);
  }
  bool started() const { return options.memory ? !memory_caches.empty() : options.keep_caches ? !caches.empty() : passed > 0; }

  // Every token's residual stream and one layer's keys and values (k, v: a chunk's queries attend to all the
  // keys before them); the rest holds one chunk of at most prefill_chunk tokens.
  void grow(int64_t n) {
    const int64_t d = arch.d_model, hq = arch.n_heads * arch.head_dim, hkv = arch.n_kv_heads * arch.head_dim;
    const int64_t chunk = std::min(n, layer_chunk(options)), es = int64_t(dtype_size(options.kv_dtype));
    auto need = [](auto& v, int64_t size) {
      if (int64_t(v.size()) < size) v.resize(size_t(size));
    };
    need(residual, n * d), need(k, n * hkv), need(v, n * hkv);
    need(q, chunk * hq), need(attn_out, chunk * hq);
    rows.grow(chunk);
    if (options.kv_dtype != DType::F32)
      need(q_conv, chunk * hq * es), need(k_conv, n * hkv * es), need(v_conv, n * hkv * es), need(out_conv, chunk * hq * es);
  }

  // Floats [from, to) of `f` as the attention kernels take them, in the cache's dtype; returns the base of the array
  // holding them (element i at i): `f` itself for an f32 cache (no copy on the decode path), else `conv` with those
  // elements rounded into it (grown only when a longer prompt needs it).
  char* in_kv_dtype(std::vector<float>& f, std::vector<uint8_t>& conv, int64_t from, int64_t to) {
    if (options.kv_dtype == DType::F32) return reinterpret_cast<char*>(f.data());
    const size_t bytes = size_t(to) * dtype_size(options.kv_dtype);
    if (conv.size() < bytes) conv.resize(bytes);
    for (int64_t i = from; i < to; ++i) store_from_double(conv.data(), options.kv_dtype, i, f[size_t(i)]);
    return reinterpret_cast<char*>(conv.data());
  }

  void check_tokens(const int64_t* tokens, const int64_t* positions, int64_t n) const {
    check(n >= 1, "n", n, ">= 1 token");
    check_no_piece("forward");
    check(options.keep_caches || passed == 0, "keep_caches", "false",
          "one forward() call per clear() (this session kept no keys for the " + std::to_string(passed) +
              " tokens it ran)");
    check(size() + n <= options.capacity, "tokens", size() + n,
          "<= the session's capacity = " + std::to_string(options.capacity) + " (cached " + std::to_string(size()) + " + " +
              std::to_string(n) + " new)");
    for (int64_t t = 0; t < n; ++t) {
      if (tokens[t] < 0 || tokens[t] >= arch.vocab_size)
        fail("tokens[" + std::to_string(t) + "]", std::to_string(tokens[t]),
             "an id in [0, vocab_size = " + std::to_string(arch.vocab_size) + ")");
      const bool first = t == 0 && size() == 0;
      const int64_t prev = t > 0 ? positions[t - 1] : last_position;
      if (positions[t] < 0 || positions[t] > kMaxAbsPosition || (!first && positions[t] <= prev))
        fail("positions[" + std::to_string(t) + "]", std::to_string(positions[t]),
             first ? "in [0, 2^53]" : "> " + std::to_string(prev) + " (positions increase) and <= 2^53");
    }
  }

  void check_no_piece(const char* who) const {
    check(piece_done == 0, who,
          "a session in the middle of a piece (" + std::to_string(piece_done) + " of its " +
              std::to_string(int64_t(piece_tokens.size()) * arch.n_layers) + " token-layers run by SessionBatch)",
          "a session between pieces (the piece's later layers through SessionBatch first, or clear())");
  }

  void rebuild_caches() {
    new_caches();
    if (hist_pos.empty()) return;
    const int64_t n = int64_t(hist_pos.size()), hkv = arch.n_kv_heads * arch.head_dim;
    for (int64_t i = 0; i < arch.n_layers; ++i)
      caches[size_t(i)].append(n, view(in_kv_dtype(hist_k[size_t(i)], k_conv, 0, n * hkv), arch.n_kv_heads),
                               view(in_kv_dtype(hist_v[size_t(i)], v_conv, 0, n * hkv), arch.n_kv_heads), hist_pos.data());
  }
  // [tokens, heads, head_dim] packed.
  HeadsView view(void* data, int64_t heads) const { return {data, heads, heads * arch.head_dim, arch.head_dim}; }

  // Attention of one layer's chunk of c tokens t0.. of this call (q, attn_out: the chunk's [c, heads, head_dim]; k, v:
  // the call's tokens up to the chunk's end, f32 in the scratch) through its KV cache: a prompt (the first call,
  // n > 1) through the fused kernel - the chunk's queries against every key before them (first_query) - later
  // tokens one decode step each.
  void attend_with_cache(int64_t layer, int64_t t0, int64_t c, const int64_t* positions, bool prompt) {
    const int64_t hd = arch.head_dim, hq = arch.n_heads * hd, hkv = arch.n_kv_heads * hd;
    const int64_t es = int64_t(dtype_size(options.kv_dtype));
    char* qs = in_kv_dtype(q, q_conv, 0, c * hq);
    char* ks = in_kv_dtype(k, k_conv, t0 * hkv, (t0 + c) * hkv);
    char* vs = in_kv_dtype(v, v_conv, t0 * hkv, (t0 + c) * hkv);
    char* os = options.kv_dtype == DType::F32 ? reinterpret_cast<char*>(attn_out.data()) : reinterpret_cast<char*>(out_conv.data());
    if (prompt) {
      AttentionParams p;
      p.tokens = t0 + c, p.first_query = t0, p.head_dim = int(hd), p.dtype = options.kv_dtype;
      p.q = view(qs, arch.n_heads), p.k = view(ks, arch.n_kv_heads), p.v = view(vs, arch.n_kv_heads);
      p.o = view(os, arch.n_heads), p.positions = positions, p.causal = true, p.pos = position_params();
      p.threads = threads;
      attention_forward(p);
      if (options.keep_caches)
        caches[size_t(layer)].append(c, view(ks + t0 * hkv * es, arch.n_kv_heads), view(vs + t0 * hkv * es, arch.n_kv_heads),
                                     positions + t0);
    } else {
      KvCache& cache = caches[size_t(layer)];
      for (int64_t t = 0; t < c; ++t) {
        const int64_t kt = (t0 + t) * hkv * es;
        cache.append(1, view(ks + kt, arch.n_kv_heads), view(vs + kt, arch.n_kv_heads), positions + t0 + t);
        DecodeParams p;
        p.q = view(qs + t * hq * es, arch.n_heads), p.o = view(os + t * hq * es, arch.n_heads);
        p.threads = threads;
        attention_decode(cache, p);
      }
    }
    if (options.kv_dtype != DType::F32)
      for (int64_t i = 0; i < c * hq; ++i) attn_out[size_t(i)] = float(load_as_double(out_conv.data(), options.kv_dtype, i));
  }

  // Attention of one layer's chunk of n tokens t0.. of this call (q, attn_out: the chunk's [n, heads, head_dim]; k, v:
  // the call's, f32 in the scratch) through its memory cache: memory chunk by memory chunk, each attending to the
  // window and itself (one fused causal call, the window's rows as keys only: first_query), then to the memory's
  // top-k, merged; then joining the window. A chunk of one token is a decode step (MemoryKvCache::decode).
  void attend_with_memory(int64_t layer, int64_t t0, int64_t n, const int64_t* positions) {
    MemoryKvCache& cache = memory_caches[size_t(layer)];
    MemorySearch* searcher = searches.empty() ? nullptr : searches[size_t(layer)].get();
    const MemoryOptions& mo = *options.memory;
    const int64_t hd = arch.head_dim, Hq = arch.n_heads, Hkv = arch.n_kv_heads, hq = Hq * hd, hkv = Hkv * hd;
    const int64_t chunk = mo.chunk_tokens();
    float* const q_all = q.data();
    float* const k_all = k.data() + t0 * hkv;
    float* const v_all = v.data() + t0 * hkv;
    float* const o_all = attn_out.data();
    positions += t0;
    auto count = [&](int64_t queries, const float* mass) {
      if (cache.memory().size() == 0 || mo.top_k == 0) return;
      for (int64_t t = 0; t < queries; ++t) {
        double sum = 0;
        for (int64_t h = 0; h < Hq; ++h) sum += mass[t * Hq + h];
        memory_stats.memory_mass += sum / double(Hq);  // summed here, divided in Session::memory_stats
        ++memory_stats.retrieving_queries;
      }
    };
    auto need = [](auto& vec, int64_t size) {
      if (int64_t(vec.size()) < size) vec.resize(size_t(size));
    };
    need(chunk_mass, std::min(chunk, n) * Hq);
    // The search's candidates for mp's queries (null: the exact scan), and the work either did.
    auto search = [&](MemoryAttentionParams& mp) -> const int64_t* {
      const double scan = double(mp.tokens * Hq) * double(cache.memory().size());
      scan_vectors += scan;
      if (!searcher) {
        scored_vectors += scan;
        return nullptr;
      }
      searcher->sync();
      need(candidates, mp.tokens * Hq * mp.top_k);
      scored_vectors += searcher->candidates(mp, candidates.data());
      return candidates.data();
    };
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      const int64_t c = std::min(chunk, n - c0);
      float* qs = q_all + c0 * hq;
      float* ks = k_all + c0 * hkv;
      float* vs = v_all + c0 * hkv;
      float* os = o_all + c0 * hq;
      if (c == 1) {
        cache.append(1, view(ks, Hkv), view(vs, Hkv), positions + c0);
        MemoryDecodeParams p;
        p.q = view(qs, Hq), p.q_position = positions[c0], p.o = view(os, Hq), p.top_k = mo.top_k;
        p.memory_mass = chunk_mass.data(), p.threads = threads;
        if (const int64_t k_eff = std::min<int64_t>(mo.top_k, cache.memory().size()); k_eff > 0) {
          MemoryAttentionParams mp;  // the step's query as a one-token search (o, lse: checked, not written)
          need(chunk_lse, Hq);
          mp.tokens = 1, mp.q = p.q, mp.q_positions = positions + c0, mp.top_k = int(k_eff);
          mp.o = p.o, mp.lse = chunk_lse.data();
          mp.query_origin = cache.query_origin(positions[c0]), mp.threads = threads;
          p.candidates = search(mp);
        }
        cache.decode(p);
        count(1, chunk_mass.data());
        continue;
      }
      const int64_t w = cache.window_size(), rows = w + c;
      need(chunk_k, rows * hkv), need(chunk_v, rows * hkv), need(chunk_lse, c * Hq), need(chunk_pos, rows);
      std::copy_n(cache.window_keys(), w * hkv, chunk_k.data());
      std::copy_n(cache.window_values(), w * hkv, chunk_v.data());
      std::copy_n(cache.window_positions(), w, chunk_pos.data());
      std::copy_n(ks, c * hkv, chunk_k.data() + w * hkv);
      std::copy_n(vs, c * hkv, chunk_v.data() + w * hkv);
      std::copy_n(positions + c0, c, chunk_pos.data() + w);
      AttentionParams p;
      p.tokens = rows, p.first_query = w, p.head_dim = int(hd), p.dtype = DType::F32;
      p.q = view(qs, Hq), p.k = view(chunk_k.data(), Hkv), p.v = view(chunk_v.data(), Hkv);
      p.o = view(os, Hq), p.lse = chunk_lse.data(), p.positions = chunk_pos.data(), p.causal = true;
      p.pos = position_params(), p.threads = threads;
      attention_forward(p);
      const int64_t k_eff = std::min<int64_t>(mo.top_k, cache.memory().size());
      if (k_eff > 0) {
        MemoryAttentionParams mp;
        mp.tokens = c, mp.q = view(qs, Hq), mp.q_positions = positions + c0, mp.top_k = int(k_eff);
        mp.query_origin = cache.query_origin(positions[c0]);
        mp.o = view(os, Hq), mp.lse = chunk_lse.data(), mp.memory_mass = chunk_mass.data();
        mp.threads = threads;
        mp.candidates = search(mp);
        memory_attention(cache.memory(), mp);
        count(c, chunk_mass.data());
      }
      cache.append(c, view(ks, Hkv), view(vs, Hkv), positions + c0);
    }
    memory_stats.memory_tokens = cache.memory().size();
  }

  void forward(const int64_t* tokens, const int64_t* positions, int64_t n, float* hidden) {
    check_tokens(tokens, positions, n);
    const bool dynamic = length_dependent(options.positions.rope);
    if (!started()) {
      if (dynamic) take_freqs(positions[n - 1] + 1);
      new_caches();
    } else if (dynamic && positions[n - 1] + 1 != freqs_len) {
      const std::vector<double> before = freqs.inv_freq;
      const double factor_before = freqs.attention_factor;
      take_freqs(positions[n - 1] + 1);
      if (freqs.inv_freq != before || freqs.attention_factor != factor_before) rebuild_caches();
    }
    grow(n);
    const int64_t d = arch.d_model, hkv = arch.n_kv_heads * arch.head_dim;
    // (a one-pass session runs even one token as a prompt: it has no cache to decode from)
    const bool prompt = size() == 0 && (n > 1 || !options.keep_caches);
    const bool history = dynamic && options.keep_caches;  // un-rotated rows to rebuild the caches from
    const int64_t chunk = layer_chunk(options);
    for (int64_t t = 0; t < n; ++t) weight_row(weights.embed, tokens[t], residual.data() + t * d);

    // Layer by layer; inside a layer, chunk by chunk of prefill_chunk tokens (its keys and values kept for the
    // chunks after it), so that activations other than the residual stream and the keys take one chunk's memory.
    for (int64_t li = 0; li < arch.n_layers; ++li) {
      const Layer& l = weights.layers[size_t(li)];
      if (history && hist_k.size() < size_t(arch.n_layers))
        hist_k.resize(size_t(arch.n_layers)), hist_v.resize(size_t(arch.n_layers));
      for (int64_t t0 = 0; t0 < n; t0 += chunk) {
        const int64_t c = std::min(chunk, n - t0);
        float* xs = residual.data() + t0 * d;
        float* ks = k.data() + t0 * hkv;
        float* vs = v.data() + t0 * hkv;
        rows.before_attention(l, xs, c, q.data(), ks, vs);
        if (history) {
          hist_k[size_t(li)].insert(hist_k[size_t(li)].end(), ks, ks + c * hkv);
          hist_v[size_t(li)].insert(hist_v[size_t(li)].end(), vs, vs + c * hkv);
        }
        if (options.memory) {
          attend_with_memory(li, t0, c, positions);
        } else {
          attend_with_cache(li, t0, c, positions, prompt);
        }
        rows.after_attention(l, attn_out.data(), xs, c);
      }
    }
    if (history) hist_pos.insert(hist_pos.end(), positions, positions + n);
    if (!options.keep_caches) passed = n;
    last_position = positions[n - 1];
    token_ids.insert(token_ids.end(), tokens, tokens + n);
    if (hidden) apply_norm(arch.norm, weights.final_norm, arch.norm_eps, residual.data(), n, d, hidden, threads);
  }
};

namespace {

std::string layer_name(int64_t layer, const char* what) { return "layer" + std::to_string(layer) + "." + what; }
std::string layer_file(const std::string& dir, int64_t layer, const char* what) {
  return detail::context_path(dir, layer_name(layer, what));
}

}  // namespace

// What made a saved context's rows besides the weights (Model::weights_hash): the options that shape what the
// caches hold - the positions' rotation and method, the cache's dtype and storage, the memory's policy, window and
// storage. Search, top-k and threads are not in it: they change what is read, not what is stored.
uint64_t Session::Impl::settings_fingerprint() const {
  const PositionMethod& p = options.positions;
  uint64_t h = content_hash_mix(0, uint64_t(p.mode));
  h = content_hash_mix(h, uint64_t(p.window)), h = content_hash64(&p.leaky_k, sizeof p.leaky_k, h);
  h = content_hash_mix(h, uint64_t(p.logn_train_len));
  h = content_hash64(freqs.inv_freq.data(), freqs.inv_freq.size() * sizeof(double), h);
  h = content_hash64(&freqs.attention_factor, sizeof freqs.attention_factor, h);
  h = content_hash_mix(h, uint64_t(freqs.rotary_dim)), h = content_hash_mix(h, uint64_t(freqs.layout));
  h = content_hash_mix(h, uint64_t(options.kv_dtype)), h = content_hash_mix(h, uint64_t(options.kv_storage));
  if (options.memory) {
    const MemoryOptions& mo = *options.memory;
    h = content_hash_mix(h, uint64_t(mo.policy)), h = content_hash_mix(h, uint64_t(mo.window));
    h = content_hash_mix(h, uint64_t(mo.storage));
  }
  return h;
}

// The same settings in words, for a refusal's message.
std::string Session::Impl::settings_text() const {
  const PositionMethod& p = options.positions;
  std::string t = std::string(position_mode_name(p.mode)) + ", rope base " + to_text(p.rope.base) + ", scaling " +
                  std::string(scaling_name(p.rope.scaling));
  if (p.rope.scaling != RopeScaling::None)
    t += " (factor " + to_text(p.rope.factor) + ", original context " +
         std::to_string(p.rope.original_max_position_embeddings) + ")";
  t += ", rotary_dim " + std::to_string(freqs.rotary_dim);
  if (p.mode != PositionMode::Rope) t += ", window " + std::to_string(p.window);
  if (p.mode == PositionMode::LeakyRerope) t += ", leaky_k " + to_text(p.leaky_k);
  if (p.logn_train_len > 1) t += ", log-n at " + std::to_string(p.logn_train_len);
  if (options.memory)
    t += std::string("; memory ") + memory_policy_name(options.memory->policy) + ", window " +
         std::to_string(options.memory->window) + ", " + dtype_name(options.memory->storage);
  else
    t += std::string("; kv cache ") + (options.kv_storage == KvStorage::Q8 ? "q8" : dtype_name(options.kv_dtype));
  return t;
}

// The model and the settings: what each layer file's fingerprint starts from.
uint64_t Session::Impl::context_fingerprint() const {
  uint64_t h = content_hash_mix(model->weights_hash(), uint64_t(model->matrix_format()));
  h = content_hash_mix(h, uint64_t(model->activations()));
  return content_hash_mix(h, settings_fingerprint());
}

// What save_context / open_context refuse before touching files.
void Session::Impl::check_context_session(const char* who) const {
  check_no_piece(who);
  check(options.memory || options.keep_caches, who, "a session without caches (keep_caches = false)",
        "a session that keeps its KV caches or has a memory");
  check(options.memory || !length_dependent(options.positions.rope), who,
        "a session with rope scaling " + std::string(scaling_name(options.positions.rope.scaling)),
        "a scaling whose frequencies do not change with the length (the caches of dynamic NTK and LongRoPE are "
        "rebuilt from un-rotated rows a saved context does not hold)");
  check(!options.memory || options.memory->policy != MemoryPolicy::Unlimiformer, who, "a memory of policy unlimiformer",
        "a memory of policy exact, rerope or none (unlimiformer's query origin is not kept in the files)");
}

void Session::check_save_context(const std::string& dir) const {
  const Impl& impl = *impl_;
  impl.check_context_session("save_context");
  check(!dir.empty(), "save_context dir", "\"\"", "a directory's path");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  check(!ec && std::filesystem::is_directory(dir), "save_context dir", dir,
        "a directory that exists or can be made" + (ec ? " (" + ec.message() + ")" : std::string(" (not a file)")));
  const detail::ContextLock lock(dir, detail::ContextLock::Mode::Save);  // no other save or reader holds it now
}

void Session::save_context(const std::string& dir) const {
  const Impl& impl = *impl_;
  check(impl.started(), "save_context", "an empty session", "a session that has run tokens");
  check_save_context(dir);
  const detail::ContextLock lock(dir, detail::ContextLock::Mode::Save);
  detail::clear_context(dir);  // the manifest first: from here until the new one is written, no context is there
  detail::ContextManifest saved;
  saved.save_id = detail::new_save_id();
  saved.kind = impl.options.memory ? "memory" : "kv";
  saved.weights_hash = impl.model->weights_hash();
  saved.weights = weight_format_name(impl.model->matrix_format());
  saved.activations = activation_format_name(impl.model->activations());
  saved.settings = impl.settings_fingerprint();
  saved.settings_text = impl.settings_text();
  saved.layers = impl.arch.n_layers;
  saved.tokens = impl.size();
  const uint64_t context = impl.context_fingerprint();
  std::vector<std::string> names;
  for (int64_t i = 0; i < impl.arch.n_layers; ++i) {
    const uint64_t fingerprint = detail::layer_fingerprint(context, saved.save_id, i);
    if (impl.options.memory) {
      impl.memory_caches[size_t(i)].save(layer_file(dir, i, "memory"), layer_file(dir, i, "window"), fingerprint);
      names.push_back(layer_name(i, "memory")), names.push_back(layer_name(i, "window"));
    } else {
      impl.caches[size_t(i)].save(layer_file(dir, i, "kv"), fingerprint);
      names.push_back(layer_name(i, "kv"));
    }
  }
  // The tokens' ids (Session::tokens), where the session knows them: the save's fingerprint for them (as a layer
  // file's, at layer -1), then the ids, int64 little-endian.
  if (int64_t(impl.token_ids.size()) == impl.size()) {
    std::string bytes(8 + impl.token_ids.size() * 8, '\0');
    const uint64_t fingerprint = detail::layer_fingerprint(context, saved.save_id, -1);
    std::memcpy(bytes.data(), &fingerprint, 8);
    if (!impl.token_ids.empty()) std::memcpy(bytes.data() + 8, impl.token_ids.data(), impl.token_ids.size() * 8);
    write_file_atomic(detail::context_path(dir, detail::kContextTokens), "save_context", bytes);
    names.push_back(detail::kContextTokens);
  }
  // What the searches built (MemorySearch::save), where a search keeps something.
  for (int64_t i = 0; i < int64_t(impl.searches.size()); ++i) {
    impl.searches[size_t(i)]->save(layer_file(dir, i, "search"));
    std::error_code ec;
    if (std::filesystem::exists(layer_file(dir, i, "search"), ec)) names.push_back(layer_name(i, "search"));
  }
  for (const std::string& name : names) saved.files.push_back(detail::describe_context_file(dir, name));
  detail::write_manifest(dir, saved);  // last: the context exists from here on
}

void Session::open_context(const std::string& dir) {
  Impl& impl = *impl_;
  impl.check_context_session("open_context");
  check(!impl.started(), "open_context", "a session holding " + std::to_string(impl.size()) + " tokens",
        "an empty session");
  const detail::ContextLock lock(dir, detail::ContextLock::Mode::Open);
  const detail::ContextManifest saved = detail::read_manifest(dir);
  const std::string manifest_path = detail::context_path(dir, detail::kContextManifest);
  const std::string kind = impl.options.memory ? "memory" : "kv";
  check(saved.kind == kind, "open_context " + manifest_path,
        saved.kind == "memory" ? "a context saved with a memory" : "a context saved without a memory",
        "a run " + std::string(impl.options.memory ? "with" : "without") + " --memory, as the context was saved");
  check(saved.weights_hash == impl.model->weights_hash(), "open_context " + manifest_path,
        "a context saved from other weights (weights_hash differs)",
        "the model whose weights it was saved from (the same tensors, byte for byte)");
  const std::string weights = weight_format_name(impl.model->matrix_format());
  const std::string activations = activation_format_name(impl.model->activations());
  check(saved.weights == weights && saved.activations == activations, "open_context " + manifest_path,
        "saved with weights " + saved.weights + ", activations " + saved.activations,
        "the same --weights and --activations in this run (it runs weights " + weights + ", activations " +
            activations + ")");
  check(saved.settings == impl.settings_fingerprint(), "open_context " + manifest_path, "saved with " + saved.settings_text,
        "the same positions, cache and memory settings (this run: " + impl.settings_text() + ")");
  check(saved.layers == impl.arch.n_layers, "open_context " + manifest_path, std::to_string(saved.layers) + " layers",
        std::to_string(impl.arch.n_layers) + " (the model's)");
  detail::check_context_files(dir, saved);
  auto listed = [&](const std::string& name) {
    for (const detail::ContextFile& f : saved.files)
      if (f.name == name) return true;
    return false;
  };
  const uint64_t context = impl.context_fingerprint();
  // The tokens' ids, where the save kept them (a save before saves did has none: tokens() stays empty).
  std::vector<int64_t> token_ids;
  if (listed(detail::kContextTokens)) {
    const std::string path = detail::context_path(dir, detail::kContextTokens);
    const std::string ids = read_regular_file(path, "open_context " + path, "the save's token ids (a regular file)");
    check(int64_t(ids.size()) == 8 + saved.tokens * 8, "open_context " + path, std::to_string(ids.size()) + " bytes",
          "8 + " + std::to_string(saved.tokens) + " token ids of 8 bytes, as the manifest records");
    uint64_t fingerprint = 0;
    std::memcpy(&fingerprint, ids.data(), 8);
    check(fingerprint == detail::layer_fingerprint(context, saved.save_id, -1), "open_context " + path,
          "fingerprint " + std::to_string(fingerprint),
          "this save's (the file of another save, model or settings)");
    token_ids.resize(size_t(saved.tokens));
    if (!token_ids.empty()) std::memcpy(token_ids.data(), ids.data() + 8, ids.size() - 8);
  }
  for (int64_t i = 0; i < impl.arch.n_layers; ++i)
    for (const char* what : impl.options.memory ? std::vector<const char*>{"memory", "window"} : std::vector<const char*>{"kv"})
      check(listed(layer_name(i, what)), "open_context " + manifest_path, "no " + layer_name(i, what),
            "every layer's files (the manifest names them)");
  if (!impl.options.memory) {  // each layer's KV cache, with room for the capacity given after its tokens
    KvCacheConfig c = impl.cache_config();
    std::vector<KvCache> caches;
    for (int64_t i = 0; i < impl.arch.n_layers; ++i)
      caches.push_back(KvCache::open(layer_file(dir, i, "kv"), c, detail::layer_fingerprint(context, saved.save_id, i)));
    for (const KvCache& k : caches)
      check(k.size() == saved.tokens, "open_context " + dir, std::to_string(k.size()) + " tokens in one layer",
            std::to_string(saved.tokens) + ", as the manifest records");
    check(saved.tokens <= kMaxAbsPosition - impl.options.capacity, "open_context " + dir, std::to_string(saved.tokens) + " tokens",
          "<= 2^53 - the session's capacity");
    impl.caches = std::move(caches);
    impl.options.capacity += saved.tokens;
    impl.last_position = impl.caches.front().last_position();
    impl.token_ids = std::move(token_ids);
    return;
  }
  std::vector<MemoryKvCache> caches;
  for (int64_t i = 0; i < impl.arch.n_layers; ++i)
    caches.push_back(MemoryKvCache::open(impl.memory_config(), layer_file(dir, i, "memory"), layer_file(dir, i, "window"),
                                         detail::layer_fingerprint(context, saved.save_id, i)));
  for (const MemoryKvCache& c : caches)
    check(c.size() == saved.tokens && c.window_size() > 0, "open_context " + dir,
          std::to_string(c.size()) + " tokens in one layer", std::to_string(saved.tokens) + ", as the manifest records");
  check(saved.tokens <= kMaxAbsPosition - impl.options.capacity, "open_context " + dir, std::to_string(saved.tokens) + " tokens",
        "<= 2^53 - the session's capacity");
  impl.new_caches(std::move(caches));
  // A search reads only a file the manifest names (one of this save's: checked above).
  for (int64_t i = 0; i < int64_t(impl.searches.size()); ++i)
    if (listed(layer_name(i, "search"))) impl.searches[size_t(i)]->open(layer_file(dir, i, "search"));
  impl.options.capacity += saved.tokens;  // the capacity given counts the tokens after the context (a memory allocates none ahead)
  const MemoryKvCache& c0 = impl.memory_caches.front();
  impl.last_position = c0.window_positions()[c0.window_size() - 1];
  impl.memory_stats.memory_tokens = c0.memory().size();
  impl.token_ids = std::move(token_ids);
}

int64_t Session::saved_context_bytes(const std::string& dir) {
  return detail::context_bytes(detail::read_manifest(dir));
}

int64_t Session::next_position() const { return impl_->started() ? impl_->last_position + 1 : 0; }
const std::vector<int64_t>& Session::tokens() const { return impl_->token_ids; }
uint64_t Session::settings_fingerprint() const { return impl_->settings_fingerprint(); }

int64_t Session::held_bytes() const {
  const Impl& impl = *impl_;
  int64_t bytes = 0;
  // A cache's arrays are [kv_heads, capacity, row]: the core's count for a cache of size() rows is what it holds
  // (the rows past them are allocated, never touched).
  for (const KvCache& c : impl.caches) {
    if (c.size() == 0) continue;
    KvCacheConfig held{c.size(), c.kv_heads(), c.head_dim(), c.dtype(), c.pos()};
    held.storage = c.storage();
    bytes += kv_cache_bytes(held);
  }
  const int64_t rotary = impl.freqs.rotary_dim > 0 ? impl.freqs.rotary_dim : impl.arch.head_dim;
  for (const MemoryKvCache& c : impl.memory_caches)
    bytes += memory_layer_bytes(impl.arch, impl.options, rotary, c.memory().size());
  return bytes;
}

void Session::release_scratch() {
  Impl& impl = *impl_;
  for (std::vector<float>* v : {&impl.residual, &impl.q, &impl.k, &impl.v, &impl.attn_out, &impl.chunk_k, &impl.chunk_v,
                                &impl.chunk_lse, &impl.chunk_mass, &impl.rows.attn_in, &impl.rows.mlp_in, &impl.rows.qkv,
                                &impl.rows.ff_up, &impl.rows.ff_gate})
    std::vector<float>().swap(*v);
  for (std::vector<uint8_t>* v : {&impl.q_conv, &impl.k_conv, &impl.v_conv, &impl.out_conv}) std::vector<uint8_t>().swap(*v);
  std::vector<int64_t>().swap(impl.candidates);
  std::vector<int64_t>().swap(impl.chunk_pos);
}

bool Session::can_copy_prefix() const {
  return impl_->piece_done == 0 && impl_->options.keep_caches && !impl_->options.memory && !length_dependent(impl_->options.positions.rope);
}

void Session::copy_prefix_from(const Session& source, int64_t n) {
  Impl& impl = *impl_;
  const Impl& from = *source.impl_;
  from.check_context_session("copy_prefix_from source");
  check(!from.options.memory, "copy_prefix_from source", "a session with a memory",
        "a session of KV caches (a memory's rows cannot be cut at a token)");
  check(!impl.started(), "copy_prefix_from", "a session holding " + std::to_string(impl.size()) + " tokens",
        "an empty session");
  check(impl.model.get() == from.model.get(), "copy_prefix_from source", "a session of another model",
        "a session of this session's model");
  check(impl.settings_fingerprint() == from.settings_fingerprint(), "copy_prefix_from source",
        "a session with " + from.settings_text(), "this session's settings (" + impl.settings_text() + ")");
  check(n >= 1 && n <= from.size(), "copy_prefix_from n", n, "in [1, source.size() = " + std::to_string(from.size()) + "]");
  check(n <= impl.options.capacity, "copy_prefix_from n", n,
        "<= this session's capacity = " + std::to_string(impl.options.capacity));
  std::vector<KvCache> caches;
  for (const KvCache& c : from.caches) caches.push_back(c.copy_prefix(n, impl.options.capacity));
  impl.caches = std::move(caches);
  impl.last_position = impl.caches.front().last_position();
  const bool known = int64_t(from.token_ids.size()) == from.size();
  impl.token_ids.assign(from.token_ids.begin(), from.token_ids.begin() + (known ? n : 0));
}

Session::Session(std::shared_ptr<const Model> model, const SessionOptions& options)
    : impl_(std::make_unique<Impl>(std::move(model), options)) {}
Session::~Session() = default;
Session::Session(Session&&) noexcept = default;

void Session::forward(const int64_t* tokens, const int64_t* positions, int64_t n, float* hidden) {
  impl_->forward(tokens, positions, n, hidden);
}

void Session::logits(const float* hidden, int64_t n, float* out) const { impl_->model->logits(hidden, n, out, impl_->threads); }

int64_t Session::size() const { return impl_->size(); }
int64_t Session::capacity() const { return impl_->options.capacity; }
const SessionOptions& Session::options() const { return impl_->options; }
MemoryStats Session::memory_stats() const {
  MemoryStats s = impl_->memory_stats;
  if (s.retrieving_queries > 0) s.memory_mass /= double(s.retrieving_queries);
  if (impl_->scan_vectors > 0) s.scored_share = impl_->scored_vectors / impl_->scan_vectors;
  return s;
}
const Model& Session::model() const { return *impl_->model; }

void Session::clear() {
  impl_->caches.clear();
  impl_->memory_caches.clear();
  impl_->searches.clear();
  impl_->memory_stats = {};
  impl_->scored_vectors = impl_->scan_vectors = 0;
  impl_->hist_k.clear(), impl_->hist_v.clear(), impl_->hist_pos.clear();
  impl_->last_position = 0;
  impl_->token_ids.clear();
  impl_->passed = 0;
  impl_->piece_done = 0;
  impl_->piece_tokens.clear(), impl_->piece_positions.clear(), impl_->piece_residual.clear();
}

int64_t Session::piece_rows_done() const { return impl_->piece_done; }

struct SessionBatch::Impl {
  std::shared_ptr<const Model> model;
  const Model::Impl& weights;
  const Architecture& arch;
  int threads;
  std::vector<float> residual, q, k, v, attn_out;  // [rows of a layer's steps, width] (residual: when packed)
  std::vector<float> parked;  // [rows of every step, d_model]: each step's residual rows between its layers
  LayerRows rows;

  Impl(std::shared_ptr<const Model> mod, int t)
      : model(std::move(mod)), weights(model->impl()), arch(weights.arch), threads(t > 0 ? t : omp_get_max_threads()),
        rows(*model, arch, threads) {}

  void grow(int64_t n) {
    const int64_t d = arch.d_model, hq = arch.n_heads * arch.head_dim, hkv = arch.n_kv_heads * arch.head_dim;
    auto need = [](std::vector<float>& f, int64_t size) {
      if (int64_t(f.size()) < size) f.resize(size_t(size));
    };
    need(residual, n * d), need(q, n * hq), need(k, n * hkv), need(v, n * hkv), need(attn_out, n * hq);
    rows.grow(n);
  }
};

void end_thread_team() {
  check(!omp_in_parallel(), "end_thread_team", "inside a parallel region", "a call outside every parallel region");
  // Nonzero where the runtime cannot pause: the team stays, which costs speed, not results.
  (void)omp_pause_resource_all(omp_pause_soft);
}

SessionBatch::SessionBatch(std::shared_ptr<const Model> model, int threads)
    : impl_(std::make_unique<Impl>(std::move(model), threads)) {
  check(threads >= 0, "threads", threads, ">= 0 (0: OpenMP's default)");
}
SessionBatch::~SessionBatch() = default;

void SessionBatch::forward(const std::vector<BatchStep>& steps) {
  Impl& b = *impl_;
  const Architecture& arch = b.arch;
  const int64_t d = arch.d_model, hq = arch.n_heads * arch.head_dim, hkv = arch.n_kv_heads * arch.head_dim;
  const int64_t L = arch.n_layers;
  // The checks of every step before any work.
  std::vector<const BatchStep*> batched, alone;
  for (size_t i = 0; i < steps.size(); ++i) {
    const BatchStep& st = steps[i];
    const std::string name = "steps[" + std::to_string(i) + "]";
    check(st.session != nullptr, name + ".session", "null", "a session");
    check(&st.session->model() == b.model.get(), name + ".session", "a session of another model",
          "a session of the batch's model");
    for (size_t j = 0; j < i; ++j)
      check(steps[j].session != st.session, name + ".session", "the session of steps[" + std::to_string(j) + "]",
            "each session once per batch");
    check(st.n >= 1 && st.tokens != nullptr && st.positions != nullptr, name + ".n", st.n, ">= 1 token with its tokens and positions");
    check(st.layer_rows >= 0, name + ".layer_rows", st.layer_rows, ">= 0 (0: all that remain)");
    Session::Impl& s = *st.session->impl_;
    if (s.piece_done > 0) {  // a piece in progress goes on with its own tokens
      const bool same = st.n == int64_t(s.piece_tokens.size()) &&
                        std::equal(st.tokens, st.tokens + st.n, s.piece_tokens.begin()) &&
                        std::equal(st.positions, st.positions + st.n, s.piece_positions.begin());
      check(same, name + ".tokens",
            "other tokens or positions than its piece in progress (" + std::to_string(s.piece_done) + " of " +
                std::to_string(int64_t(s.piece_tokens.size()) * L) + " token-layers run)",
            "the piece's " + std::to_string(s.piece_tokens.size()) + " tokens at their positions until its last layer");
    } else {
      try {
        s.check_tokens(st.tokens, st.positions, st.n);
      } catch (const Error& e) {
        fail(name, e.what(), "tokens the session takes");
      }
    }
    const bool own = s.options.memory || length_dependent(s.options.positions.rope) || !s.options.keep_caches;
    (own ? alone : batched).push_back(&st);
  }
  auto whole = [&](const BatchStep* st) { return st->layer_rows == 0 && st->session->impl_->piece_done == 0; };
  if (batched.size() == 1 && whole(batched.front())) alone.insert(alone.begin(), batched.front()), batched.clear();

  if (!batched.empty()) {
    // Each step's (token, layer) rows [first, last) in layer-major order (a whole step: all n x L) and its residual
    // rows in b.parked (offset). Layer li runs each step's tokens [a, b) that fall in it (packed in order into
    // b.residual when some step's are not all there); a piece's tokens in a layer run in order, so its attention goes on chunk by chunk as its own
    // forward's would (each chunk's queries against every key before them: the same bits for any chunking).
    const size_t B = batched.size();
    std::vector<int64_t> first(B), last(B), offset(B);
    int64_t total = 0;
    for (size_t i = 0; i < B; ++i) {
      const BatchStep& st = *batched[i];
      Session::Impl& s = *st.session->impl_;
      first[i] = s.piece_done;
      last[i] = st.layer_rows == 0 ? st.n * L : std::min(st.n * L, first[i] + st.layer_rows);
      if (first[i] == 0) s.piece_prompt = s.size() == 0 && st.n > 1;  // as Session::forward decides it
      offset[i] = total, total += st.n;
      if (!s.started()) s.new_caches();
      s.grow(st.n);
    }
    b.grow(total);
    if (int64_t(b.parked.size()) < total * d) b.parked.resize(size_t(total * d));
    for (size_t i = 0; i < B; ++i) {
      const BatchStep& st = *batched[i];
      Session::Impl& s = *st.session->impl_;
      float* rows = b.parked.data() + offset[i] * d;
      if (first[i] > 0)
        std::copy_n(s.piece_residual.data(), st.n * d, rows);
      else
        for (int64_t t = 0; t < st.n; ++t) weight_row(b.weights.embed, st.tokens[t], rows + t * d);
    }
    std::vector<int64_t> lo(B), hi(B), at(B);  // a step's tokens [lo, hi) in this layer, at row `at` of its rows
    for (int64_t li = 0; li < L; ++li) {
      int64_t rows = 0;
      for (size_t i = 0; i < B; ++i) {
        const int64_t n = batched[i]->n;
        lo[i] = std::clamp(first[i] - li * n, int64_t(0), n), hi[i] = std::clamp(last[i] - li * n, int64_t(0), n);
        at[i] = rows, rows += hi[i] - lo[i];
      }
      if (rows == 0) continue;
      // Every step's rows in the layer (decode steps, whole pieces): they are b.parked as it is; else packed.
      const bool packed = rows < total;
      float* x = packed ? b.residual.data() : b.parked.data();
      if (packed)
        for (size_t i = 0; i < B; ++i)
          std::copy_n(b.parked.data() + (offset[i] + lo[i]) * d, (hi[i] - lo[i]) * d, x + at[i] * d);
      const Layer& l = b.weights.layers[size_t(li)];
      b.rows.before_attention(l, x, rows, b.q.data(), b.k.data(), b.v.data());
      // Each session attends in its own scratch, in the chunks its own forward() would take.
      for (size_t i = 0; i < B; ++i) {
        if (lo[i] == hi[i]) continue;
        const BatchStep& st = *batched[i];
        Session::Impl& s = *st.session->impl_;
        const int64_t o = at[i] - lo[i], chunk = layer_chunk(s.options);  // (token t at row o + t)
        std::memcpy(s.k.data() + lo[i] * hkv, b.k.data() + at[i] * hkv, size_t((hi[i] - lo[i]) * hkv) * 4);
        std::memcpy(s.v.data() + lo[i] * hkv, b.v.data() + at[i] * hkv, size_t((hi[i] - lo[i]) * hkv) * 4);
        for (int64_t t0 = lo[i]; t0 < hi[i]; t0 += chunk) {
          const int64_t c = std::min(chunk, hi[i] - t0);
          std::memcpy(s.q.data(), b.q.data() + (o + t0) * hq, size_t(c * hq) * 4);
          s.attend_with_cache(li, t0, c, st.positions, s.piece_prompt);
          std::memcpy(b.attn_out.data() + (o + t0) * hq, s.attn_out.data(), size_t(c * hq) * 4);
        }
      }
      b.rows.after_attention(l, b.attn_out.data(), x, rows);
      if (packed)
        for (size_t i = 0; i < B; ++i)
          std::copy_n(x + at[i] * d, (hi[i] - lo[i]) * d, b.parked.data() + (offset[i] + lo[i]) * d);
    }
    for (size_t i = 0; i < B; ++i) {
      const BatchStep& st = *batched[i];
      Session::Impl& s = *st.session->impl_;
      const float* rows = b.parked.data() + offset[i] * d;
      if (last[i] < st.n * L) {  // the piece stops here: its rows kept for the step that goes on
        if (s.piece_done == 0) {
          s.piece_tokens.assign(st.tokens, st.tokens + st.n), s.piece_positions.assign(st.positions, st.positions + st.n);
          s.piece_residual.resize(size_t(st.n * d));
        }
        std::copy_n(rows, st.n * d, s.piece_residual.data());
        s.piece_done = last[i];
        continue;
      }
      s.piece_done = 0;
      s.piece_tokens.clear(), s.piece_positions.clear();
      std::vector<float>().swap(s.piece_residual);
      s.last_position = st.positions[st.n - 1];
      s.token_ids.insert(s.token_ids.end(), st.tokens, st.tokens + st.n);
      if (st.hidden) apply_norm(arch.norm, b.weights.final_norm, arch.norm_eps, rows, st.n, d, st.hidden, b.threads);
    }
  }
  for (const BatchStep* st : alone) st->session->forward(st->tokens, st->positions, st->n, st->hidden);
}

int64_t Session::bytes_needed(const Model& model, const SessionOptions& options, int64_t prompt_tokens) {
  const Architecture& arch = model.arch();
  const int64_t rotary = options.positions.rope.rotary_dim > 0 ? options.positions.rope.rotary_dim : arch.head_dim;
  const int64_t es = int64_t(dtype_size(options.kv_dtype));
  const int64_t n = std::max<int64_t>(prompt_tokens, 1), hq = arch.n_heads * arch.head_dim, hkv = arch.n_kv_heads * arch.head_dim;
  int64_t cache = 0;
  if (options.keep_caches && !options.memory) {  // the core's count for the caches new_caches() makes
    const RopeFreqs freqs = options.positions.rope.freqs(options.capacity);
    KvCacheConfig c;
    c.capacity = options.capacity, c.kv_heads = arch.n_kv_heads, c.head_dim = int(arch.head_dim), c.dtype = options.kv_dtype;
    c.storage = options.kv_storage;
    c.pos.mode = options.positions.mode, c.pos.freqs = &freqs, c.pos.window = options.positions.window;
    c.pos.leaky_k = options.positions.leaky_k, c.pos.logn_train_len = options.positions.logn_train_len;
    cache = arch.n_layers * kv_cache_bytes(c);
  }
  if (options.memory) {
    // Per layer: the window's cache (2W rows, f32) and its un-rotated rows, the memory's keys, values and
    // positions for every token; and the chunk buffers (window + chunk rows).
    const int64_t w2 = 2 * std::max<int64_t>(options.memory->window, 1);
    const int64_t chunk = options.memory->chunk_tokens();
    cache = arch.n_layers * memory_layer_bytes(arch, options, rotary, options.capacity);
    cache += ((w2 + chunk) * 2 * hkv + 2 * chunk * arch.n_heads) * 4;  // keys, values; lse and the memory's share
    if (options.memory->search) {  // per kv head: the rows' order (8 B each) and, per node (~2 per page), its box and links
      const int64_t nodes = std::max<int64_t>(1, 2 * options.capacity / options.memory->search->page_size);
      cache += arch.n_layers * arch.n_kv_heads * (8 * options.capacity + nodes * (2 * arch.head_dim * 4 + 32));
    }
    if (options.memory->search_factory && options.memory->search_bytes)
      cache += arch.n_layers * arch.n_kv_heads * options.memory->search_bytes(options.capacity, arch.head_dim);
    if (options.memory->search || options.memory->search_factory)
      cache += 8 * chunk * arch.n_heads * int64_t(options.memory->top_k);  // candidates
  }
  // The residual stream and one layer's keys and values for every token; the rest for one chunk (grow()).
  const int64_t chunk = std::min(n, layer_chunk(options));
  int64_t scratch = 4 * (n * (arch.d_model + 2 * hkv) +
                         chunk * (2 * arch.d_model + 2 * hq + (arch.fused_qkv ? 3 * hq : 0) + 2 * arch.d_ff));
  if (options.kv_dtype != DType::F32) scratch += es * (2 * chunk * hq + 2 * n * hkv);
  // The fused attention's own scratch for a chunk: its queries and every key before them in padded float32 rows,
  // twice for ReRoPE's far copies (attention.h: O(tokens x heads x head_dim)).
  const int64_t dp = round_up(arch.head_dim, 16);
  scratch += 4 * 2 * (chunk * arch.n_heads * dp + 2 * n * arch.n_kv_heads * dp);
  // bf16 / q8 activations: linear_forward's converted copy of the largest input of one call (one chunk's): bf16
  // 2 bytes an element; q8 its quants, the int8 kernel's corrections and scale pairs (a byte an element each, padded
  // to 64) and a scale per 32.
  const int64_t widest = std::max({arch.d_model, hq, arch.d_ff});
  if (model.activations() == ActivationFormat::BF16) scratch += 2 * chunk * widest;
  if (model.activations() == ActivationFormat::Q8) scratch += chunk * (3 * (widest + 64) + (widest / 32 + 1) * 4);
  return cache + scratch;
}

}  // namespace rotary::engine
