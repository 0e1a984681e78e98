// core/src/decode.cpp: attention_decode - the decode step over KvCaches: query preparation (rotations, scale and
// log-n folded into the query), split-K planning (flash-decoding), and the combine step. The kernel of one task
// is decode_chunk_hwy.cpp; validation decode_params.cpp; the seed's re-rotating baseline decode_baseline.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "decode_chunk.h"
#include "decode_plan.h"
#include "rotary/kv_cache.h"
#include "rotate_pair.h"

namespace rotary::decode_detail {
namespace {

int pairs_of(const KvCache& c) { return c.pos().mode == PositionMode::None ? 0 : c.pos().freqs->pairs(); }

// cos and sin (times `scale`) of angle pos * inv_freq[i] for every rotary pair of the cache, in float64.
struct Turn {
  std::vector<double> c, s;
  Turn(const KvCache& cache, double pos, double scale) {
    const int n = pairs_of(cache);
    for (int i = 0; i < n; ++i) {
      const double ang = pos * cache.pos().freqs->inv_freq[size_t(i)];
      c.push_back(std::cos(ang) * scale);
      s.push_back(std::sin(ang) * scale);
    }
  }
};

// Writes x (caller's feature order, length D) as a cache-layout row y (row_stride, pads zero), the rotary pairs
// turned by t.
template <class C>
void to_row(const KvCache& cache, const double* x, const Turn& t, C* y) {
  const KvCacheLayout& lay = cache.layout();
  const int D = cache.head_dim(), n = pairs_of(cache), r = 2 * n;
  std::fill(y, y + lay.row_stride, C(0));
  for (int i = 0; i < n; ++i) {
    const auto [fa, fb] = rope_pair(cache.pos().freqs->layout, r, i);
    const auto [ya, yb] = detail::rotate_pair(x[fa], x[fb], t.c[size_t(i)], t.s[size_t(i)]);
    y[i] = C(ya);
    y[lay.half + i] = C(yb);
  }
  for (int f = r; f < D; ++f) y[2 * lay.half + f - r] = C(x[f]);
}

// The rotation RoPER applies to the plain-key sum (as an angle in positions; NaN: none).
double roper_plain_angle(const KvCache& c, int64_t q_pos) {
  const PositionParams& pp = c.pos();
  if (!pp.roper) return std::nan("");
  const double w = double(pp.window);
  switch (pp.mode) {
    case PositionMode::Rope: return -double(q_pos);  // values stored R(pos_j) v_j
    case PositionMode::Rerope: return -w;            // far values v_j, distance clipped at w
    case PositionMode::LeakyRerope: return w / pp.leaky_k - w - double(q_pos) / pp.leaky_k;  // R(pos_j/k) v_j
    default: return std::nan("");
  }
}

int64_t auto_chunks(int64_t n, int64_t tasks_without_split, int threads) {
  const int64_t want = (4 * int64_t(threads) + tasks_without_split - 1) / tasks_without_split;
  return std::max<int64_t>(1, std::min(want, n / 1024));
}

}  // namespace

template <class C>
void prepare_queries(const KvCache& cache, const DecodeParams& p, int64_t b, int64_t q_pos, double scale, bool baseline,
                     C* plain, C* near) {
  const PositionParams& pp = cache.pos();
  const int D = cache.head_dim();
  const int64_t rs = cache.layout().row_stride, Hq = p.q.heads;
  double c = scale;
  if (pp.logn_train_len > 1) c *= std::max(1.0, std::log(double(q_pos) + 1) / std::log(double(pp.logn_train_len)));
  const double a = pp.freqs ? pp.freqs->attention_factor : 1.0, w = double(pp.window);
  const bool clipped = pp.mode == PositionMode::Rerope || pp.mode == PositionMode::LeakyRerope;
  // The plain keys' query turn: Rope R(pos_i) (factor a, keys carry the other a); Rerope R(w) (a^2, keys bare);
  // Leaky R((pos_i - w)/k + w) (a, the far copy carries the other a); the baseline's keys are turned already.
  double angle = 0, factor = 1;
  if (pp.mode == PositionMode::Rope) angle = double(q_pos), factor = a;
  if (pp.mode == PositionMode::Rerope) angle = baseline ? 0.0 : w, factor = a * a;
  if (pp.mode == PositionMode::LeakyRerope)
    angle = baseline ? 0.0 : double(q_pos - pp.window) / pp.leaky_k + w, factor = baseline ? a * a : a;
  const Turn plain_turn(cache, angle, factor), near_turn(cache, 0.0, a * a);
  std::vector<double> x(static_cast<size_t>(D));
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t off = b * p.q.token_stride + h * p.q.head_stride;
    for (int f = 0; f < D; ++f) x[size_t(f)] = c * load_as_double(p.q.data, cache.dtype(), off + f);
    to_row(cache, x.data(), plain_turn, plain + h * rs);
    if (clipped) to_row(cache, x.data(), near_turn, near + h * rs);
  }
}

template <class C>
void decode_planned(std::span<const KvCache* const> caches, const DecodeParams& p, std::vector<SeqPlan>& plans,
                    const std::vector<C>& q_plain, const std::vector<C>& q_near, DType key_type,
                    KvStorage key_storage, int threads) {
  const KvCache& c0 = *caches[0];
  const int64_t B = int64_t(caches.size()), Hkv = c0.kv_heads(), Hq = p.q.heads, G = Hq / Hkv;
  const int D = c0.head_dim();
  const KvCacheLayout& lay = c0.layout();
  const int64_t rs = lay.row_stride;
  const bool q8 = key_storage == KvStorage::Q8;
  const size_t elt = q8 ? 1 : dtype_size(c0.dtype()), key_elt = q8 ? 1 : dtype_size(key_type);

  int64_t tasks = 0;
  for (int64_t b = 0; b < B; ++b) {
    SeqPlan& sp = plans[size_t(b)];
    sp.chunks = p.split_keys > 0 ? (sp.n + p.split_keys - 1) / p.split_keys : auto_chunks(sp.n, B * Hkv, threads);
    sp.first_task = tasks;
    tasks += Hkv * sp.chunks;
  }
  // Per task: m [G], l [G], acc [G, rs], acc_near [G, rs].
  std::vector<C> part_m(static_cast<size_t>(tasks * G)), part_l(static_cast<size_t>(tasks * G)),
      part_acc(static_cast<size_t>(tasks * 2 * G * rs));

#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t t = 0; t < tasks; ++t) {
    int64_t b = 0;
    while (b + 1 < B && plans[size_t(b + 1)].first_task <= t) ++b;
    const SeqPlan& sp = plans[size_t(b)];
    const KvCache& cache = *caches[size_t(b)];
    const int64_t g = (t - sp.first_task) / sp.chunks, ci = (t - sp.first_task) % sp.chunks;
    const size_t head = size_t(g * cache.capacity() * rs) * elt;
    auto at = [](const void* base, size_t bytes) { return static_cast<const uint8_t*>(base) + bytes; };
    ChunkArgs a;
    a.k_plain = at(sp.k_plain, size_t(g * sp.k_plain_head) * key_elt);
    a.k_near = at(sp.k_near, head);
    a.v_plain = at(sp.v_plain, head);
    a.v_near = at(sp.v_near, head);
    if (q8) {  // a head's scales: its rows' elements / kQ8Block
      const int64_t head_scales = g * cache.capacity() * rs / kQ8Block;
      a.k_plain_scales = sp.k_plain_scales + g * sp.k_plain_head / kQ8Block;
      a.k_near_scales = sp.k_near_scales + head_scales;
      a.v_plain_scales = sp.v_plain_scales + head_scales;
      a.v_near_scales = sp.v_near_scales + head_scales;
    }
    a.pos = cache.positions();
    a.begin = sp.n * ci / sp.chunks;
    a.end = sp.n * (ci + 1) / sp.chunks;
    a.near_begin = sp.near_begin;
    a.q_pos = sp.q_pos;
    a.q_plain = q_plain.data() + (b * Hq + g * G) * rs;
    a.q_near = q_near.data() + (b * Hq + g * G) * rs;
    a.groups = int(G);
    a.row_stride = rs;
    a.half = lay.half;
    a.pairs = pairs_of(cache);
    a.table = cache.near_table();
    a.table_rows = cache.near_table_rows();
    a.inv_freq = a.pairs ? cache.pos().freqs->inv_freq.data() : nullptr;
    a.rotate_near_values = sp.rotate_near_values;
    a.m = part_m.data() + t * G;
    a.l = part_l.data() + t * G;
    a.acc = part_acc.data() + t * 2 * G * rs;
    a.acc_near = sp.rotate_near_values ? part_acc.data() + (t * 2 + 1) * G * rs : a.acc;
    run_chunk(key_type, key_storage, a);
  }

  std::vector<Turn> roper_turns;  // per sequence: RoPER's turn of the plain-key sum
  for (int64_t b = 0; b < B; ++b) {
    const double angle = roper_plain_angle(*caches[size_t(b)], plans[size_t(b)].q_pos);
    roper_turns.emplace_back(*caches[size_t(b)], std::isnan(angle) ? 0.0 : angle, 1.0);
  }

  // Combine the chunks of each (sequence, query head): rescale to the common max, sum, turn (RoPER), normalise.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t bh = 0; bh < B * Hq; ++bh) {
    const int64_t b = bh / Hq, h = bh % Hq, g = h / G, hh = h % G;
    const SeqPlan& sp = plans[size_t(b)];
    const KvCache& cache = *caches[size_t(b)];
    auto task = [&](int64_t ci) { return sp.first_task + g * sp.chunks + ci; };
    double M = -std::numeric_limits<double>::infinity(), Lsum = 0;
    for (int64_t ci = 0; ci < sp.chunks; ++ci) M = std::max(M, double(part_m[size_t(task(ci) * G + hh)]));
    std::vector<double> plain(static_cast<size_t>(rs), 0.0), near(static_cast<size_t>(rs), 0.0);
    for (int64_t ci = 0; ci < sp.chunks; ++ci) {
      const int64_t t = task(ci);
      const double w = std::exp(double(part_m[size_t(t * G + hh)]) - M);
      Lsum += w * double(part_l[size_t(t * G + hh)]);
      const C* ac = part_acc.data() + (t * 2 * G + hh) * rs;
      for (int64_t i = 0; i < rs; ++i) plain[size_t(i)] += w * double(ac[i]);
      if (sp.rotate_near_values) {
        const C* an = part_acc.data() + ((t * 2 + 1) * G + hh) * rs;
        for (int64_t i = 0; i < rs; ++i) near[size_t(i)] += w * double(an[i]);
      }
    }
    const int n = pairs_of(cache), half = lay.half, r = 2 * n;
    if (cache.pos().roper)
      for (int i = 0; i < n; ++i) {
        const Turn& t = roper_turns[size_t(b)];
        const auto [ya, yb] = detail::rotate_pair(plain[size_t(i)], plain[size_t(half + i)], t.c[size_t(i)],
                                                  t.s[size_t(i)]);
        plain[size_t(i)] = ya;
        plain[size_t(half + i)] = yb;
      }
    std::vector<double> out(static_cast<size_t>(D));  // back to the caller's feature order
    for (int i = 0; i < n; ++i) {
      const auto [fa, fb] = rope_pair(cache.pos().freqs->layout, r, i);
      out[size_t(fa)] = (plain[size_t(i)] + near[size_t(i)]) / Lsum;
      out[size_t(fb)] = (plain[size_t(half + i)] + near[size_t(half + i)]) / Lsum;
    }
    for (int f = r; f < D; ++f)
      out[size_t(f)] = (plain[size_t(2 * half + f - r)] + near[size_t(2 * half + f - r)]) / Lsum;
    const int64_t off = b * p.o.token_stride + h * p.o.head_stride;
    for (int i = 0; i < D; ++i) store_from_double(p.o.data, cache.dtype(), off + i, out[size_t(i)]);
    if (p.lse) {
      const double lse = M + std::log(Lsum);
      if (cache.dtype() == DType::F64)
        static_cast<double*>(p.lse)[bh] = lse;
      else
        static_cast<float*>(p.lse)[bh] = float(lse);
    }
  }
}

int resolve_threads(const DecodeParams& p) { return p.threads > 0 ? p.threads : omp_get_max_threads(); }
double resolve_scale(const DecodeParams& p, int D) {
  return p.softmax_scale > 0 ? p.softmax_scale : 1.0 / std::sqrt(double(D));
}
int64_t resolve_q_pos(const KvCache& c, const DecodeParams& p, int64_t b) {
  return p.q_positions ? p.q_positions[b] : c.last_position();
}

template void prepare_queries<float>(const KvCache&, const DecodeParams&, int64_t, int64_t, double, bool, float*,
                                      float*);
template void prepare_queries<double>(const KvCache&, const DecodeParams&, int64_t, int64_t, double, bool, double*,
                                       double*);
template void decode_planned<float>(std::span<const KvCache* const>, const DecodeParams&, std::vector<SeqPlan>&,
                                    const std::vector<float>&, const std::vector<float>&, DType, KvStorage, int);
template void decode_planned<double>(std::span<const KvCache* const>, const DecodeParams&, std::vector<SeqPlan>&,
                                     const std::vector<double>&, const std::vector<double>&, DType, KvStorage,
                                     int);

}  // namespace rotary::decode_detail

namespace rotary {
namespace {

using namespace decode_detail;

template <class C>
void decode_fast(std::span<const KvCache* const> caches, const DecodeParams& p) {
  const KvCache& c0 = *caches[0];
  const int64_t B = int64_t(caches.size()), Hq = p.q.heads, rs = c0.layout().row_stride;
  std::vector<C> q_plain(static_cast<size_t>(B * Hq * rs)), q_near(static_cast<size_t>(B * Hq * rs));
  std::vector<SeqPlan> plans(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const KvCache& c = *caches[size_t(b)];
    SeqPlan& sp = plans[size_t(b)];
    const PositionMode mode = c.pos().mode;
    const bool clipped = mode == PositionMode::Rerope || mode == PositionMode::LeakyRerope;
    sp.n = c.size();
    sp.q_pos = resolve_q_pos(c, p, b);
    sp.near_begin = sp.n;
    if (clipped)  // the first key with q_pos - pos_j < w
      sp.near_begin = std::upper_bound(c.positions(), c.positions() + sp.n, sp.q_pos - c.pos().window) - c.positions();
    sp.k_plain = mode == PositionMode::LeakyRerope ? c.keys_far() : c.keys();
    sp.k_plain_head = c.capacity() * rs;
    sp.k_near = c.keys();
    sp.v_plain = c.values_far() ? c.values_far() : c.values();
    sp.v_near = c.values();
    sp.k_plain_scales = mode == PositionMode::LeakyRerope ? c.key_far_scales() : c.key_scales();
    sp.k_near_scales = c.key_scales();
    sp.v_plain_scales = c.values_far() ? c.value_far_scales() : c.value_scales();
    sp.v_near_scales = c.value_scales();
    sp.rotate_near_values = clipped && c.pos().roper;
    prepare_queries(c, p, b, sp.q_pos, resolve_scale(p, c.head_dim()), false, q_plain.data() + b * Hq * rs,
                    q_near.data() + b * Hq * rs);
  }
  decode_planned(caches, p, plans, q_plain, q_near, c0.dtype(), c0.storage(), resolve_threads(p));
}

}  // namespace

void attention_decode(std::span<const KvCache* const> caches, const DecodeParams& p) {
  validate_decode_params(caches, p);
  if (caches[0]->dtype() == DType::F64)
    decode_fast<double>(caches, p);
  else
    decode_fast<float>(caches, p);
}

}  // namespace rotary
