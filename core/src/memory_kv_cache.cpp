// core/src/memory_kv_cache.cpp: MemoryKvCache (rotary/kv_memory.h) - a KvCache window with a KvMemory behind it.
// Apart from the memory (kv_memory.cpp, kv_memory_file.cpp, memory_attention*.cpp) so that the memory and its file
// reader build without the decode kernels (the fuzz target of the memory file links those alone,
// fuzz/CMakeLists.txt).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rotary/attention.h"
#include "rotary/error.h"
#include "rotary/kv_cache.h"
#include "rotary/kv_memory.h"
#include "validate.h"

namespace rotary {

struct MemoryKvCache::Impl {
  MemoryKvCacheConfig config;
  RopeFreqs freqs;
  std::unique_ptr<KvCache> window;  // capacity 2W
  std::unique_ptr<KvMemory> memory;
  std::vector<float> k_rows, v_rows;  // the window's tokens un-rotated, [rows, Hkv, D]
  std::vector<int64_t> pos_rows;
  int64_t query_origin = -1;  // policy Unlimiformer: the position of the first query that retrieved (-1: none yet)

  int64_t row_elems() const { return config.kv_heads * config.head_dim; }
  // Rows of x from `first` as an append's input (HeadsView's pointer is not const; append only reads it).
  HeadsView rows_view(const std::vector<float>& x, int64_t first) const {
    return {const_cast<float*>(x.data()) + first * row_elems(), config.kv_heads, row_elems(), config.head_dim};
  }
};

MemoryKvCache::MemoryKvCache(const MemoryKvCacheConfig& c) : impl_(std::make_unique<Impl>()) {
  check(c.window >= 1 && c.window <= (int64_t(1) << 30), "memory_kv_cache.window", c.window, "1..2^30");
  check(!c.pos.roper, "memory_kv_cache.pos.roper", "true", "false (the memory keeps values as given)");
  const bool windowed = c.pos.mode == PositionMode::Rerope || c.pos.mode == PositionMode::LeakyRerope;
  check(c.policy != MemoryPolicy::Rerope || !windowed || c.window >= c.pos.window,
        "memory_kv_cache.window", c.window,
        ">= the ReRoPE window " + std::to_string(c.pos.window) + " (memory keys must all be past it)");
  Impl& m = *impl_;
  m.config = c;
  if (c.pos.freqs) m.freqs = *c.pos.freqs, m.config.pos.freqs = &m.freqs;
  KvCacheConfig wc;
  wc.capacity = 2 * c.window;
  wc.kv_heads = c.kv_heads;
  wc.head_dim = c.head_dim;
  wc.dtype = DType::F32;
  wc.pos = m.config.pos;
  m.window = std::make_unique<KvCache>(wc);
  KvMemoryConfig mc;
  mc.kv_heads = c.kv_heads;
  mc.head_dim = c.head_dim;
  mc.policy = c.policy;
  mc.freqs = c.pos.freqs ? &m.freqs : nullptr;
  // Policy rerope: memory keys at the model's ReRoPE window, or for a RoPE model at the local window (InfLLM).
  mc.window = c.pos.window > 0 ? c.pos.window : c.window;
  mc.logn_train_len = c.pos.logn_train_len;
  mc.storage = c.memory_storage;  // (checked by KvMemory, naming kv_memory.storage)
  m.memory = std::make_unique<KvMemory>(mc);
}

namespace {

// The memory file layout of a cache's window rows: un-rotated keys and values as appended, f32, policy none.
KvMemoryConfig window_file_config(const MemoryKvCacheConfig& c) {
  KvMemoryConfig w;
  w.kv_heads = c.kv_heads, w.head_dim = c.head_dim, w.policy = MemoryPolicy::NoRotation, w.storage = DType::F32;
  return w;
}

}  // namespace

void MemoryKvCache::save(const std::string& memory_path, const std::string& window_path, uint64_t fingerprint) const {
  const Impl& m = *impl_;
  check(m.config.policy != MemoryPolicy::Unlimiformer, "memory_kv_cache.policy", "unlimiformer",
        "exact, rerope or none to save (the query origin of unlimiformer is not kept)");
  check(memory_path != window_path, "memory_kv_cache.save window_path", window_path,
        "another file than memory_path");
  KvMemory window(window_file_config(m.config));
  const int64_t rows = int64_t(m.pos_rows.size());
  window.append(rows, m.rows_view(m.k_rows, 0), m.rows_view(m.v_rows, 0), m.pos_rows.data());
  m.memory->save(memory_path, fingerprint);
  window.save(window_path, fingerprint);
}

MemoryKvCache MemoryKvCache::open(const MemoryKvCacheConfig& config, const std::string& memory_path,
                                  const std::string& window_path, uint64_t fingerprint) {
  MemoryKvCache cache(config);  // validates the config
  Impl& m = *cache.impl_;
  check(config.policy != MemoryPolicy::Unlimiformer, "memory_kv_cache.policy", "unlimiformer",
        "exact, rerope or none to open a saved cache (the query origin of unlimiformer is not kept)");
  KvMemory memory = KvMemory::read(memory_path, m.memory->config(), fingerprint);
  const KvMemory window = KvMemory::open(window_path, window_file_config(config), fingerprint);
  const int64_t rows = window.size(), W = config.window;
  auto damaged = [&](const std::string& what, int64_t value, const std::string& allowed) {
    return Error("memory_kv_cache.open: " + window_path + ": " + what + " = " + std::to_string(value) +
                 " is invalid; allowed: " + allowed + " (the window file of another cache, or damaged)");
  };
  if (rows >= 2 * W) throw damaged("window rows", rows, "< 2 x window = " + std::to_string(2 * W));
  if (memory.size() > 0 && rows < W)
    throw damaged("window rows", rows, ">= window = " + std::to_string(W) + " behind a memory of " +
                                           std::to_string(memory.size()) + " rows");
  if (memory.size() > 0 && rows > 0 && window.positions()[0] <= memory.positions()[memory.size() - 1])
    throw damaged("window position[0]", window.positions()[0],
                  "> the memory's last position " + std::to_string(memory.positions()[memory.size() - 1]));
  *m.memory = std::move(memory);
  if (rows > 0) {  // positions and views checked by append, as any rows
    const int64_t D = config.head_dim;
    std::vector<float> k(size_t(rows * config.kv_heads * D)), v(k.size());
    for (int64_t h = 0; h < config.kv_heads; ++h)
      for (int64_t t = 0; t < rows; ++t) {
        std::copy_n(window.keys(h) + t * D, D, k.data() + (t * config.kv_heads + h) * D);
        std::copy_n(window.values(h) + t * D, D, v.data() + (t * config.kv_heads + h) * D);
      }
    cache.append(rows, m.rows_view(k, 0), m.rows_view(v, 0), window.positions());
  }
  return cache;
}

MemoryKvCache::~MemoryKvCache() = default;
MemoryKvCache::MemoryKvCache(MemoryKvCache&&) noexcept = default;
MemoryKvCache& MemoryKvCache::operator=(MemoryKvCache&&) noexcept = default;

void MemoryKvCache::append(int64_t n, const HeadsView& k, const HeadsView& v, const int64_t* positions) {
  Impl& m = *impl_;
  const MemoryKvCacheConfig& c = m.config;
  check(n >= 0, "memory_kv_cache.append n", n, ">= 0");
  if (n == 0) return;
  detail::check_view(k, "memory_kv_cache.append k", n, c.head_dim, c.kv_heads, "the cache's kv_heads");
  detail::check_view(v, "memory_kv_cache.append v", n, c.head_dim, c.kv_heads, "the cache's kv_heads");
  check(positions != nullptr, "memory_kv_cache.append positions", "null", "[n] positions");
  const int64_t* last = m.pos_rows.empty() ? nullptr : &m.pos_rows.back();
  if (!last && m.memory->size() > 0) last = m.memory->positions() + m.memory->size() - 1;
  detail::check_positions(positions, 0, n, "memory_kv_cache.append ", c.pos.logn_train_len > 1, true, last);
  const int64_t old = int64_t(m.pos_rows.size()), D = c.head_dim;
  m.k_rows.resize(size_t((old + n) * m.row_elems()));
  m.v_rows.resize(m.k_rows.size());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < c.kv_heads; ++h) {
      float* kd = m.k_rows.data() + (old + t) * m.row_elems() + h * D;
      float* vd = m.v_rows.data() + (old + t) * m.row_elems() + h * D;
      std::copy_n(static_cast<const float*>(k.data) + t * k.token_stride + h * k.head_stride, D, kd);
      std::copy_n(static_cast<const float*>(v.data) + t * v.token_stride + h * v.head_stride, D, vd);
    }
  m.pos_rows.insert(m.pos_rows.end(), positions, positions + n);
  const int64_t rows = old + n;
  if (rows < 2 * c.window) {
    m.window->append(n, m.rows_view(m.k_rows, old), m.rows_view(m.v_rows, old), m.pos_rows.data() + old);
    return;
  }
  // The oldest rows - all but the newest W - move to the memory; the window is rebuilt from the rest.
  const int64_t move = rows - c.window;
  m.memory->append(move, m.rows_view(m.k_rows, 0), m.rows_view(m.v_rows, 0), m.pos_rows.data());
  m.k_rows.erase(m.k_rows.begin(), m.k_rows.begin() + std::ptrdiff_t(move * m.row_elems()));
  m.v_rows.erase(m.v_rows.begin(), m.v_rows.begin() + std::ptrdiff_t(move * m.row_elems()));
  m.pos_rows.erase(m.pos_rows.begin(), m.pos_rows.begin() + std::ptrdiff_t(move));
  m.window->clear();
  m.window->append(c.window, m.rows_view(m.k_rows, 0), m.rows_view(m.v_rows, 0), m.pos_rows.data());
}

void MemoryKvCache::decode(const MemoryDecodeParams& d) const {
  const Impl& m = *impl_;
  check(m.window->size() > 0, "memory_kv_cache size", 0, "> 0 (append before decoding)");
  check(d.top_k >= 0, "memory_kv_cache.decode top_k", d.top_k, ">= 0 (0: the window alone)");
  const int64_t Hq = d.q.heads;
  std::vector<float> lse(size_t(std::max<int64_t>(Hq, 1)));
  DecodeParams p;
  p.q = d.q;
  p.o = d.o;
  p.lse = lse.data();
  p.q_positions = &d.q_position;
  p.softmax_scale = d.softmax_scale;
  p.threads = d.threads;
  attention_decode(*m.window, p);  // validates q, o, the position and the head counts
  const int k = int(std::min<int64_t>(d.top_k, m.memory->size()));
  if (d.memory_mass) std::fill_n(d.memory_mass, Hq, 0.f);
  if (d.retrieved) std::fill_n(d.retrieved, Hq * d.top_k, int64_t(-1));
  if (k == 0) return;
  std::vector<int64_t> rows(size_t(Hq * k));
  MemoryAttentionParams mp;
  mp.query_origin = query_origin(d.q_position);
  mp.tokens = 1;
  mp.q = d.q;
  mp.q_positions = &d.q_position;
  mp.top_k = k;
  mp.softmax_scale = d.softmax_scale;
  mp.o = d.o;
  mp.lse = lse.data();
  mp.retrieved = rows.data();
  mp.memory_mass = d.memory_mass;
  mp.threads = d.threads;
  mp.candidates = d.candidates;
  memory_attention(*m.memory, mp);
  if (d.retrieved)
    for (int64_t h = 0; h < Hq; ++h) std::copy_n(rows.data() + h * k, k, d.retrieved + h * d.top_k);
}

int64_t MemoryKvCache::query_origin(int64_t position) const {
  if (impl_->query_origin < 0) impl_->query_origin = position;
  return impl_->query_origin;
}
int64_t MemoryKvCache::window_size() const { return impl_->window->size(); }
const float* MemoryKvCache::window_keys() const { return impl_->k_rows.data(); }
const float* MemoryKvCache::window_values() const { return impl_->v_rows.data(); }
const int64_t* MemoryKvCache::window_positions() const { return impl_->pos_rows.data(); }
const KvMemory& MemoryKvCache::memory() const { return *impl_->memory; }
int64_t MemoryKvCache::size() const { return impl_->window->size() + impl_->memory->size(); }
const MemoryKvCacheConfig& MemoryKvCache::config() const { return impl_->config; }

}  // namespace rotary
