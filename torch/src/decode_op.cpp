// torch.classes.rotary.KvCache: a thin holder of rotary::KvCache + attention_decode (core/include/rotary/kv_cache.h).
// The binding only converts tensors to core views and validates shapes; the core validates everything else and
// throws rotary::Error naming the field.
#include "rotary_torch/decode.h"

#include "rotary/error.h"
#include "rotary/kv_cache.h"
#include "rotary_torch/convert.h"

namespace rotary::torch_ops {
namespace {

at::ScalarType parse_dtype(const std::string& d) {
  if (d == "float32") return at::kFloat;
  if (d == "float64") return at::kDouble;
  if (d == "float16") return at::kHalf;
  if (d == "bfloat16") return at::kBFloat16;
  fail("dtype", d, "float32, float64, float16, bfloat16");
}

void check_dtype(const at::Tensor& t, at::ScalarType want, const char* field) {
  check(t.scalar_type() == want, std::string(field) + ".dtype", c10::toString(t.scalar_type()),
        std::string("the cache's dtype ") + c10::toString(want));
}

}  // namespace

KvCacheHolder::KvCacheHolder(int64_t capacity, int64_t kv_heads, int64_t head_dim, const std::string& dtype,
                             const AttentionPosition& pos)
    : dtype_(parse_dtype(dtype)) {
  // Range-checked here, before the narrowing to the core's int (a head dim of 2^32 + 64 must not become 64).
  check(head_dim >= 1 && head_dim <= 4096, "head_dim", head_dim, "1..4096");
  KvCacheConfig& c = config_;
  c.capacity = capacity;
  c.kv_heads = kv_heads;
  c.head_dim = int(head_dim);
  c.dtype = core_dtype(at::empty({0}, dtype_), "dtype");
  c.pos.mode = position_mode_from_name(pos.mode);
  if (c.pos.mode != PositionMode::None) {
    check(pos.inv_freq.has_value(), "inv_freq", "none", "a [rotary_dim/2] tensor when mode is not none");
    freqs_ = freqs_from(*pos.inv_freq, pos.attention_factor, pos.layout, head_dim);
    c.pos.freqs = &freqs_;
  }
  c.pos.roper = pos.roper;
  c.pos.window = pos.window;
  c.pos.leaky_k = pos.leaky_k;
  c.pos.logn_train_len = pos.logn_train_len;
  cache_ = std::make_unique<KvCache>(c);
}

KvCacheHolder::KvCacheHolder(int64_t capacity, int64_t kv_heads, int64_t head_dim, const std::string& dtype,
                             const std::string& mode, const std::optional<at::Tensor>& inv_freq,
                             double attention_factor, const std::string& layout, bool roper, int64_t window,
                             double leaky_k, int64_t logn_train_len)
    : KvCacheHolder(capacity, kv_heads, head_dim, dtype,
                    AttentionPosition{mode, inv_freq, attention_factor, layout, roper, window, leaky_k,
                                      logn_train_len}) {}

KvCacheHolder::~KvCacheHolder() = default;

void KvCacheHolder::append(const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions) {
  check(k.dim() == 3 && v.sizes() == k.sizes(), "k.shape", k.sizes(), "[n, kv_heads, head_dim], v shaped alike");
  // The core's views carry no row width: rows wider or narrower than the cache's would be read wrongly.
  if (k.size(2) != cache_->head_dim())
    fail("k.shape[2]", to_text(k.size(2)), "the cache's head_dim = " + std::to_string(cache_->head_dim()));
  check_dtype(k, dtype_, "k");
  check_dtype(v, dtype_, "v");
  check(positions.scalar_type() == at::kLong && positions.numel() == k.size(0), "positions", positions.sizes(),
        "int64 [n] with n = k.shape[0] = " + std::to_string(k.size(0)));
  const at::Tensor k3 = as_tokens_heads_dim(k, "k"), v3 = as_tokens_heads_dim(v, "v");
  const at::Tensor pos = positions.contiguous();
  cache_->append(k3.size(0), heads_view(k3), heads_view(v3), pos.data_ptr<int64_t>());
}

at::Tensor KvCacheHolder::decode(const at::Tensor& q, std::optional<int64_t> q_position, double softmax_scale) const {
  check(q.dim() == 2, "q.dim()", q.dim(), "2 ([Hq, head_dim], one token)");
  if (q.size(1) != cache_->head_dim())
    fail("q.shape[1]", to_text(q.size(1)), "the cache's head_dim = " + std::to_string(cache_->head_dim()));
  check_dtype(q, dtype_, "q");
  const at::Tensor q3 = as_tokens_heads_dim(q.unsqueeze(0), "q");
  at::Tensor out = at::empty_like(q3, at::MemoryFormat::Contiguous);
  DecodeParams p;
  p.q = heads_view(q3);
  p.o = heads_view(out);
  int64_t qp = q_position.value_or(0);
  if (q_position) p.q_positions = &qp;
  p.softmax_scale = softmax_scale;
  attention_decode(*cache_, p);
  return out.view(q.sizes());
}

int64_t KvCacheHolder::size() const { return cache_->size(); }
int64_t KvCacheHolder::capacity() const { return cache_->capacity(); }
void KvCacheHolder::clear() { cache_->clear(); }
void KvCacheHolder::save(const std::string& path, int64_t fingerprint) const {
  cache_->save(path, uint64_t(fingerprint));
}
void KvCacheHolder::load(const std::string& path, int64_t fingerprint) {
  *cache_ = KvCache::open(path, config_, uint64_t(fingerprint));
}

}  // namespace rotary::torch_ops

// Every argument named, as the ops' schemas name theirs (Python callers may pass them by keyword; docs/python.md
// lists the schemas).
TORCH_LIBRARY_FRAGMENT(rotary, m) {
  using rotary::torch_ops::KvCacheHolder;
  using torch::arg;
  m.class_<KvCacheHolder>("KvCache")
      .def(torch::init([](int64_t capacity, int64_t kv_heads, int64_t head_dim, std::string dtype, std::string mode,
                          c10::optional<at::Tensor> inv_freq, double attention_factor, std::string layout, bool roper,
                          int64_t window, double leaky_k, int64_t logn_train_len) {
        return c10::make_intrusive<KvCacheHolder>(
            capacity, kv_heads, head_dim, dtype, mode,
            inv_freq ? std::optional<at::Tensor>(*inv_freq) : std::optional<at::Tensor>(), attention_factor, layout,
            roper, window, leaky_k, logn_train_len);
      }),
           "", {arg("capacity"), arg("kv_heads"), arg("head_dim"), arg("dtype"), arg("mode"), arg("inv_freq"),
                arg("attention_factor"), arg("layout"), arg("roper"), arg("window"), arg("leaky_k"),
                arg("logn_train_len")})
      .def("append", &KvCacheHolder::append, "", {arg("k"), arg("v"), arg("positions")})
      .def(
          "decode",
          [](const c10::intrusive_ptr<KvCacheHolder>& self, const at::Tensor& q, c10::optional<int64_t> q_position,
             double softmax_scale) {
            return self->decode(q, q_position ? std::optional<int64_t>(*q_position) : std::nullopt, softmax_scale);
          },
          "", {arg("q"), arg("q_position"), arg("softmax_scale")})
      .def("size", &KvCacheHolder::size)
      .def("capacity", &KvCacheHolder::capacity)
      .def("clear", &KvCacheHolder::clear)
      .def("save", &KvCacheHolder::save, "", {arg("path"), arg("fingerprint") = int64_t(0)})
      .def("load", &KvCacheHolder::load, "", {arg("path"), arg("fingerprint") = int64_t(0)});
}
