// core/src/decode_params.cpp: validate_decode_params - what attention_decode and the baseline accept (the view,
// position and threads rules are validate.h's).
#include <cmath>
#include <string>

#include "rotary/error.h"
#include "rotary/kv_cache.h"
#include "validate.h"

namespace rotary {

void validate_decode_params(std::span<const KvCache* const> caches, const DecodeParams& p) {
  check(!caches.empty(), "caches.size()", 0, ">= 1 (one KvCache per sequence)");
  for (size_t b = 0; b < caches.size(); ++b) {
    const std::string name = "caches[" + std::to_string(b) + "]";
    check(caches[b] != nullptr, name, "null", "a KvCache");
    const KvCache& c = *caches[b];
    check(c.size() >= 1, name + ".size()", c.size(), ">= 1 (append the new token's k and v before decoding it)");
    if (b == 0) continue;
    check(c.dtype() == caches[0]->dtype(), name + ".dtype()", dtype_name(c.dtype()),
          std::string("the dtype of caches[0] = ") + dtype_name(caches[0]->dtype()));
    check(c.storage() == caches[0]->storage(), name + ".storage()", kv_storage_name(c.storage()),
          std::string("the storage of caches[0] = ") + kv_storage_name(caches[0]->storage()));
    check(c.head_dim() == caches[0]->head_dim(), name + ".head_dim()", c.head_dim(),
          "the head_dim of caches[0] = " + std::to_string(caches[0]->head_dim()));
    check(c.kv_heads() == caches[0]->kv_heads(), name + ".kv_heads()", c.kv_heads(),
          "the kv_heads of caches[0] = " + std::to_string(caches[0]->kv_heads()));
  }
  const KvCache& c0 = *caches[0];
  const int64_t B = int64_t(caches.size()), Hkv = c0.kv_heads();
  if (!(p.q.heads >= 1 && p.q.heads % Hkv == 0))
    fail("q.heads", to_text(p.q.heads),
         "a positive multiple of the caches' kv_heads = " + std::to_string(Hkv) + " (MHA, GQA or MQA)");
  detail::check_view(p.q, "q", B, c0.head_dim());
  detail::check_view(p.o, "o", B, c0.head_dim(), p.q.heads, "q.heads");
  if (p.q_positions)
    for (int64_t b = 0; b < B; ++b)
      check(p.q_positions[b] >= caches[size_t(b)]->last_position(), "q_positions[" + std::to_string(b) + "]",
            p.q_positions[b],
            ">= the last cached position " + std::to_string(caches[size_t(b)]->last_position()) +
                " (the cache holds the keys the query may see)");
  check(std::isfinite(p.softmax_scale) && p.softmax_scale >= 0, "softmax_scale", p.softmax_scale,
        "a finite value > 0, or 0 for 1/sqrt(head_dim)");
  detail::check_threads(p.threads);
  check(p.split_keys >= 0, "split_keys", p.split_keys, ">= 0 (0: automatic)");
}

}  // namespace rotary
