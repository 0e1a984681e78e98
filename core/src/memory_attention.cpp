// core/src/memory_attention.cpp: memory attention (rotary/kv_memory.h) - the checks of MemoryAttentionParams, and
// the fast path: exact top-k over the whole memory (or over an index's candidates) in fp32, softmax over the rows
// retrieved, merged into the local window's output by log-sum-exp. Its float64 oracle, written apart:
// memory_attention_reference.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "rotary/error.h"
#include "rotary/kv_memory.h"
#include "storage.h"
#include "validate.h"

namespace rotary {

void validate_memory_attention(const KvMemory& m, const MemoryAttentionParams& p) {
  check(p.tokens >= 0, "memory_attention.tokens", p.tokens, ">= 0");
  check(m.size() > 0, "memory_attention memory size", m.size(), "> 0 (append before attending)");
  check(p.top_k >= 1 && p.top_k <= m.size(), "memory_attention.top_k", p.top_k,
        "1..the memory size " + std::to_string(m.size()));
  check(p.q.heads >= 1 && p.q.heads % m.kv_heads() == 0, "memory_attention.q.heads", p.q.heads,
        "a multiple of the memory's kv_heads = " + std::to_string(m.kv_heads()));
  detail::check_view(p.q, "memory_attention.q", p.tokens, m.head_dim());
  detail::check_view(p.o, "memory_attention.o", p.tokens, m.head_dim(), p.q.heads, "q.heads");
  check(p.q_positions != nullptr || p.tokens == 0, "memory_attention.q_positions", "null", "[tokens] positions");
  check(p.lse != nullptr || p.tokens == 0, "memory_attention.lse", "null", "[tokens, Hq] local log-sum-exp");
  if (p.tokens > 0)
    detail::check_positions(p.q_positions, 0, p.tokens, "memory_attention.q_", m.config().logn_train_len > 1, false);
  check(std::isfinite(p.softmax_scale) && p.softmax_scale >= 0, "memory_attention.softmax_scale", p.softmax_scale,
        ">= 0 (0: 1/sqrt(D))");
  for (int64_t t = 0; t < p.tokens; ++t)
    check(p.query_origin <= p.q_positions[t], "memory_attention.query_origin", p.query_origin,
          "<= every query position (q_positions[" + std::to_string(t) + "] = " + std::to_string(p.q_positions[t]) +
              ")");
  detail::check_threads(p.threads);
  if (p.candidates) {
    const int64_t k = p.top_k, n = m.size();
    for (int64_t i = 0; i < p.tokens * p.q.heads * k; ++i)
      check(p.candidates[i] >= -1 && p.candidates[i] < n, "memory_attention.candidates[" + std::to_string(i) + "]",
            p.candidates[i], "a memory row in [0, " + std::to_string(n) + ") or -1 (none)");
  }
}

namespace {

// One (token, head) of memory attention in fp32: scores of every row, top-k (score descending, row ascending on
// ties), softmax over them, merged into o / lse.
void attend_one(const KvMemory& m, const MemoryAttentionParams& p, int64_t t, int64_t h) {
  using W = float;
  const int D = m.head_dim();
  const int64_t N = m.size(), group = p.q.heads / m.kv_heads(), kvh = h / group;
  const float* q = static_cast<const float*>(p.q.data) + t * p.q.token_stride + h * p.q.head_stride;
  std::vector<W> sq(static_cast<size_t>(D));
  m.search_query(q, p.q_positions[t], p.softmax_scale, sq.data(), p.query_origin);
  // Rows of a half-precision memory are widened to fp32 one at a time (f32 ones are read in place).
  const DType storage = m.storage();
  const void* K = m.key_data(kvh);
  const void* V = m.value_data(kvh);
  std::vector<float> widened(storage == DType::F32 ? 0 : size_t(D));
  auto row_of = [&](const void* base, int64_t j) { return detail::f32_row(base, storage, j * D, D, widened.data()); };
  auto score = [&](int64_t j) {
    W s = 0;
    // Half precision widened inside the loop (dtype.h's branch-free conversions), which vectorises: the scan's
    // hot path.
    if (storage == DType::BF16) {
      const uint16_t* kr = static_cast<const uint16_t*>(K) + j * D;
#pragma omp simd reduction(+ : s)
      for (int d = 0; d < D; ++d) s += sq[size_t(d)] * W(bf16_to_float(kr[d]));
      return s;
    }
    if (storage == DType::F16) {
      const uint16_t* kr = static_cast<const uint16_t*>(K) + j * D;
#pragma omp simd reduction(+ : s)
      for (int d = 0; d < D; ++d) s += sq[size_t(d)] * W(f16_to_float(kr[d]));
      return s;
    }
    const float* kr = row_of(K, j);
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < D; ++d) s += sq[size_t(d)] * W(kr[d]);
    return s;
  };
  std::vector<std::pair<W, int64_t>> scored;
  size_t k = size_t(p.top_k);
  if (p.candidates) {  // rows an index found: scored exactly, the -1 fillers dropped
    const int64_t* c = p.candidates + (t * p.q.heads + h) * int64_t(k);
    for (size_t i = 0; i < k; ++i)
      if (c[i] >= 0) scored.push_back({score(c[i]), c[i]});
    k = scored.size();
  } else {
    scored.resize(static_cast<size_t>(N));
    for (int64_t j = 0; j < N; ++j) scored[size_t(j)] = {score(j), j};
  }
  auto better = [](const std::pair<W, int64_t>& a, const std::pair<W, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const int64_t base = (t * p.q.heads + h) * int64_t(p.top_k);
  auto report = [&] {  // the rows retrieved, best first, and their logits; -1 / -inf past the k there are
    for (size_t i = 0; i < size_t(p.top_k); ++i) {
      if (p.retrieved) p.retrieved[base + int64_t(i)] = i < k ? scored[i].second : -1;
      if (p.retrieved_scores)
        p.retrieved_scores[base + int64_t(i)] =
            i < k ? float(scored[i].first) : -std::numeric_limits<float>::infinity();
    }
  };
  if (k == 0) {  // an index found nothing for this head: it attends to the window alone (o, lse as they came)
    if (p.memory_mass) p.memory_mass[t * p.q.heads + h] = 0.0f;
    report();
    return;
  }
  if (p.candidates) {
    std::stable_sort(scored.begin(), scored.end(), better);
  } else {
    std::nth_element(scored.begin(), scored.begin() + std::ptrdiff_t(k - 1), scored.end(), better);
    std::sort(scored.begin(), scored.begin() + std::ptrdiff_t(k), better);
  }
  if (m.config().policy == MemoryPolicy::Unlimiformer) {
    // Retrieved by the approximate score, attended with Unlimiformer's re-rotated logits (kv_memory.h). The rows
    // keep their retrieval order; retrieved_scores report the logits attended with.
    int64_t earliest = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i < k; ++i) earliest = std::min(earliest, m.positions()[scored[i].second]);
    for (size_t i = 0; i < k; ++i)
      scored[i].first = W(m.row_logit(q, p.q_positions[t], kvh, scored[i].second, p.softmax_scale, p.query_origin,
                                       earliest));
  }
  W mx = scored[0].first;
  for (size_t i = 1; i < k; ++i) mx = std::max(mx, scored[i].first);
  W sum = 0;
  std::vector<W> acc(static_cast<size_t>(D), W(0));
  for (size_t i = 0; i < k; ++i) {
    const W e = std::exp(scored[i].first - mx);
    sum += e;
    const float* vr = row_of(V, scored[i].second);
    for (int d = 0; d < D; ++d) acc[size_t(d)] += e * W(vr[d]);
  }
  const W lse_mem = mx + std::log(sum);
  float* o = static_cast<float*>(p.o.data) + t * p.o.token_stride + h * p.o.head_stride;
  float& lse = p.lse[t * p.q.heads + h];
  const W lse_local = W(lse);
  const W merged = std::isinf(lse_local) && lse_local < 0
                       ? lse_mem
                       : std::max(lse_local, lse_mem) + std::log1p(std::exp(-std::abs(lse_local - lse_mem)));
  const W w_local = std::isinf(lse_local) && lse_local < 0 ? W(0) : std::exp(lse_local - merged);
  const W w_mem = std::exp(lse_mem - merged);
  for (int d = 0; d < D; ++d) o[d] = float(w_local * W(o[d]) + w_mem * acc[size_t(d)] / sum);
  lse = float(merged);
  if (p.memory_mass) p.memory_mass[t * p.q.heads + h] = float(w_mem);
  report();
}

}  // namespace

void memory_attention(const KvMemory& m, const MemoryAttentionParams& p) {
  validate_memory_attention(m, p);
  const int64_t tasks = p.tokens * p.q.heads;
  const int threads = p.threads > 0 ? p.threads : omp_get_max_threads();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (tasks > 1)
  for (int64_t i = 0; i < tasks; ++i) attend_one(m, p, i / p.q.heads, i % p.q.heads);
}

}  // namespace rotary
