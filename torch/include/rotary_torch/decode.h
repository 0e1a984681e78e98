// rotary_torch/decode.h: the KV-cache decoder of the core (rotary/kv_cache.h) for torch tensors, registered as the
// custom class torch.classes.rotary.KvCache (torch/src/decode_op.cpp). One cache holds ONE sequence; what it stores
// (rotated keys for rope, un-rotated keys for rerope / leaky_rerope) is the core's business.
#pragma once

#include <torch/custom_class.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>

#include "rotary/kv_cache.h"
#include "rotary_torch/ops.h"

namespace rotary::torch_ops {

class KvCacheHolder : public torch::CustomClassHolder {
 public:
  // dtype: "float32" | "float64" | "float16" | "bfloat16" (the dtype of every k, v, q given later).
  // pos: as for attention() (mode, inv_freq [r/2] float64, attention factor, layout, roper, window, leaky_k, log-n).
  KvCacheHolder(int64_t capacity, int64_t kv_heads, int64_t head_dim, const std::string& dtype,
                const AttentionPosition& pos);
  // The same with the position arguments spelled out (the TorchScript constructor).
  KvCacheHolder(int64_t capacity, int64_t kv_heads, int64_t head_dim, const std::string& dtype, const std::string& mode,
                const std::optional<at::Tensor>& inv_freq, double attention_factor, const std::string& layout,
                bool roper, int64_t window, double leaky_k, int64_t logn_train_len);
  ~KvCacheHolder() override;

  // k, v [n, Hkv, D] (un-rotated, as the projections give them); positions [n] int64, increasing and after the
  // cached ones.
  void append(const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions);
  // One new token: q [Hq, D] (un-rotated) at q_position (none: the last cached position) -> out [Hq, D].
  // softmax_scale 0 means 1/sqrt(D). No autograd: inference only.
  at::Tensor decode(const at::Tensor& q, std::optional<int64_t> q_position, double softmax_scale) const;
  int64_t size() const;
  int64_t capacity() const;
  void clear();
  // The cache to a file, atomically (KvCache::save; docs/decode.md "Saved caches"); fingerprint: the caller's tag
  // of what made the rows, which load must be given back.
  void save(const std::string& path, int64_t fingerprint) const;
  // Replaces this cache by the one saved at path, continued: its tokens and room for this cache's capacity more.
  // The file must come from a cache of this one's kv_heads, head_dim, dtype and position params (KvCache::open
  // names the field that differs).
  void load(const std::string& path, int64_t fingerprint);

 private:
  RopeFreqs freqs_;      // what config_.pos.freqs points at
  KvCacheConfig config_;  // as constructed: load's expectation
  std::unique_ptr<KvCache> cache_;
  at::ScalarType dtype_;
};

}  // namespace rotary::torch_ops
