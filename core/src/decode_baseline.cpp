// core/src/decode_baseline.cpp: attention_decode_rerotate_baseline - the ReRoPE reference implementation's decode
// step (seed 004): every step re-rotates the whole un-rotated key cache by its clipped (or leaky) distance, then
// runs the same planned kernel as attention_decode over the rotated copy, so the two differ only in what the
// seed's algorithm costs. A benchmark baseline (lab/bench/bench_decode.cpp), not for use.
#include <algorithm>
#include <vector>

#include "decode_plan.h"
#include "rotary/angles.h"
#include "rotary/error.h"
#include "rotary/kv_cache.h"
#include "rotate_pair.h"

namespace rotary {

using namespace decode_detail;

void attention_decode_rerotate_baseline(const KvCache& cache, const DecodeParams& p, std::vector<float>& scratch) {
  const KvCache* one[1] = {&cache};
  const std::span<const KvCache* const> caches(one, 1);
  validate_decode_params(caches, p);
  const PositionParams& pp = cache.pos();
  check(cache.dtype() == DType::F32, "cache.dtype()", dtype_name(cache.dtype()), "f32 (the baseline is fp32 only)");
  check(cache.storage() == KvStorage::Dtype, "cache.storage()", kv_storage_name(cache.storage()),
        "dtype (the baseline reads f32 rows)");
  check(pp.mode == PositionMode::Rerope || pp.mode == PositionMode::LeakyRerope, "cache.pos().mode", int(pp.mode),
        "Rerope or LeakyRerope (the baseline re-rotates un-rotated keys)");
  check(!pp.roper, "cache.pos().roper", "true", "false (the baseline has no RoPER)");
  const KvCacheLayout& lay = cache.layout();
  const int64_t n = cache.size(), Hkv = cache.kv_heads(), cap = cache.capacity(), rs = lay.row_stride;
  const int half = lay.half, pairs = pp.freqs->pairs();
  const int64_t q_pos = resolve_q_pos(cache, p, 0), w = pp.window, rows = cache.near_table_rows();
  const int threads = resolve_threads(p);
  scratch.resize(size_t(Hkv * n * rs));
  const float* keys = static_cast<const float*>(cache.keys());
  const float* table = static_cast<const float*>(cache.near_table());
  const int64_t* pos = cache.positions();

  // Step 1 (the seed's): every key of every head turned by its clipped / leaky relative distance.
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> cs(static_cast<size_t>(2 * half), 0.0f);
#pragma omp for schedule(static)
    for (int64_t j = 0; j < n; ++j) {
      const int64_t dist = q_pos - pos[j];
      const float* cr = nullptr;
      if (pp.mode == PositionMode::Rerope || dist < w) {
        const int64_t dd = std::min(dist, w);
        if (dd < rows) {
          cr = table + dd * 2 * half;
        } else {
          rope_cos_sin(pp.freqs->inv_freq.data(), pairs, dd, 1.0, cs.data(), cs.data() + half);
          cr = cs.data();
        }
      } else {
        rope_cos_sin_at(pp.freqs->inv_freq.data(), pairs, double(w) + double(dist - w) / pp.leaky_k, 1.0, cs.data(),
                        cs.data() + half);
        cr = cs.data();
      }
      for (int64_t g = 0; g < Hkv; ++g) {
        const float* src = keys + (g * cap + j) * rs;
        float* dst = scratch.data() + (g * n + j) * rs;
        for (int i = 0; i < half; ++i) {
          const auto [ya, yb] = detail::rotate_pair(src[i], src[half + i], cr[i], -cr[half + i]);  // R(-d)
          dst[i] = ya;
          dst[half + i] = yb;
        }
        for (int64_t i = 2 * half; i < rs; ++i) dst[i] = src[i];
      }
    }
  }

  // Step 2: plain attention over the re-rotated keys.
  std::vector<float> q_plain(static_cast<size_t>(p.q.heads * rs)), q_near(static_cast<size_t>(p.q.heads * rs));
  std::vector<SeqPlan> plans(1);
  SeqPlan& sp = plans[0];
  sp.n = n;
  sp.q_pos = q_pos;
  sp.near_begin = n;
  sp.k_plain = scratch.data();
  sp.k_plain_head = n * rs;
  sp.k_near = cache.keys();
  sp.v_plain = sp.v_near = cache.values();
  prepare_queries(cache, p, 0, q_pos, resolve_scale(p, cache.head_dim()), true, q_plain.data(), q_near.data());
  decode_planned(caches, p, plans, q_plain, q_near, DType::F32, KvStorage::Dtype, threads);
}

}  // namespace rotary
