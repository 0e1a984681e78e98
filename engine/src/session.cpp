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

bool length_dependent(const RopeSpec& r) {
  return r.scaling == RopeScaling::Dynamic || r.scaling == RopeScaling::LongRope;
}

// Tokens per chunk of a layer's work on a prompt: prefill_chunk, rounded down to whole memory chunks with a memory
// (at least one), so that the memory's chunks start where they would over the whole call.
int64_t layer_chunk(const SessionOptions& o) {
  if (!o.memory) return o.prefill_chunk;
  const int64_t m = o.memory->chunk_tokens();
  return m * std::max<int64_t>(1, o.prefill_chunk / m);
}

float gelu(float x, bool tanh_form) {
  if (tanh_form) return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  return float(0.5 * double(x) * (1.0 + std::erf(double(x) * 0.7071067811865476)));
}

// One value's bytes into a saved context's fingerprint (rotary/files.h's fnv1a64).
template <class T>
uint64_t fnv1a(uint64_t h, const T& value) {
  return fnv1a64(&value, sizeof value, h);
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

}  // namespace

struct Session::Impl {
  std::shared_ptr<const Model> model;
  const Model::Impl& m;
  const Architecture& a;
  SessionOptions o;
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
  int64_t passed = 0;  // keep_caches false: the tokens of the one forward() call so far (0 or its n)
  // Length-dependent scalings rebuild the caches from the un-rotated keys and values when the frequencies change.
  std::vector<std::vector<float>> hist_k, hist_v;
  std::vector<int64_t> hist_pos;
  // Scratch, [tokens, width] float32 unless said otherwise.
  std::vector<float> x, h, h2, q, k, v, qkv, att, ff_up, ff_gate;
  std::vector<uint8_t> qc, kc, vc, oc;  // q, k, v, o converted to a bf16 / f16 cache's dtype (unused for f32)

  Impl(std::shared_ptr<const Model> mod, const SessionOptions& opt)
      : model(std::move(mod)), m(model->impl()), a(m.arch), o(opt),
        threads(opt.threads > 0 ? opt.threads : omp_get_max_threads()) {
    check(o.capacity >= 1, "capacity", o.capacity, ">= 1 token");
    check(a.sliding_window == 0 || o.capacity <= a.sliding_window, "capacity", o.capacity,
          "<= the checkpoint's sliding_window = " + std::to_string(a.sliding_window) +
              " (rotary has no sliding-window attention; longer sequences would differ from the checkpoint's code)");
    check(o.kv_dtype == DType::F32 || o.kv_dtype == DType::BF16 || o.kv_dtype == DType::F16, "kv_dtype",
          dtype_name(o.kv_dtype), "f32, bf16, f16");
    check(o.kv_storage == KvStorage::Dtype || o.kv_storage == KvStorage::Q8, "kv_storage", int(o.kv_storage),
          "dtype, q8");
    if (o.kv_storage == KvStorage::Q8) {
      check(o.kv_dtype == DType::F32, "kv_dtype", dtype_name(o.kv_dtype),
            "f32 with kv_storage q8 (the queries and outputs; the cache quantizes what it stores)");
      check(!o.memory, "kv_storage", "q8", "dtype with a memory (memory.storage sets the memory's dtype)");
    }
    check(o.prefill_chunk >= 1, "prefill_chunk", o.prefill_chunk, ">= 1");
    check(o.keep_caches || !o.memory, "keep_caches", "false",
          "true with a memory (the memory and its window are the caches it keeps)");
    check(o.threads >= 0, "threads", o.threads, ">= 0 (0: OpenMP's default)");
    const PositionMethod& p = o.positions;
    check(p.mode != PositionMode::None, "positions.mode", "none", "rope, rerope, leaky_rerope");
    check(p.rope.head_dim == a.head_dim, "positions.rope.head_dim", p.rope.head_dim,
          "the model's head_dim = " + std::to_string(a.head_dim));
    take_freqs(o.capacity);  // validates the rope; the length-dependent ones are taken again per forward
    if (o.memory) {
      const MemoryOptions& mo = *o.memory;
      check(o.kv_dtype == DType::F32, "kv_dtype", dtype_name(o.kv_dtype),
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
    c.window = o.memory->window, c.kv_heads = a.n_kv_heads, c.head_dim = int(a.head_dim);
    c.pos = position_params(), c.policy = o.memory->policy, c.memory_storage = o.memory->storage;
    return c;
  }

  PositionParams position_params() const {
    PositionParams pp;
    pp.mode = o.positions.mode, pp.freqs = &freqs, pp.window = o.positions.window, pp.leaky_k = o.positions.leaky_k;
    pp.logn_train_len = o.positions.logn_train_len;
    return pp;
  }
  void take_freqs(int64_t len) {
    freqs = o.positions.rope.freqs(len);
    freqs_len = len;
  }
  uint64_t context_fingerprint() const;  // save_context's: the model and what shaped the cached rows
  void check_context_session(const char* who) const;

  // Empty caches for every layer (with a memory: `opened`, a saved context's, when given) and their searches.
  void new_caches(std::vector<MemoryKvCache> opened = {}) {
    caches.clear();
    memory_caches.clear();
    searches.clear();
    if (o.memory) {
      memory_caches = std::move(opened);
      if (memory_caches.empty())
        for (int64_t i = 0; i < a.n_layers; ++i) memory_caches.emplace_back(memory_config());
      // (each cache holds its KvMemory on the heap: the address a search keeps does not move with the vector)
      for (const MemoryKvCache& c : memory_caches) {
        if (o.memory->search) searches.push_back(std::make_unique<PageSearch>(c.memory(), *o.memory->search));
        if (o.memory->search_factory) {
          searches.push_back(o.memory->search_factory(c.memory()));
          check(searches.back() != nullptr, "memory.search_factory", "a null search", "a MemorySearch");
        }
      }
      return;
    }
    if (!o.keep_caches) return;
    const KvCacheConfig c = cache_config();
    for (int64_t i = 0; i < a.n_layers; ++i) caches.emplace_back(c);
  }
  KvCacheConfig cache_config() const {
    KvCacheConfig c;
    c.capacity = o.capacity, c.kv_heads = a.n_kv_heads, c.head_dim = int(a.head_dim), c.dtype = o.kv_dtype;
    c.pos = position_params(), c.threads = threads, c.storage = o.kv_storage;
    return c;
  }

  int64_t size() const {
    if (o.memory) return memory_caches.empty() ? 0 : memory_caches.front().size();
    if (!o.keep_caches) return passed;
    return caches.empty() ? 0 : caches.front().size();
  }
  bool started() const { return o.memory ? !memory_caches.empty() : o.keep_caches ? !caches.empty() : passed > 0; }

  // Every token's residual stream (x) and one layer's keys and values (k, v: a chunk's queries attend to all the
  // keys before them); the rest holds one chunk of at most prefill_chunk tokens.
  void grow(int64_t n) {
    const int64_t d = a.d_model, hq = a.n_heads * a.head_dim, hkv = a.n_kv_heads * a.head_dim;
    const int64_t chunk = std::min(n, layer_chunk(o)), es = int64_t(dtype_size(o.kv_dtype));
    auto need = [](auto& v, int64_t size) {
      if (int64_t(v.size()) < size) v.resize(size_t(size));
    };
    need(x, n * d), need(k, n * hkv), need(v, n * hkv);
    need(h, chunk * d), need(h2, chunk * d), need(q, chunk * hq), need(att, chunk * hq);
    if (a.fused_qkv) need(qkv, chunk * 3 * hq);
    need(ff_up, chunk * a.d_ff);
    if (a.mlp == MlpKind::SwiGlu) need(ff_gate, chunk * a.d_ff);
    if (o.kv_dtype != DType::F32)
      need(qc, chunk * hq * es), need(kc, n * hkv * es), need(vc, n * hkv * es), need(oc, chunk * hq * es);
  }

  // Floats [from, to) of `f` as the attention kernels take them, in the cache's dtype; returns the base of the array
  // holding them (element i at i): `f` itself for an f32 cache (no copy on the decode path), else `conv` with those
  // elements rounded into it (grown only when a longer prompt needs it).
  char* in_kv_dtype(std::vector<float>& f, std::vector<uint8_t>& conv, int64_t from, int64_t to) {
    if (o.kv_dtype == DType::F32) return reinterpret_cast<char*>(f.data());
    const size_t bytes = size_t(to) * dtype_size(o.kv_dtype);
    if (conv.size() < bytes) conv.resize(bytes);
    for (int64_t i = from; i < to; ++i) store_from_double(conv.data(), o.kv_dtype, i, f[size_t(i)]);
    return reinterpret_cast<char*>(conv.data());
  }

  LinearParams product(const Linear& l, const float* in, int64_t n, int64_t in_stride, float* out, int64_t out_stride,
                       bool accumulate) const {
    LinearParams p;
    p.w = l.w, p.bias = l.bias, p.tokens = n, p.x = in, p.x_stride = in_stride, p.y = out, p.y_stride = out_stride;
    p.accumulate = accumulate, p.activations = model->activations(), p.threads = threads;
    return p;
  }
  void project(const Linear& l, const float* in, int64_t n, int64_t in_stride, float* out, int64_t out_stride,
               bool accumulate) const {
    linear_forward(product(l, in, n, in_stride, out, out_stride, accumulate));
  }

  void check_tokens(const int64_t* tokens, const int64_t* positions, int64_t n) const {
    check(n >= 1, "n", n, ">= 1 token");
    check(o.keep_caches || passed == 0, "keep_caches", "false",
          "one forward() call per clear() (this session kept no keys for the " + std::to_string(passed) +
              " tokens it ran)");
    check(size() + n <= o.capacity, "tokens", size() + n,
          "<= the session's capacity = " + std::to_string(o.capacity) + " (cached " + std::to_string(size()) + " + " +
              std::to_string(n) + " new)");
    for (int64_t t = 0; t < n; ++t) {
      if (tokens[t] < 0 || tokens[t] >= a.vocab_size)
        fail("tokens[" + std::to_string(t) + "]", std::to_string(tokens[t]),
             "an id in [0, vocab_size = " + std::to_string(a.vocab_size) + ")");
      const bool first = t == 0 && size() == 0;
      const int64_t prev = t > 0 ? positions[t - 1] : last_position;
      if (positions[t] < 0 || positions[t] > kMaxAbsPosition || (!first && positions[t] <= prev))
        fail("positions[" + std::to_string(t) + "]", std::to_string(positions[t]),
             first ? "in [0, 2^53]" : "> " + std::to_string(prev) + " (positions increase) and <= 2^53");
    }
  }

  void rebuild_caches() {
    new_caches();
    if (hist_pos.empty()) return;
    const int64_t n = int64_t(hist_pos.size()), hkv = a.n_kv_heads * a.head_dim;
    for (int64_t i = 0; i < a.n_layers; ++i)
      caches[size_t(i)].append(n, view(in_kv_dtype(hist_k[size_t(i)], kc, 0, n * hkv), a.n_kv_heads),
                               view(in_kv_dtype(hist_v[size_t(i)], vc, 0, n * hkv), a.n_kv_heads), hist_pos.data());
  }
  // [tokens, heads, head_dim] packed.
  HeadsView view(void* data, int64_t heads) const { return {data, heads, heads * a.head_dim, a.head_dim}; }

  // Attention of one layer's chunk of c tokens t0.. of this call (q, att: the chunk's [c, heads, head_dim]; k, v:
  // the call's tokens up to the chunk's end, f32 in the scratch) through its KV cache: a prompt (the first call,
  // n > 1) through the fused kernel - the chunk's queries against every key before them (first_query) - later
  // tokens one decode step each.
  void attend_with_cache(int64_t layer, int64_t t0, int64_t c, const int64_t* positions, bool prompt) {
    const int64_t hd = a.head_dim, hq = a.n_heads * hd, hkv = a.n_kv_heads * hd;
    const int64_t es = int64_t(dtype_size(o.kv_dtype));
    char* qs = in_kv_dtype(q, qc, 0, c * hq);
    char* ks = in_kv_dtype(k, kc, t0 * hkv, (t0 + c) * hkv);
    char* vs = in_kv_dtype(v, vc, t0 * hkv, (t0 + c) * hkv);
    char* os = o.kv_dtype == DType::F32 ? reinterpret_cast<char*>(att.data()) : reinterpret_cast<char*>(oc.data());
    if (prompt) {
      AttentionParams p;
      p.tokens = t0 + c, p.first_query = t0, p.head_dim = int(hd), p.dtype = o.kv_dtype;
      p.q = view(qs, a.n_heads), p.k = view(ks, a.n_kv_heads), p.v = view(vs, a.n_kv_heads);
      p.o = view(os, a.n_heads), p.positions = positions, p.causal = true, p.pos = position_params();
      p.threads = threads;
      attention_forward(p);
      if (o.keep_caches)
        caches[size_t(layer)].append(c, view(ks + t0 * hkv * es, a.n_kv_heads), view(vs + t0 * hkv * es, a.n_kv_heads),
                                     positions + t0);
    } else {
      KvCache& cache = caches[size_t(layer)];
      for (int64_t t = 0; t < c; ++t) {
        const int64_t kt = (t0 + t) * hkv * es;
        cache.append(1, view(ks + kt, a.n_kv_heads), view(vs + kt, a.n_kv_heads), positions + t0 + t);
        DecodeParams p;
        p.q = view(qs + t * hq * es, a.n_heads), p.o = view(os + t * hq * es, a.n_heads);
        p.threads = threads;
        attention_decode(cache, p);
      }
    }
    if (o.kv_dtype != DType::F32)
      for (int64_t i = 0; i < c * hq; ++i) att[size_t(i)] = float(load_as_double(oc.data(), o.kv_dtype, i));
  }

  // Attention of one layer's chunk of n tokens t0.. of this call (q, att: the chunk's [n, heads, head_dim]; k, v:
  // the call's, f32 in the scratch) through its memory cache: memory chunk by memory chunk, each attending to the
  // window and itself (one fused causal call, the window's rows as keys only: first_query), then to the memory's
  // top-k, merged; then joining the window. A chunk of one token is a decode step (MemoryKvCache::decode).
  void attend_with_memory(int64_t layer, int64_t t0, int64_t n, const int64_t* positions) {
    MemoryKvCache& cache = memory_caches[size_t(layer)];
    MemorySearch* searcher = searches.empty() ? nullptr : searches[size_t(layer)].get();
    const MemoryOptions& mo = *o.memory;
    const int64_t hd = a.head_dim, Hq = a.n_heads, Hkv = a.n_kv_heads, hq = Hq * hd, hkv = Hkv * hd;
    const int64_t chunk = mo.chunk_tokens();
    float* const q_all = q.data();
    float* const k_all = k.data() + t0 * hkv;
    float* const v_all = v.data() + t0 * hkv;
    float* const o_all = att.data();
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
    const bool dynamic = length_dependent(o.positions.rope);
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
    const int64_t d = a.d_model, hd = a.head_dim, hq = a.n_heads * hd, hkv = a.n_kv_heads * hd;
    // (a one-pass session runs even one token as a prompt: it has no cache to decode from)
    const bool prompt = size() == 0 && (n > 1 || !o.keep_caches);
    const bool history = dynamic && o.keep_caches;  // un-rotated rows to rebuild the caches from
    const int64_t chunk = layer_chunk(o);
    for (int64_t t = 0; t < n; ++t) weight_row(m.embed, tokens[t], x.data() + t * d);

    // Layer by layer; inside a layer, chunk by chunk of prefill_chunk tokens (its keys and values kept for the
    // chunks after it), so that activations other than the residual stream and the keys take one chunk's memory.
    for (int64_t li = 0; li < a.n_layers; ++li) {
      const Layer& l = m.layers[size_t(li)];
      if (history && hist_k.size() < size_t(a.n_layers))
        hist_k.resize(size_t(a.n_layers)), hist_v.resize(size_t(a.n_layers));
      for (int64_t t0 = 0; t0 < n; t0 += chunk) {
        const int64_t c = std::min(chunk, n - t0), ff = a.d_ff;
        float* xs = x.data() + t0 * d;
        float* ks = k.data() + t0 * hkv;
        float* vs = v.data() + t0 * hkv;
        apply_norm(a.norm, l.attn_norm, a.norm_eps, xs, c, d, h.data(), threads);
        if (a.fused_qkv) {  // per head [q | k | v] rows: one product, then the heads' thirds
          project(l.qkv, h.data(), c, d, qkv.data(), 3 * hq, false);
          for (int64_t t = 0; t < c; ++t)
            for (int64_t hh = 0; hh < a.n_heads; ++hh) {
              const float* src = qkv.data() + t * 3 * hq + hh * 3 * hd;
              std::memcpy(q.data() + t * hq + hh * hd, src, size_t(hd) * 4);
              std::memcpy(ks + t * hkv + hh * hd, src + hd, size_t(hd) * 4);
              std::memcpy(vs + t * hkv + hh * hd, src + 2 * hd, size_t(hd) * 4);
            }
        } else {
          // One team of threads for the three (the small k and v share q's work: decode wakes the threads once).
          const LinearParams qkv_products[] = {product(l.q, h.data(), c, d, q.data(), hq, false),
                                               product(l.k, h.data(), c, d, ks, hkv, false),
                                               product(l.v, h.data(), c, d, vs, hkv, false)};
          linear_forward_group(qkv_products, 3);
        }
        if (history) {
          hist_k[size_t(li)].insert(hist_k[size_t(li)].end(), ks, ks + c * hkv);
          hist_v[size_t(li)].insert(hist_v[size_t(li)].end(), vs, vs + c * hkv);
        }
        if (o.memory) {
          attend_with_memory(li, t0, c, positions);
        } else {
          attend_with_cache(li, t0, c, positions, prompt);
        }
        if (a.parallel_residual) apply_norm(a.norm, l.mlp_norm, a.norm_eps, xs, c, d, h2.data(), threads);
        project(l.o, att.data(), c, hq, xs, d, true);
        if (!a.parallel_residual) apply_norm(a.norm, l.mlp_norm, a.norm_eps, xs, c, d, h2.data(), threads);
        const LinearParams up_gate[] = {product(l.up, h2.data(), c, d, ff_up.data(), ff, false),
                                        product(l.gate, h2.data(), c, d, ff_gate.data(), ff, false)};
        linear_forward_group(up_gate, a.mlp == MlpKind::SwiGlu ? 2 : 1);
        if (a.mlp == MlpKind::SwiGlu) {
          swiglu_forward(ff_gate.data(), ff_up.data(), c * ff, threads);
        } else {  // each element on its own: the threads change no bit
          const bool tanh_form = a.mlp == MlpKind::GeluTanh;
          const int64_t count = c * ff;
          float* up = ff_up.data();
#pragma omp parallel for num_threads(threads) schedule(static) if (count >= 16384)
          for (int64_t i = 0; i < count; ++i) up[i] = gelu(up[i], tanh_form);
        }
        project(l.down, ff_up.data(), c, ff, xs, d, true);
      }
    }
    if (history) hist_pos.insert(hist_pos.end(), positions, positions + n);
    if (!o.keep_caches) passed = n;
    last_position = positions[n - 1];
    if (hidden) apply_norm(a.norm, m.final_norm, a.norm_eps, x.data(), n, d, hidden, threads);
  }
};

namespace {

std::string layer_file(const std::string& dir, int64_t layer, const char* what) {
  return dir + "/layer" + std::to_string(layer) + "." + what;
}

}  // namespace

// What made a saved context's rows: the model (its shape and three rows of its embedding, read as float32) and the
// options that shape what the caches hold. Search, top-k and threads are not in it: they change what is read,
// not what is stored.
uint64_t Session::Impl::context_fingerprint() const {
  const Impl& s = *this;
  const Architecture& a = s.a;
  uint64_t h = kFnv1a64Offset;
  for (int64_t v : {a.vocab_size, a.d_model, a.n_layers, a.n_heads, a.n_kv_heads, a.head_dim, a.d_ff})
    h = fnv1a(h, v);
  std::vector<float> row(static_cast<size_t>(a.d_model));
  for (int64_t id : {int64_t(0), a.vocab_size / 2, a.vocab_size - 1}) {
    weight_row(s.m.embed, id, row.data());
    h = fnv1a64(row.data(), row.size() * sizeof(float), h);
  }
  const PositionMethod& p = s.o.positions;
  h = fnv1a(h, int(p.mode)), h = fnv1a(h, p.window), h = fnv1a(h, p.leaky_k), h = fnv1a(h, p.logn_train_len);
  h = fnv1a64(s.freqs.inv_freq.data(), s.freqs.inv_freq.size() * sizeof(double), h);
  h = fnv1a(h, s.freqs.attention_factor), h = fnv1a(h, s.freqs.rotary_dim), h = fnv1a(h, int(s.freqs.layout));
  if (s.o.memory) {
    const MemoryOptions& mo = *s.o.memory;
    h = fnv1a(h, int(mo.policy)), h = fnv1a(h, mo.window), h = fnv1a(h, int(mo.storage));
  }
  return h;
}

// What save_context / open_context refuse before touching files.
void Session::Impl::check_context_session(const char* who) const {
  const Impl& s = *this;
  check(s.o.memory || s.o.keep_caches, who, "a session without caches (keep_caches = false)",
        "a session that keeps its KV caches or has a memory");
  check(s.o.memory || !length_dependent(s.o.positions.rope), who,
        "a session with rope scaling " + std::string(scaling_name(s.o.positions.rope.scaling)),
        "a scaling whose frequencies do not change with the length (the caches of dynamic NTK and LongRoPE are "
        "rebuilt from un-rotated rows a saved context does not hold)");
}

void Session::save_context(const std::string& dir) const {
  const Impl& s = *impl_;
  s.check_context_session("save_context");
  check(s.started(), "save_context", "an empty session", "a session that has run tokens");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  check(!ec && std::filesystem::is_directory(dir), "save_context dir", dir,
        "a directory that exists or can be made" + (ec ? " (" + ec.message() + ")" : std::string()));
  const uint64_t fingerprint = s.context_fingerprint();
  for (int64_t i = 0; i < s.a.n_layers; ++i)
    if (s.o.memory)
      s.memory_caches[size_t(i)].save(layer_file(dir, i, "memory"), layer_file(dir, i, "window"), fingerprint);
    else
      s.caches[size_t(i)].save(layer_file(dir, i, "kv"), fingerprint);
  // What the searches built (MemorySearch::save); an earlier save's file goes first, so that a context saved again
  // with another search never keeps a search file of other rows.
  for (int64_t i = 0; i < int64_t(s.searches.size()); ++i) {
    const std::string path = layer_file(dir, i, "search");
    std::filesystem::remove(path, ec);
    check(!ec, "save_context " + path, ec.message(), "a file that can be replaced");
    s.searches[size_t(i)]->save(path);
  }
}

void Session::open_context(const std::string& dir) {
  Impl& s = *impl_;
  s.check_context_session("open_context");
  check(!s.started(), "open_context", "a session holding " + std::to_string(s.size()) + " tokens",
        "an empty session");
  const uint64_t fingerprint = s.context_fingerprint();
  if (!s.o.memory) {  // each layer's KV cache, with room for the capacity given after its tokens
    KvCacheConfig c = s.cache_config();
    std::vector<KvCache> caches;
    for (int64_t i = 0; i < s.a.n_layers; ++i) caches.push_back(KvCache::open(layer_file(dir, i, "kv"), c, fingerprint));
    for (const KvCache& k : caches)
      check(k.size() == caches.front().size() && k.size() > 0, "open_context " + dir,
            std::to_string(k.size()) + " tokens in one layer, " + std::to_string(caches.front().size()) +
                " in layer 0",
            "every layer's files from one saved session");
    const int64_t n = caches.front().size();
    check(n <= kMaxAbsPosition - s.o.capacity, "open_context " + dir, std::to_string(n) + " tokens",
          "<= 2^53 - the session's capacity");
    s.caches = std::move(caches);
    s.o.capacity += n;
    s.last_position = s.caches.front().last_position();
    return;
  }
  std::vector<MemoryKvCache> caches;
  for (int64_t i = 0; i < s.a.n_layers; ++i)
    caches.push_back(
        MemoryKvCache::open(s.memory_config(), layer_file(dir, i, "memory"), layer_file(dir, i, "window"), fingerprint));
  for (const MemoryKvCache& c : caches)
    check(c.size() == caches.front().size() && c.window_size() > 0, "open_context " + dir,
          std::to_string(c.size()) + " tokens in one layer, " + std::to_string(caches.front().size()) + " in layer 0",
          "every layer's files from one saved session");
  const int64_t n = caches.front().size();
  check(n <= kMaxAbsPosition - s.o.capacity, "open_context " + dir, std::to_string(n) + " tokens",
        "<= 2^53 - the session's capacity");
  s.new_caches(std::move(caches));
  for (int64_t i = 0; i < int64_t(s.searches.size()); ++i) s.searches[size_t(i)]->open(layer_file(dir, i, "search"));
  s.o.capacity += n;  // the capacity given counts the tokens after the context (a memory allocates none ahead)
  const MemoryKvCache& c0 = s.memory_caches.front();
  s.last_position = c0.window_positions()[c0.window_size() - 1];
  s.memory_stats.memory_tokens = c0.memory().size();
}

int64_t Session::next_position() const { return impl_->started() ? impl_->last_position + 1 : 0; }

Session::Session(std::shared_ptr<const Model> model, const SessionOptions& options)
    : impl_(std::make_unique<Impl>(std::move(model), options)) {}
Session::~Session() = default;
Session::Session(Session&&) noexcept = default;

void Session::forward(const int64_t* tokens, const int64_t* positions, int64_t n, float* hidden) {
  impl_->forward(tokens, positions, n, hidden);
}

void Session::logits(const float* hidden, int64_t n, float* out) const { impl_->model->logits(hidden, n, out, impl_->threads); }

int64_t Session::size() const { return impl_->size(); }
int64_t Session::capacity() const { return impl_->o.capacity; }
const SessionOptions& Session::options() const { return impl_->o; }
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
  impl_->passed = 0;
}

int64_t Session::bytes_needed(const Model& model, const SessionOptions& o, int64_t prompt_tokens) {
  const Architecture& a = model.arch();
  const int64_t rotary = o.positions.rope.rotary_dim > 0 ? o.positions.rope.rotary_dim : a.head_dim;
  const int64_t row = 2 * round_up(rotary / 2, kPad) + round_up(a.head_dim - rotary, kPad);
  const int64_t copies = o.positions.mode == PositionMode::LeakyRerope ? 4 : 2;  // keys, values (+ far copies)
  const int64_t es = int64_t(dtype_size(o.kv_dtype));
  const int64_t n = std::max<int64_t>(prompt_tokens, 1), hq = a.n_heads * a.head_dim, hkv = a.n_kv_heads * a.head_dim;
  int64_t cache = 0;
  if (o.keep_caches && !o.memory) {  // the core's count for the caches new_caches() makes
    const RopeFreqs freqs = o.positions.rope.freqs(o.capacity);
    KvCacheConfig c;
    c.capacity = o.capacity, c.kv_heads = a.n_kv_heads, c.head_dim = int(a.head_dim), c.dtype = o.kv_dtype;
    c.storage = o.kv_storage;
    c.pos.mode = o.positions.mode, c.pos.freqs = &freqs, c.pos.window = o.positions.window;
    c.pos.leaky_k = o.positions.leaky_k, c.pos.logn_train_len = o.positions.logn_train_len;
    cache = a.n_layers * kv_cache_bytes(c);
  }
  if (o.memory) {
    // Per layer: the window's cache (2W rows, f32) and its un-rotated rows, the memory's keys, values and
    // positions for every token; and the chunk buffers (window + chunk rows).
    const int64_t w2 = 2 * std::max<int64_t>(o.memory->window, 1);
    const int64_t chunk = o.memory->chunk_tokens();
    const int64_t ms = int64_t(dtype_size(o.memory->storage));
    cache = a.n_layers * (copies * a.n_kv_heads * w2 * row * 4 + w2 * (2 * hkv * 4 + 8) +
                          o.capacity * (2 * hkv * ms + 8));
    cache += ((w2 + chunk) * 2 * hkv + 2 * chunk * a.n_heads) * 4;  // keys, values; lse and the memory's share
    if (o.memory->search) {  // per kv head: the rows' order (8 B each) and, per node (~2 per page), its box and links
      const int64_t nodes = std::max<int64_t>(1, 2 * o.capacity / o.memory->search->page_size);
      cache += a.n_layers * a.n_kv_heads * (8 * o.capacity + nodes * (2 * a.head_dim * 4 + 32));
    }
    if (o.memory->search_factory && o.memory->search_bytes)
      cache += a.n_layers * a.n_kv_heads * o.memory->search_bytes(o.capacity, a.head_dim);
    if (o.memory->search || o.memory->search_factory)
      cache += 8 * chunk * a.n_heads * int64_t(o.memory->top_k);  // candidates
  }
  // The residual stream and one layer's keys and values for every token; the rest for one chunk (grow()).
  const int64_t chunk = std::min(n, layer_chunk(o));
  int64_t scratch = 4 * (n * (a.d_model + 2 * hkv) +
                         chunk * (2 * a.d_model + 2 * hq + (a.fused_qkv ? 3 * hq : 0) + 2 * a.d_ff));
  if (o.kv_dtype != DType::F32) scratch += es * (2 * chunk * hq + 2 * n * hkv);
  // The fused attention's own scratch for a chunk: its queries and every key before them in padded float32 rows,
  // twice for ReRoPE's far copies (attention.h: O(tokens x heads x head_dim)).
  const int64_t dp = round_up(a.head_dim, 16);
  scratch += 4 * 2 * (chunk * a.n_heads * dp + 2 * n * a.n_kv_heads * dp);
  // bf16 / q8 activations: linear_forward's converted copy of the largest input of one call (one chunk's): bf16
  // 2 bytes an element; q8 its quants, the int8 kernel's corrections and scale pairs (a byte an element each, padded
  // to 64) and a scale per 32.
  const int64_t widest = std::max({a.d_model, hq, a.d_ff});
  if (model.activations() == ActivationFormat::BF16) scratch += 2 * chunk * widest;
  if (model.activations() == ActivationFormat::Q8) scratch += chunk * (3 * (widest + 64) + (widest / 32 + 1) * 4);
  return cache + scratch;
}

}  // namespace rotary::engine
