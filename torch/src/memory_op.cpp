// torch.classes.rotary.MemoryKvCache: a thin holder of rotary::MemoryKvCache (core/include/rotary/kv_memory.h) - a
// decoder's cache whose tokens past a window move to a retrieval memory, each decode step attending to the window
// exactly and to the top-k of the memory, merged. The binding converts tensors to core views and checks shapes and
// dtypes; the core validates everything else and throws rotary::Error naming the field. fp32 queries, keys and
// values in and out; the memory stores its keys and values in f32, bf16 or f16 (memory_storage). Inference only.
#include <torch/custom_class.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <tuple>

#include "rotary/error.h"
#include "rotary/kv_memory.h"
#include "rotary_torch/convert.h"

namespace rotary::torch_ops {
namespace {

class MemoryKvCacheHolder : public torch::CustomClassHolder {
 public:
  // window: tokens kept exact (at least); policy: exact | rerope | none | unlimiformer; mode: rope | rerope (the window's);
  // rerope_window: the ReRoPE w of a rerope model (0 for rope); memory_storage: f32 | bf16 | f16, the memory's keys
  // and values (the window stays f32); the rest as for KvCache.
  MemoryKvCacheHolder(int64_t window, int64_t kv_heads, int64_t head_dim, const std::string& policy,
                      const std::string& mode, const at::Tensor& inv_freq, double attention_factor,
                      const std::string& layout, int64_t rerope_window, int64_t logn_train_len,
                      const std::string& memory_storage) {
    check(head_dim >= 1 && head_dim <= 4096, "head_dim", head_dim, "1..4096");
    check(mode == "rope" || mode == "rerope", "mode", mode, "rope or rerope");
    MemoryKvCacheConfig c;
    c.window = window;
    c.kv_heads = kv_heads;
    c.head_dim = int(head_dim);
    c.policy = parse_memory_policy(policy);
    c.pos.mode = mode == "rope" ? PositionMode::Rope : PositionMode::Rerope;
    freqs_ = freqs_from(inv_freq, attention_factor, layout, head_dim);
    c.pos.freqs = &freqs_;
    c.pos.window = rerope_window;
    c.pos.logn_train_len = logn_train_len;
    check(memory_storage == "f32" || memory_storage == "bf16" || memory_storage == "f16", "memory_storage",
          memory_storage, "f32, bf16, f16");
    c.memory_storage = parse_dtype(memory_storage);
    cache_ = std::make_unique<MemoryKvCache>(c);
  }

  // k, v [n, Hkv, D] float32 un-rotated; positions [n] int64 increasing past the last one.
  void append(const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions) {
    check(k.dim() == 3 && v.sizes() == k.sizes(), "k.shape", k.sizes(), "[n, kv_heads, head_dim], v shaped alike");
    if (k.size(2) != cache_->config().head_dim)
      fail("k.shape[2]", to_text(k.size(2)), "the cache's head_dim = " + std::to_string(cache_->config().head_dim));
    check(k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat, "k.dtype", c10::toString(k.scalar_type()),
          "float32 (k and v)");
    check(positions.scalar_type() == at::kLong && positions.numel() == k.size(0), "positions", positions.sizes(),
          "int64 [n] with n = k.shape[0] = " + std::to_string(k.size(0)));
    const at::Tensor k3 = as_tokens_heads_dim(k, "k"), v3 = as_tokens_heads_dim(v, "v");
    const at::Tensor pos = positions.contiguous();
    cache_->append(k3.size(0), heads_view(k3), heads_view(v3), pos.data_ptr<int64_t>());
  }

  // q [Hq, D] float32 at q_position -> (out [Hq, D], memory_mass [Hq], retrieved [Hq, top_k] int64, -1 padded).
  std::tuple<at::Tensor, at::Tensor, at::Tensor> decode(const at::Tensor& q, int64_t q_position, int64_t top_k,
                                                         double softmax_scale) const {
    check(q.dim() == 2, "q.dim()", q.dim(), "2 ([Hq, head_dim], one token)");
    if (q.size(1) != cache_->config().head_dim)
      fail("q.shape[1]", to_text(q.size(1)), "the cache's head_dim = " + std::to_string(cache_->config().head_dim));
    check(q.scalar_type() == at::kFloat, "q.dtype", c10::toString(q.scalar_type()), "float32");
    check(top_k >= 0 && top_k <= (int64_t(1) << 20), "top_k", top_k, "0..2^20 (0: the window alone)");
    const at::Tensor q3 = as_tokens_heads_dim(q.unsqueeze(0), "q");
    at::Tensor out = at::empty_like(q3, at::MemoryFormat::Contiguous);
    at::Tensor mass = at::zeros({q.size(0)}, at::kFloat);
    at::Tensor rows = at::full({q.size(0), top_k}, -1, at::kLong);
    MemoryDecodeParams params;
    params.q = heads_view(q3);
    params.q_position = q_position;
    params.o = heads_view(out);
    params.top_k = int(top_k);
    params.softmax_scale = softmax_scale;
    params.memory_mass = mass.data_ptr<float>();
    params.retrieved = rows.data_ptr<int64_t>();
    cache_->decode(params);
    return {out.view(q.sizes()), mass, rows};
  }

  int64_t size() const { return cache_->size(); }
  int64_t window_size() const { return cache_->window_size(); }
  int64_t memory_size() const { return cache_->memory().size(); }
  void save_memory(const std::string& path, int64_t fingerprint) const {
    cache_->memory().save(path, uint64_t(fingerprint));
  }
  // The whole cache (memory and window) to two files, atomically (MemoryKvCache::save), and back: load replaces
  // this cache by the saved one, continued, which must have this one's config (MemoryKvCache::open names the field).
  void save(const std::string& memory_path, const std::string& window_path, int64_t fingerprint) const {
    cache_->save(memory_path, window_path, uint64_t(fingerprint));
  }
  void load(const std::string& memory_path, const std::string& window_path, int64_t fingerprint) {
    const MemoryKvCacheConfig config = cache_->config();  // its freqs point at freqs_, which stays
    cache_ = std::make_unique<MemoryKvCache>(MemoryKvCache::open(config, memory_path, window_path,
                                                                 uint64_t(fingerprint)));
  }

 private:
  RopeFreqs freqs_;
  std::unique_ptr<MemoryKvCache> cache_;
};

}  // namespace
}  // namespace rotary::torch_ops

// Every argument is named (Python callers may pass them by keyword; docs/python.md lists the schemas) and every
// argument added after the first release has a default, so a caller written before it still runs: memory_storage
// came last and defaults to "f32", the storage before it existed.
TORCH_LIBRARY_FRAGMENT(rotary, m) {
  using rotary::torch_ops::MemoryKvCacheHolder;
  using torch::arg;
  m.class_<MemoryKvCacheHolder>("MemoryKvCache")
      .def(torch::init<int64_t, int64_t, int64_t, std::string, std::string, at::Tensor, double, std::string, int64_t,
                       int64_t, std::string>(),
           "", {arg("window"), arg("kv_heads"), arg("head_dim"), arg("policy"), arg("mode"), arg("inv_freq"),
                arg("attention_factor") = 1.0, arg("layout") = "half_split", arg("rerope_window") = 0,
                arg("logn_train_len") = 0, arg("memory_storage") = "f32"})
      .def("append", &MemoryKvCacheHolder::append, "", {arg("k"), arg("v"), arg("positions")})
      .def("decode", &MemoryKvCacheHolder::decode, "",
           {arg("q"), arg("q_position"), arg("top_k"), arg("softmax_scale") = 0.0})
      .def("size", &MemoryKvCacheHolder::size)
      .def("window_size", &MemoryKvCacheHolder::window_size)
      .def("memory_size", &MemoryKvCacheHolder::memory_size)
      .def("save_memory", &MemoryKvCacheHolder::save_memory, "", {arg("path"), arg("fingerprint")})
      .def("save", &MemoryKvCacheHolder::save, "",
           {arg("memory_path"), arg("window_path"), arg("fingerprint") = int64_t(0)})
      .def("load", &MemoryKvCacheHolder::load, "",
           {arg("memory_path"), arg("window_path"), arg("fingerprint") = int64_t(0)});
}
