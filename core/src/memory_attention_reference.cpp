// core/src/memory_attention_reference.cpp: the float64 oracle of memory attention (rotary/kv_memory.h), written
// apart from the fast path (memory_attention.cpp) and from the memory's search query (kv_memory.cpp): its own
// rotation, its own logits from the policy table of kv_memory.h, a full sort for the top-k, its own softmax and
// merge. An oracle that shared the fast path's code would share its mistakes. It reads the memory only through
// its public accessors (the stored keys, values, positions and config) and shares the fast path's checks
// (validate_memory_attention), not its arithmetic.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "rotary/kv_memory.h"

namespace rotary {
namespace {

// R(angle position) x on the rotary pairs of f (pair i at f.inv_freq[i]), in double; features past rotary_dim
// unchanged.
std::vector<double> rotated(const RopeFreqs& f, double position, const std::vector<double>& x) {
  std::vector<double> y = x;
  for (int i = 0; i < f.rotary_dim / 2; ++i) {
    const RopePair p = rope_pair(f.layout, f.rotary_dim, i);
    const double t = position * f.inv_freq[size_t(i)];
    y[size_t(p.a)] = x[size_t(p.a)] * std::cos(t) - x[size_t(p.b)] * std::sin(t);
    y[size_t(p.b)] = x[size_t(p.a)] * std::sin(t) + x[size_t(p.b)] * std::cos(t);
  }
  return y;
}

// sum_d x_d y_d with the rotary pairs' terms times `pair_weight` (the attention factor's power the policy puts on
// them) and the rest times 1.
double weighted_dot(const RopeFreqs* f, int D, const std::vector<double>& x, const std::vector<double>& y,
                    double pair_weight) {
  const int r = f ? f->rotary_dim : 0;
  double rot = 0, pass = 0;
  for (int d = 0; d < D; ++d) {
    (d < r ? rot : pass) += x[size_t(d)] * y[size_t(d)];  // both layouts pair up the first rotary_dim features
  }
  return pair_weight * rot + pass;
}

struct Reference {
  const KvMemory& m;
  const MemoryAttentionParams& p;
  const KvMemoryConfig& c = m.config();
  const RopeFreqs* f = c.freqs;
  const int D = m.head_dim();

  std::vector<double> row(const float* x) const { return std::vector<double>(x, x + D); }
  // Row j of a stored block (keys or values) in double, whatever the memory's storage dtype.
  std::vector<double> stored_row(const void* base, int64_t j) const {
    std::vector<double> r(static_cast<size_t>(D));
    for (int d = 0; d < D; ++d) r[size_t(d)] = load_as_double(base, m.storage(), j * D + d);
    return r;
  }

  // lambda: softmax scale times log-n's max(1, ln(pos + 1) / ln L).
  double lambda(int64_t pos) const {
    const double scale = p.softmax_scale > 0 ? p.softmax_scale : 1.0 / std::sqrt(double(D));
    if (c.logn_train_len <= 1) return scale;
    return scale * std::max(1.0, std::log(double(pos) + 1.0) / std::log(double(c.logn_train_len)));
  }

  // The query side of the search score (kv_memory.h's table): the vector the stored keys are dotted with, and the
  // factor on the rotary pairs' terms (the stored keys carry the rest: a R(pos_j) for exact, nothing otherwise).
  struct SearchQuery {
    std::vector<double> q;
    double pair_weight = 1;
  };
  SearchQuery search_query(const std::vector<double>& q, int64_t pos) const {
    const double a = f ? f->attention_factor : 1.0;
    switch (c.policy) {
      case MemoryPolicy::Exact: return {rotated(*f, double(pos), q), a};
      case MemoryPolicy::Rerope: return {rotated(*f, double(c.window), q), a * a};
      case MemoryPolicy::NoRotation: return {q, a * a};
      case MemoryPolicy::Unlimiformer: return {rotated(*f, double(pos - p.query_origin), q), a * a};
    }
    return {q, 1};
  }

  // The search score of a stored key. Unlimiformer: q'^T (I + P) k with P (k_a, k_b) -> (-k_b, k_a) on every pair.
  double search_score(const SearchQuery& s, int64_t pos, std::vector<double> k) const {
    if (c.policy == MemoryPolicy::Unlimiformer) {
      const std::vector<double> plain = k;
      for (int i = 0; i < f->rotary_dim / 2; ++i) {
        const RopePair pr = rope_pair(f->layout, f->rotary_dim, i);
        k[size_t(pr.a)] = plain[size_t(pr.a)] - plain[size_t(pr.b)];
        k[size_t(pr.b)] = plain[size_t(pr.b)] + plain[size_t(pr.a)];
      }
    }
    return lambda(pos) * weighted_dot(f, D, s.q, k, s.pair_weight);
  }

  // Unlimiformer's attended logit: lambda a^2 (R(m') q)^T (R(n') k) over the pairs, lambda q^T k past them.
  double unlimiformer_logit(const std::vector<double>& q, int64_t pos, const std::vector<double>& stored,
                            int64_t key_pos, int64_t earliest) const {
    const double a = f->attention_factor;
    return lambda(pos) * weighted_dot(f, D, rotated(*f, double(pos - p.query_origin), q),
                                      rotated(*f, double(key_pos - earliest), stored), a * a);
  }

  void attend(int64_t t, int64_t h) const {
    const int64_t kvh = h / (p.q.heads / m.kv_heads()), pos = p.q_positions[t];
    const std::vector<double> q =
        row(static_cast<const float*>(p.q.data) + t * p.q.token_stride + h * p.q.head_stride);
    const void* K = m.key_data(kvh);
    const void* V = m.value_data(kvh);
    const int64_t slot = t * p.q.heads + h;
    // The rows to rank: every row, or the index's candidates without the -1 fillers.
    std::vector<int64_t> rows;
    if (p.candidates) {
      for (int64_t i = 0; i < p.top_k; ++i)
        if (p.candidates[slot * p.top_k + i] >= 0) rows.push_back(p.candidates[slot * p.top_k + i]);
    } else {
      rows.resize(size_t(m.size()));
      std::iota(rows.begin(), rows.end(), int64_t(0));
    }
    const SearchQuery sq = search_query(q, pos);
    std::vector<double> score(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) score[i] = search_score(sq, pos, stored_row(K, rows[i]));
    // A full sort of every row by score, descending, the earlier row first on ties; the first top_k are retrieved.
    std::vector<size_t> order(rows.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      return score[x] != score[y] ? score[x] > score[y] : rows[x] < rows[y];
    });
    const size_t k = std::min(rows.size(), size_t(p.top_k));
    std::vector<int64_t> got(k);
    std::vector<double> logit(k);
    for (size_t i = 0; i < k; ++i) got[i] = rows[order[i]], logit[i] = score[order[i]];
    if (c.policy == MemoryPolicy::Unlimiformer && k > 0) {
      int64_t earliest = m.positions()[got[0]];
      for (int64_t j : got) earliest = std::min(earliest, m.positions()[j]);
      for (size_t i = 0; i < k; ++i)
        logit[i] = unlimiformer_logit(q, pos, stored_row(K, got[i]), m.positions()[got[i]], earliest);
    }
    for (int64_t i = 0; i < p.top_k; ++i) {
      if (p.retrieved) p.retrieved[slot * p.top_k + i] = size_t(i) < k ? got[size_t(i)] : -1;
      if (p.retrieved_scores)
        p.retrieved_scores[slot * p.top_k + i] =
            size_t(i) < k ? float(logit[size_t(i)]) : -std::numeric_limits<float>::infinity();
    }
    if (k == 0) {  // nothing retrieved: the window's output and log-sum-exp stay
      if (p.memory_mass) p.memory_mass[slot] = 0.0f;
      return;
    }
    // Softmax over the retrieved rows and the window's one, as log-sum-exp of all the exponentials.
    const double lse_local = double(p.lse[slot]);
    double top = *std::max_element(logit.begin(), logit.end());
    if (lse_local > top) top = lse_local;  // -inf (no local keys) never is
    double local = lse_local == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(lse_local - top);
    double memory = 0;
    std::vector<double> mem_o(size_t(D), 0.0);
    for (size_t i = 0; i < k; ++i) {
      const double w = std::exp(logit[i] - top);
      memory += w;
      const std::vector<double> v = stored_row(V, got[i]);
      for (int d = 0; d < D; ++d) mem_o[size_t(d)] += w * v[size_t(d)];
    }
    const double total = local + memory;
    float* o = static_cast<float*>(p.o.data) + t * p.o.token_stride + h * p.o.head_stride;
    for (int d = 0; d < D; ++d) o[d] = float((local * double(o[d]) + mem_o[size_t(d)]) / total);
    p.lse[slot] = float(top + std::log(total));
    if (p.memory_mass) p.memory_mass[slot] = float(memory / total);
  }
};

}  // namespace

void memory_attention_reference(const KvMemory& m, const MemoryAttentionParams& p) {
  validate_memory_attention(m, p);
  const Reference ref{m, p};
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t h = 0; h < p.q.heads; ++h) ref.attend(t, h);
}

}  // namespace rotary
