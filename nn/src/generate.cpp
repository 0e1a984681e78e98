// generate(): prefill the prompt with the full attention, then one token at a time against per-layer caches.
//
// Which cache a layer gets:
//   fused softmax, every kind but alibi and t5 -> the core decoder (torch.classes.rotary.KvCache): rope/roper keep
//     rotated keys; rerope/leaky keep UN-rotated keys and per step rotate only the keys inside the window, scoring
//     the far ones against R(w) q (core/include/rotary/kv_cache.h).
//   plain softmax, and alibi and t5 (the core decoder has no score bias; their prefill runs fused) -> un-rotated
//     keys and values in torch tensors; each step runs the plain attention of the one new query over all of them
//     (for rerope: the seed's re-rotation of the whole cache).
//   fused linear / performer -> the running sums S = sum R(n) phi(k_n) v_n^T, z = sum phi(k_n) (performer:
//     phi(R(n) k_n) in both; O(1) per step; the prefill runs the fused op, whose core kernel keeps these sums
//     internally but does not return them);
//   plain linear / performer -> keys and values in torch, the materialised form per step.
//   with a memory (generate_with_memory) -> the core's MemoryKvCache: a window of exact keys and a retrieval
//     memory behind it (rotary/kv_memory.h); every token, the prompt's too, goes through it one at a time.
// Dynamic NTK / longrope frequencies change with the length: when they do, the caches are rebuilt from the
// un-rotated keys and values (kept for that case only), so a cached step equals a full forward at that length.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "rotary/error.h"
#include "rotary/kv_memory.h"
#include "rotary_nn/attention.h"
#include "rotary_nn/model.h"
#include "rotary_torch/convert.h"
#include "rotary_torch/decode.h"

namespace rotary::nn {
namespace {

// One layer's cache of one sequence. k, v [1, n, Hkv, D] un-rotated at positions [1, n]; q [1, 1, Hq, D].
class LayerCache {
 public:
  virtual ~LayerCache() = default;
  virtual void append(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& positions) = 0;
  // The new token's k, v are already appended; q_position [1, 1]. -> [1, 1, Hq, D]
  virtual torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& q_position) = 0;
};

class CoreCache final : public LayerCache {
 public:
  CoreCache(int64_t capacity, int64_t kv_heads, int64_t head_dim, torch::ScalarType dtype, const PositionContext& pc)
      : scale_(pc.softmax_scale) {
    const torch_ops::AttentionPosition ap = fused_attention_position(pc);
    const std::string name = dtype == torch::kDouble ? "float64" : dtype == torch::kFloat ? "float32"
                             : dtype == torch::kHalf ? "float16" : "bfloat16";
    cache_ = c10::make_intrusive<torch_ops::KvCacheHolder>(capacity, kv_heads, head_dim, name, ap);
  }
  void append(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& positions) override {
    cache_->append(k[0], v[0], positions[0]);
  }
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& q_position) override {
    return cache_->decode(q[0][0], q_position.item<int64_t>(), scale_).view(q.sizes());
  }

 private:
  c10::intrusive_ptr<torch_ops::KvCacheHolder> cache_;
  double scale_;
};

class PlainCache final : public LayerCache {
 public:
  PlainCache(const PositionContext& pc, AttentionKind attention, torch::Tensor projection)
      : pc_(pc), attention_(attention), projection_(std::move(projection)) {}
  void append(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& positions) override {
    k_ = k_.defined() ? torch::cat({k_, k}, 1) : k;
    v_ = v_.defined() ? torch::cat({v_, v}, 1) : v;
    pos_ = pos_.defined() ? torch::cat({pos_, positions}, 1) : positions;
  }
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& q_position) override {
    if (attention_ == AttentionKind::Softmax) return softmax_attention_plain(q, k_, v_, q_position, pos_, pc_);
    return linear_attention_plain(q, k_, v_, q_position, pos_, pc_, attention_, projection_);
  }

 private:
  PositionContext pc_;
  AttentionKind attention_;
  torch::Tensor projection_;
  torch::Tensor k_, v_, pos_;  // [1, L, Hkv, D], [1, L, Hkv, D], [1, L]
};

// Linear attention's running sums (kinds linear and performer): S = sum_n num(k_n) v_n^T, z = sum_n den(k_n) with
// the features of linear_features, and o = num(q)^T S / den(q) . z.
class LinearStateCache final : public LayerCache {
 public:
  LinearStateCache(const PositionContext& pc, AttentionKind attention, torch::Tensor projection)
      : pc_(pc), attention_(attention), projection_(std::move(projection)) {}
  void append(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& positions) override {
    const LinearFeatures f = linear_features(k, positions, pc_, attention_, projection_, /*query=*/false);
    const torch::Tensor s = torch::einsum("nhd,nhe->hde", {f.num[0], v[0]}), z = f.den[0].sum(0);
    state_ = state_.defined() ? state_ + s : s;  // [Hkv, F, Dv]
    z_ = z_.defined() ? z_ + z : z;              // [Hkv, F]
  }
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& q_position) override {
    const int64_t Hq = q.size(2), Hkv = z_.size(0), F = z_.size(1);
    const LinearFeatures f = linear_features(q, q_position, pc_, attention_, projection_, /*query=*/true);
    const torch::Tensor num = torch::einsum("hgd,hde->hge", {f.num.view({Hkv, Hq / Hkv, F}), state_});
    const torch::Tensor den = torch::einsum("hgd,hd->hg", {f.den.view({Hkv, Hq / Hkv, F}), z_}).unsqueeze(-1);
    return (num / den).reshape({1, 1, Hq, -1});
  }

 private:
  PositionContext pc_;
  AttentionKind attention_;
  torch::Tensor projection_;
  torch::Tensor state_, z_;
};

// A window of exact keys with a retrieval memory behind it (the core's MemoryKvCache), fp32. `retrieve` says
// whether this step searches the memory; the share of the softmax mass on retrieved keys is summed into `stats`.
class MemoryCache final : public LayerCache {
 public:
  MemoryCache(const MemoryDecodeOptions& o, int layer, int64_t kv_heads, int64_t head_dim, const PositionContext& pc,
              const bool& retrieve, MemoryDecodeStats& stats)
      : top_k_(o.top_k), layer_(layer), on_retrieve_(o.on_retrieve), search_(o.search), scale_(pc.softmax_scale),
        retrieve_(retrieve), stats_(stats) {
    const torch_ops::AttentionPosition ap = fused_attention_position(pc);
    check(!ap.roper, "encoding.kind", "roper", "rope, rerope or leaky_rerope (decoding with a memory)");
    MemoryKvCacheConfig c;
    c.window = o.window;
    c.kv_heads = kv_heads;
    c.head_dim = int(head_dim);
    c.policy = o.policy;
    freqs_ = torch_ops::freqs_from(ap.inv_freq.value(), ap.attention_factor, ap.layout, head_dim);
    c.pos.mode = ap.mode == "rope" ? PositionMode::Rope
                 : ap.mode == "rerope" ? PositionMode::Rerope : PositionMode::LeakyRerope;
    c.pos.freqs = &freqs_;
    c.pos.window = ap.window;
    c.pos.leaky_k = ap.leaky_k;
    c.pos.logn_train_len = ap.logn_train_len;
    cache_ = std::make_unique<MemoryKvCache>(c);
    if (o.reference_policy) {
      c.policy = *o.reference_policy;
      reference_ = std::make_unique<MemoryKvCache>(c);
    }
  }
  void append(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& positions) override {
    const torch::Tensor k3 = k[0].to(torch::kFloat).contiguous(), v3 = v[0].to(torch::kFloat).contiguous();
    const torch::Tensor pos = positions[0].contiguous();
    cache_->append(k3.size(0), torch_ops::heads_view(k3), torch_ops::heads_view(v3), pos.data_ptr<int64_t>());
    if (reference_)
      reference_->append(k3.size(0), torch_ops::heads_view(k3), torch_ops::heads_view(v3), pos.data_ptr<int64_t>());
  }
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& q_position) override {
    const torch::Tensor q2 = q[0][0].to(torch::kFloat).contiguous();  // [Hq, D]
    const int64_t Hq = q2.size(0);
    torch::Tensor out = torch::empty_like(q2);
    std::vector<float> mass(static_cast<size_t>(Hq));
    const int k = retrieve_ ? top_k_ : 0;
    const int64_t pos = q_position.item<int64_t>();
    // The rows attended, for the reference comparison and on_retrieve only.
    std::vector<int64_t> got(reference_ || on_retrieve_ ? static_cast<size_t>(Hq * std::max(k, 1)) : 0);
    std::vector<int64_t> candidates;  // from `search`: [Hq, min(k, memory size)]
    if (k > 0 && search_ && cache_->memory().size() > 0) {
      const MemoryStep step = step_of(q2, pos, k);
      candidates.assign(static_cast<size_t>(Hq * step.top_k), -1);
      search_(step, candidates.data());
    }
    MemoryDecodeParams params = decode_params(q2, out, pos, k);
    params.memory_mass = mass.data();
    params.retrieved = got.empty() ? nullptr : got.data();
    params.candidates = candidates.empty() ? nullptr : candidates.data();
    cache_->decode(params);
    if (k > 0 && reference_ && cache_->memory().size() > 0) compare(q2, pos, k, got);
    if (k > 0 && on_retrieve_ && cache_->memory().size() > 0) probe(q2, pos, k, got);
    if (k > 0 && cache_->memory().size() > 0) {
      double sum = 0;
      for (float m : mass) sum += m;
      stats_.memory_mass += sum / double(Hq);
      ++stats_.retrieving_steps;
    }
    stats_.memory_tokens = cache_->memory().size();
    return out.to(q.scalar_type()).view(q.sizes());
  }
  // A chunk of n tokens: q [1, n, Hq, D], k, v [1, n, Hkv, D] at positions [1, n]. The chunk attends to the window
  // and to itself (causal) in one fused call - the window's rows enter as keys with zero queries whose outputs are
  // dropped - then, when retrieving, to the memory's top-k, merged; then the chunk is appended. -> [1, n, Hq, D]
  torch::Tensor prefill(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& positions, const PositionContext& pc) {
    const auto f32 = torch::kFloat;
    const int64_t w = cache_->window_size(), n = q.size(1), Hq = q.size(2), Hkv = k.size(2), D = q.size(3);
    torch::Tensor q_cat = q[0].to(f32), k_cat = k[0].to(f32), v_cat = v[0].to(f32), pos_cat = positions[0];
    if (w > 0) {
      auto rows = [&](const float* p) {
        return torch::from_blob(const_cast<float*>(p), {w, Hkv, D}, f32).clone();
      };
      k_cat = torch::cat({rows(cache_->window_keys()), k_cat}, 0);
      v_cat = torch::cat({rows(cache_->window_values()), v_cat}, 0);
      q_cat = torch::cat({torch::zeros({w, Hq, D}, f32), q_cat}, 0);
      pos_cat = torch::cat(
          {torch::from_blob(const_cast<int64_t*>(cache_->window_positions()), {w}, torch::kLong).clone(), pos_cat}, 0);
    }
    auto [out_all, lse_all] = torch_ops::attention(q_cat, k_cat, v_cat, pos_cat, std::nullopt, true, scale_,
                                                   fused_attention_position(pc));
    torch::Tensor out = out_all.narrow(0, w, n).contiguous(), lse = lse_all.narrow(0, w, n).contiguous();
    const int k_eff = retrieve_ ? int(std::min<int64_t>(top_k_, cache_->memory().size())) : 0;
    if (k_eff > 0) {
      const torch::Tensor qc = q[0].to(f32).contiguous(), pos = positions[0].contiguous();
      std::vector<float> mass(static_cast<size_t>(n * Hq));
      MemoryAttentionParams mp;
      mp.tokens = n;
      mp.q = torch_ops::heads_view(qc);
      mp.q_positions = pos.data_ptr<int64_t>();
      mp.top_k = k_eff;
      mp.query_origin = cache_->query_origin(pos.data_ptr<int64_t>()[0]);
      mp.softmax_scale = scale_;
      mp.o = torch_ops::heads_view(out);
      mp.lse = lse.data_ptr<float>();
      mp.memory_mass = mass.data();
      memory_attention(cache_->memory(), mp);
      for (int64_t t = 0; t < n; ++t) {
        double sum = 0;
        for (int64_t h = 0; h < Hq; ++h) sum += mass[size_t(t * Hq + h)];
        stats_.memory_mass += sum / double(Hq);
        ++stats_.retrieving_steps;
      }
    }
    append(k, v, positions);
    stats_.memory_tokens = cache_->memory().size();
    return out.to(q.scalar_type()).unsqueeze(0);
  }

 private:
  // The reference memory's top-k for the same query, and the logits both policies give the rows `policy` took
  // (Unlimiformer's with its own origins: the query's, and the earliest row it retrieved). q [Hq, D].
  void compare(const torch::Tensor& q, int64_t pos, int k, const std::vector<int64_t>& got) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t Hq = q.size(0), D = q.size(1), group = Hq / cache_->config().kv_heads;
    torch::Tensor scratch = torch::empty_like(q);
    std::vector<int64_t> want(got.size());
    MemoryDecodeParams params = decode_params(q, scratch, pos, k);
    params.retrieved = want.data();
    reference_->decode(params);
    const KvMemory& mem = cache_->memory();
    const KvMemory& ref = reference_->memory();
    const int64_t origin = cache_->config().policy == MemoryPolicy::Unlimiformer ? cache_->query_origin(pos) : 0;
    double overlap = 0, error = 0;
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t* g = got.data() + h * k;
      const int64_t* w = want.data() + h * k;
      const float* qh = q.data_ptr<float>() + h * D;
      // The reference's k-th best logit: a row of `policy` counts as one of the reference's top-k when its reference
      // logit reaches it. (By score, not by row: keys repeat - a layer's first keys are functions of the token - and
      // among equal scores which rows a search keeps is arbitrary.)
      int64_t wanted = 0, found = 0, scored = 0, earliest = std::numeric_limits<int64_t>::max();
      double threshold = std::numeric_limits<double>::infinity();
      for (int i = 0; i < k; ++i)
        if (w[i] >= 0) ++wanted, threshold = std::min(threshold, ref.row_logit(qh, pos, h / group, w[i], scale_));
      for (int i = 0; i < k; ++i)
        if (g[i] >= 0) earliest = std::min(earliest, mem.positions()[g[i]]);
      double err = 0;
      for (int i = 0; i < k; ++i) {
        if (g[i] < 0) continue;
        const double reference_logit = ref.row_logit(qh, pos, h / group, g[i], scale_);
        found += reference_logit >= threshold ? 1 : 0;
        err += std::abs(mem.row_logit(qh, pos, h / group, g[i], scale_, origin, earliest) - reference_logit);
        ++scored;
      }
      overlap += wanted ? double(std::min(found, wanted)) / double(wanted) : 1.0;
      error += scored ? err / double(scored) : 0.0;
    }
    stats_.reference_overlap += overlap / double(Hq);
    stats_.logit_error += error / double(Hq);
    ++stats_.compared_steps;
    stats_.reference_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // A decode step of query q [Hq, D] fp32 contiguous at pos into out (as q), top_k = k; no optional outputs.
  MemoryDecodeParams decode_params(const torch::Tensor& q, torch::Tensor& out, int64_t pos, int k) const {
    const int64_t Hq = q.size(0), D = q.size(1);
    MemoryDecodeParams params;
    params.q = {q.data_ptr<float>(), Hq, Hq * D, D};
    params.q_position = pos;
    params.o = {out.data_ptr<float>(), Hq, Hq * D, D};
    params.top_k = k;
    params.softmax_scale = scale_;
    return params;
  }
  // The step as MemoryDecodeOptions' hooks see it (without the rows attended). q [Hq, D].
  MemoryStep step_of(const torch::Tensor& q, int64_t pos, int k) const {
    MemoryStep step;
    step.layer = layer_;
    step.memory = &cache_->memory();
    step.q = q.data_ptr<float>();
    step.q_heads = q.size(0);
    step.head_dim = q.size(1);
    step.position = pos;
    step.query_origin = cache_->config().policy == MemoryPolicy::Unlimiformer ? cache_->query_origin(pos) : 0;
    step.softmax_scale = scale_;
    step.top_k = int(std::min<int64_t>(k, cache_->memory().size()));
    return step;
  }
  // MemoryDecodeOptions::on_retrieve with this step. `got` holds top_k rows per head, -1 past the memory's size.
  void probe(const torch::Tensor& q, int64_t pos, int k, const std::vector<int64_t>& got) {
    const auto t0 = std::chrono::steady_clock::now();
    MemoryStep step = step_of(q, pos, k);
    std::vector<int64_t> rows(size_t(step.q_heads * step.top_k));
    for (int64_t h = 0; h < step.q_heads; ++h)
      std::copy_n(got.data() + h * k, step.top_k, rows.data() + h * step.top_k);
    step.retrieved = rows.data();
    on_retrieve_(step);
    stats_.probe_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  RopeFreqs freqs_;
  std::unique_ptr<MemoryKvCache> cache_, reference_;  // reference_: with MemoryDecodeOptions::reference_policy
  int top_k_;
  int layer_;
  std::function<void(const MemoryStep&)> on_retrieve_;
  std::function<void(const MemoryStep&, int64_t*)> search_;
  double scale_;
  const bool& retrieve_;
  MemoryDecodeStats& stats_;
};

// Puts the module in eval mode (no dropout) for the duration of generate() and restores it afterwards.
struct EvalGuard {
  torch::nn::Module& m;
  bool was;
  explicit EvalGuard(torch::nn::Module& module) : m(module), was(module.is_training()) { m.eval(); }
  ~EvalGuard() { m.train(was); }
};

}  // namespace

struct Decoder {
  TransformerImpl& model;
  int64_t capacity;
  torch::ScalarType dtype;
  PositionContext pc;
  std::vector<std::unique_ptr<LayerCache>> caches;
  std::vector<torch::Tensor> hist_k, hist_v;  // un-rotated [1, L, Hkv, D], only for length-dependent frequencies
  torch::Tensor hist_pos;                     // [1, L]

  const MemoryDecodeOptions* memory = nullptr;  // set: every layer a MemoryCache, one token per run()
  bool retrieve = true;                         // this step searches the memories
  MemoryDecodeStats stats;

  Decoder(TransformerImpl& m, int64_t cap) : model(m), capacity(cap), dtype(m.tok_emb_->weight.scalar_type()) {}

  const ModelConfig& config() const { return model.config_; }
  bool core_cache() const {
    return config().fused && config().attention == AttentionKind::Softmax && !has_score_bias(model.active_.kind);
  }
  std::unique_ptr<LayerCache> new_cache(size_t layer) {
    if (memory)
      return std::make_unique<MemoryCache>(*memory, int(layer), config().kv_heads(), config().head_dim(), pc, retrieve,
                                           stats);
    if (core_cache()) return std::make_unique<CoreCache>(capacity, config().kv_heads(), config().head_dim(), dtype, pc);
    const torch::Tensor& projection = model.blocks_[layer]->performer_projection();
    if (config().fused && config().attention != AttentionKind::Softmax)
      return std::make_unique<LinearStateCache>(pc, config().attention, projection);
    return std::make_unique<PlainCache>(pc, config().attention, projection);
  }
  // Fresh caches for `pc`, refilled from the kept history (empty at the start).
  void rebuild() {
    caches.clear();
    for (size_t i = 0; i < model.blocks_.size(); ++i) {
      caches.push_back(new_cache(i));
      if (hist_pos.defined()) caches.back()->append(hist_k[i], hist_v[i], hist_pos);
    }
  }

  // tokens, positions [1, n] -> logits [1, n, V]. The first call (the prompt) runs the full attention; later
  // calls take one token each and attend through the caches.
  torch::Tensor run(const torch::Tensor& tokens, const torch::Tensor& positions) {
    const bool prefill = caches.empty() && !memory;  // with a memory, every token goes through the caches
    const bool dynamic = length_dependent(model.active_);
    const int64_t seq_len = dynamic ? positions.max().item<int64_t>() + 1 : 0;
    PositionContext next =
        make_position_context(model.active_, config().n_heads, config().head_dim(), seq_len, model.t5_bias_);
    const bool changed = prefill || (dynamic && (!torch::equal(next.inv_freq, pc.inv_freq) ||
                                                 next.attention_factor != pc.attention_factor));
    pc = std::move(next);
    if (changed || caches.empty()) rebuild();
    torch::Tensor x = model.embed(tokens, positions);
    for (size_t i = 0; i < model.blocks_.size(); ++i) {
      x = model.blocks_[i]->forward(x, [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
        if (memory && tokens.size(1) > 1)  // a chunk of the prompt: attends before it is appended
          return static_cast<MemoryCache&>(*caches[i]).prefill(q, k, v, positions, pc);
        caches[i]->append(k, v, positions);
        if (dynamic) {
          hist_k.resize(caches.size()), hist_v.resize(caches.size());
          hist_k[i] = hist_k[i].defined() ? torch::cat({hist_k[i], k}, 1) : k;
          hist_v[i] = hist_v[i].defined() ? torch::cat({hist_v[i], v}, 1) : v;
        }
        if (prefill)
          return model_attention(q, k, v, positions, pc, config().attention, config().fused,
                                 model.blocks_[i]->performer_projection());
        return caches[i]->attend(q, positions);
      });
    }
    if (dynamic) hist_pos = hist_pos.defined() ? torch::cat({hist_pos, positions}, 1) : positions;
    return model.head(x);
  }
};

namespace {

// The id sampled from one position's logits [V] (the first `vocab` of them): argmax at temperature 0, else a draw
// from softmax(logits / temperature). Non-finite logits (NaN or Inf weights, an attention factor past float range)
// would give argmax a NaN's index or make torch::multinomial throw; they are refused by name instead.
int64_t sample_next(const torch::Tensor& logits, int64_t vocab, double temperature, at::Generator& gen,
                    int64_t position) {
  const torch::Tensor last = logits.narrow(0, 0, vocab).to(torch::kDouble);
  if (!torch::isfinite(last).all().item<bool>())
    fail("logits at position " + std::to_string(position), "non-finite (NaN or Inf)",
         "finite logits (the model's weights or its position settings overflow)");
  if (temperature == 0) return last.argmax().item<int64_t>();
  return torch::multinomial(torch::softmax(last / temperature, -1), 1, false, gen).item<int64_t>();
}

}  // namespace

std::vector<int64_t> TransformerImpl::generate(const std::vector<int64_t>& prompt, int max_new, double temperature,
                                               int64_t stop_id, uint64_t seed, int64_t sample_vocab) {
  check(sample_vocab >= 0 && sample_vocab <= config_.vocab_size, "sample_vocab", sample_vocab,
        "in [0, vocab_size = " + std::to_string(config_.vocab_size) + "] (0: the whole vocabulary)");
  const int64_t vocab = sample_vocab > 0 ? sample_vocab : int64_t(config_.vocab_size);
  check(!prompt.empty(), "prompt.size()", 0, ">= 1 token");
  check(max_new >= 0, "max_new", max_new, ">= 0");
  check(std::isfinite(temperature) && temperature >= 0, "temperature", temperature, "a finite value >= 0 (0: greedy)");
  const int64_t S = int64_t(prompt.size());
  if (config_.encoding.kind == EncodingKind::Learned)
    check(S + max_new - 1 <= config_.max_seq_len, "prompt.size() + max_new", S + max_new,
          "<= max_seq_len + 1 = " + std::to_string(config_.max_seq_len + 1) + " with learned absolute positions");
  if (config_.sliding_window > 0)
    check_span(torch::tensor({int64_t(0), std::max(S - 1, S + max_new - 2)}));  // the last token sampled is never fed
  std::vector<int64_t> out;
  if (max_new == 0) return out;
  torch::NoGradGuard no_grad;
  EvalGuard eval(*this);
  const auto device = tok_emb_->weight.device();
  const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(device);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);

  Decoder dec(*this, S + max_new);
  torch::Tensor logits = dec.run(torch::tensor(prompt, i64).view({1, S}), torch::arange(S, i64).view({1, S}));
  for (int64_t p = S;; ++p) {
    const int64_t next = sample_next(logits[0][-1], vocab, temperature, gen, p - 1);
    if (next == stop_id) break;
    out.push_back(next);
    if (int64_t(out.size()) == max_new) break;
    logits = dec.run(torch::full({1, 1}, next, i64), torch::full({1, 1}, p, i64));
  }
  return out;
}

torch::Tensor TransformerImpl::decode_logits(const std::vector<int64_t>& tokens, int64_t prefill_len) {
  const int64_t S = int64_t(tokens.size());
  check_span(torch::tensor({int64_t(0), S - 1}));
  check(prefill_len >= 1 && prefill_len <= S, "prefill_len", prefill_len, "1..tokens.size() = " + std::to_string(S));
  torch::NoGradGuard no_grad;
  EvalGuard eval(*this);
  const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(tok_emb_->weight.device());
  const torch::Tensor all = torch::tensor(tokens, i64).view({1, S}), pos = torch::arange(S, i64).view({1, S});
  Decoder dec(*this, S);
  std::vector<torch::Tensor> parts = {dec.run(all.narrow(1, 0, prefill_len), pos.narrow(1, 0, prefill_len))};
  for (int64_t t = prefill_len; t < S; ++t) parts.push_back(dec.run(all.narrow(1, t, 1), pos.narrow(1, t, 1)));
  return torch::cat(parts, 1)[0];
}

}  // namespace rotary::nn

namespace rotary::nn {
namespace {

// The memory decoder's checks, before anything runs.
// The decoder sums the per-step statistics; callers get their means over the steps that produced them.
void average_over_steps(MemoryDecodeStats& s) {
  if (s.retrieving_steps > 0) s.memory_mass /= double(s.retrieving_steps);
  if (s.compared_steps > 0) {
    s.reference_overlap /= double(s.compared_steps);
    s.logit_error /= double(s.compared_steps);
  }
}

void check_memory_decoding(const ModelConfig& c, const EncodingConfig& active, const MemoryDecodeOptions& o) {
  check(c.attention == AttentionKind::Softmax && c.fused, "attention",
        c.fused ? std::string(attention_kind_name(c.attention)) : "softmax (fused = false)",
        "softmax with fused = true (decoding with a memory runs the core's decoder)");
  check(active.kind == EncodingKind::Rope || active.kind == EncodingKind::Rerope ||
            active.kind == EncodingKind::LeakyRerope,
        "encoding.kind", std::string(encoding_kind_name(active.kind)), "rope, rerope or leaky_rerope (decoding with a memory)");
  check(!length_dependent(active), "encoding.rope.scaling", std::string(scaling_name(active.rope.scaling)),
        "a scaling whose frequencies do not change with the length (decoding with a memory)");
  check(o.window >= 1, "memory.window", o.window, ">= 1");
  check(o.top_k >= 0, "memory.top_k", o.top_k, ">= 0 (0: the window alone)");
  check(o.prefill_chunk >= 0, "memory.prefill_chunk", o.prefill_chunk, ">= 0 (0 or 1: one token at a time)");
}

}  // namespace

std::vector<int64_t> TransformerImpl::generate_with_memory(const std::vector<int64_t>& prompt, int max_new,
                                                           double temperature, int64_t stop_id, uint64_t seed,
                                                           const MemoryDecodeOptions& memory,
                                                           MemoryDecodeStats* stats) {
  check(!prompt.empty(), "prompt.size()", 0, ">= 1 token");
  check(max_new >= 0, "max_new", max_new, ">= 0");
  check(std::isfinite(temperature) && temperature >= 0, "temperature", temperature, "a finite value >= 0 (0: greedy)");
  check_memory_decoding(config_, active_, memory);
  std::vector<int64_t> out;
  if (max_new == 0) return out;
  torch::NoGradGuard no_grad;
  EvalGuard eval(*this);
  const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(tok_emb_->weight.device());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t S = int64_t(prompt.size());
  Decoder dec(*this, 0);
  dec.memory = &memory;
  // The prompt but its last token (in chunks, or one at a time), then the last token alone, which always retrieves.
  const int64_t chunk = std::max<int64_t>(1, memory.prefill_chunk);
  const torch::Tensor all = torch::tensor(prompt, i64).view({1, S});
  dec.retrieve = memory.retrieve_in_prompt;
  for (int64_t t = 0; t < S - 1; t += chunk) {
    const int64_t n = std::min(chunk, S - 1 - t);
    dec.run(all.narrow(1, t, n), torch::arange(t, t + n, i64).view({1, n}));
  }
  dec.retrieve = true;
  const auto answer_start = std::chrono::steady_clock::now();
  const double aside_before = dec.stats.reference_seconds + dec.stats.probe_seconds;
  int64_t fed = 1;
  torch::Tensor logits = dec.run(all.narrow(1, S - 1, 1), torch::full({1, 1}, S - 1, i64));
  for (int64_t p = S;; ++p) {
    const int64_t next = sample_next(logits[0][-1], int64_t(config_.vocab_size), temperature, gen, p - 1);
    if (next == stop_id) break;
    out.push_back(next);
    if (int64_t(out.size()) == max_new) break;
    logits = dec.run(torch::full({1, 1}, next, i64), torch::full({1, 1}, p, i64));
    ++fed;
  }
  if (stats) {
    *stats = dec.stats;
    stats->answer_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - answer_start).count() -
                            (dec.stats.reference_seconds + dec.stats.probe_seconds - aside_before);
    stats->answer_tokens = fed;
    average_over_steps(*stats);
  }
  return out;
}

torch::Tensor TransformerImpl::decode_logits_with_memory(const std::vector<int64_t>& tokens,
                                                         const MemoryDecodeOptions& memory, MemoryDecodeStats* stats) {
  check(!tokens.empty(), "tokens.size()", 0, ">= 1 token");
  check_memory_decoding(config_, active_, memory);
  torch::NoGradGuard no_grad;
  EvalGuard eval(*this);
  const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(tok_emb_->weight.device());
  Decoder dec(*this, 0);
  dec.memory = &memory;
  std::vector<torch::Tensor> parts;
  const int64_t S = int64_t(tokens.size()), chunk = std::max<int64_t>(1, memory.prefill_chunk);
  const torch::Tensor all = torch::tensor(tokens, i64).view({1, S});
  dec.retrieve = memory.retrieve_in_prompt;
  for (int64_t t = 0; t < S; t += chunk) {
    const int64_t n = std::min(chunk, S - t);
    parts.push_back(dec.run(all.narrow(1, t, n), torch::arange(t, t + n, i64).view({1, n})));
  }
  if (stats) {
    *stats = dec.stats;
    average_over_steps(*stats);
  }
  return torch::cat(parts, 1)[0];
}

}  // namespace rotary::nn
