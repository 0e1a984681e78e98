// Decoding through a retrieval memory (rotary_nn/memory_decoding.h): every layer's cache is a MemoryCache - the
// core's MemoryKvCache, a window of exact keys with a memory behind it (rotary/kv_memory.h) - in the decoder of
// generate() (decoder.h, Decoder::custom_caches); every token, the prompt's too, goes through it, the prompt in
// chunks that attend to the window and to themselves in one fused call.
#include "rotary_nn/memory_decoding.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "decoder.h"
#include "rotary/error.h"
#include "rotary/kv_memory.h"
#include "rotary_torch/convert.h"
#include "rotary_torch/decode.h"

namespace rotary::nn {
namespace {

// A window of exact keys with a retrieval memory behind it (the core's MemoryKvCache), fp32. A step's `retrieve`
// says whether it searches the memory; the share of the softmax mass on retrieved keys is summed into `stats`.
class MemoryCache final : public LayerCache {
 public:
  MemoryCache(const MemoryDecodeOptions& o, int layer, int64_t kv_heads, int64_t head_dim, const PositionContext& pc,
              MemoryDecodeStats& stats)
      : top_k_(o.top_k), layer_(layer), on_retrieve_(o.on_retrieve), search_(o.search),
        on_prompt_queries_(o.on_prompt_queries), scale_(pc.softmax_scale),
        stats_(stats) {
    const torch_ops::AttentionPosition ap = fused_attention_position(pc);
    check(!ap.roper, "encoding.kind", "roper", "rope, rerope or leaky_rerope (decoding with a memory)");
    MemoryKvCacheConfig c;
    c.window = o.window;
    c.kv_heads = kv_heads;
    c.head_dim = int(head_dim);
    c.policy = o.policy;
    c.memory_storage = o.storage;
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
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& q_position, bool retrieve) override {
    const torch::Tensor q2 = q[0][0].to(torch::kFloat).contiguous();  // [Hq, D]
    const int64_t Hq = q2.size(0);
    torch::Tensor out = torch::empty_like(q2);
    std::vector<float> mass(static_cast<size_t>(Hq));
    const int k = retrieve ? top_k_ : 0;
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
  torch::Tensor attend_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& positions, const PositionContext& pc, bool retrieve) override {
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
    const int k_eff = retrieve ? int(std::min<int64_t>(top_k_, cache_->memory().size())) : 0;
    if (k_eff > 0 || on_prompt_queries_) {
      const torch::Tensor qc = q[0].to(f32).contiguous(), pos = positions[0].contiguous();
      MemoryAttentionParams mp;
      mp.tokens = n;
      mp.q = torch_ops::heads_view(qc);
      mp.q_positions = pos.data_ptr<int64_t>();
      mp.query_origin = cache_->query_origin(pos.data_ptr<int64_t>()[0]);
      mp.softmax_scale = scale_;
      if (on_prompt_queries_) on_prompt_queries_(layer_, cache_->memory(), mp);
      if (k_eff > 0) attend_memory(mp, out, lse, k_eff);
    }
    append(k, v, positions);
    stats_.memory_tokens = cache_->memory().size();
    return out.to(q.scalar_type()).unsqueeze(0);
  }

 private:
  // The chunk's queries mp (tokens, q, positions, origin, scale) attend to the memory's top-k, merged into out /
  // lse [n, Hq, D] / [n, Hq].
  void attend_memory(MemoryAttentionParams mp, torch::Tensor& out, torch::Tensor& lse, int k_eff) {
    const int64_t n = mp.tokens, Hq = mp.q.heads;
    std::vector<float> mass(static_cast<size_t>(n * Hq));
    mp.top_k = k_eff;
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
  std::function<void(int, const KvMemory&, const MemoryAttentionParams&)> on_prompt_queries_;
  double scale_;
  MemoryDecodeStats& stats_;
};

// The decoder sums the per-step statistics; callers get their means over the steps that produced them.
void average_over_steps(MemoryDecodeStats& s) {
  if (s.retrieving_steps > 0) s.memory_mass /= double(s.retrieving_steps);
  if (s.compared_steps > 0) {
    s.reference_overlap /= double(s.compared_steps);
    s.logit_error /= double(s.compared_steps);
  }
}

// The wall time of a run's answer steps from its construction on, without the reference memory's and the probe's
// work in them (MemoryDecodeStats::answer_seconds).
class AnswerClock {
 public:
  explicit AnswerClock(const MemoryDecodeStats& sums)
      : sums_(sums), start_(std::chrono::steady_clock::now()), aside_(aside(sums)) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() - (aside(sums_) - aside_);
  }

 private:
  static double aside(const MemoryDecodeStats& s) { return s.reference_seconds + s.probe_seconds; }
  const MemoryDecodeStats& sums_;
  std::chrono::steady_clock::time_point start_;
  double aside_;
};

// The memory decoder's checks, before anything runs.
void check_memory_decoding(const ModelConfig& c, const EncodingConfig& active, const MemoryDecodeOptions& o) {
  check(c.attention == AttentionKind::Softmax && c.fused, "attention",
        c.fused ? std::string(attention_kind_name(c.attention)) : "softmax (fused = false)",
        "softmax with fused = true (decoding with a memory runs the core's decoder)");
  check(active.kind == EncodingKind::Rope || active.kind == EncodingKind::Rerope ||
            active.kind == EncodingKind::LeakyRerope,
        "encoding.kind", std::string(encoding_kind_name(active.kind)),
        "rope, rerope or leaky_rerope (decoding with a memory)");
  check(!length_dependent(active), "encoding.rope.scaling", std::string(scaling_name(active.rope.scaling)),
        "a scaling whose frequencies do not change with the length (decoding with a memory)");
  check(o.window >= 1, "memory.window", o.window, ">= 1");
  check(o.top_k >= 0, "memory.top_k", o.top_k, ">= 0 (0: the window alone)");
  check(o.prefill_chunk >= 0, "memory.prefill_chunk", o.prefill_chunk, ">= 0 (0 or 1: one token at a time)");
}

// A decoder whose every layer caches through a MemoryCache.
Decoder memory_decoder(TransformerImpl& model, const MemoryDecodeOptions& memory, MemoryDecodeStats& stats) {
  const ModelConfig& c = model.config();
  return Decoder(model, 0, [&memory, &stats, &c](size_t layer, const PositionContext& pc) {
    return std::unique_ptr<LayerCache>(
        std::make_unique<MemoryCache>(memory, int(layer), c.kv_heads(), c.head_dim(), pc, stats));
  });
}

}  // namespace

std::vector<int64_t> generate_with_memory(TransformerImpl& model, const std::vector<int64_t>& prompt, int max_new,
                                          double temperature, int64_t stop_id, uint64_t seed,
                                          const MemoryDecodeOptions& memory, MemoryDecodeStats* stats) {
  const engine::GenerateOptions sampling = sampling_options(max_new, temperature, stop_id, seed, 0);
  engine::check_sampling(int64_t(prompt.size()), sampling, model.config().vocab_size);
  check_memory_decoding(model.config(), model.active_encoding(), memory);
  if (max_new == 0) return {};
  torch::NoGradGuard no_grad;
  EvalGuard eval(model);
  const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(model.parameters().front().device());
  const int64_t S = int64_t(prompt.size());
  MemoryDecodeStats sums;
  Decoder dec = memory_decoder(model, memory, sums);
  // The prompt but its last token (in chunks, or one at a time), then the last token alone, which always retrieves.
  const int64_t chunk = std::max<int64_t>(1, memory.prefill_chunk);
  const torch::Tensor all = torch::tensor(prompt, i64).view({1, S});
  for (int64_t t = 0; t < S - 1; t += chunk) {
    const int64_t n = std::min(chunk, S - 1 - t);
    dec.run(all.narrow(1, t, n), torch::arange(t, t + n, i64).view({1, n}), memory.retrieve_in_prompt);
  }
  const AnswerClock clock(sums);
  const torch::Tensor logits = dec.run(all.narrow(1, S - 1, 1), torch::full({1, 1}, S - 1, i64), /*retrieve=*/true);
  Sampled out = sample_tokens(dec, logits, S, sampling);
  if (stats) {
    *stats = sums;
    stats->answer_seconds = clock.seconds();
    stats->answer_tokens = 1 + out.fed;
    average_over_steps(*stats);
  }
  return std::move(out.tokens);
}

torch::Tensor decode_logits_with_memory(TransformerImpl& model, const std::vector<int64_t>& tokens,
                                        const MemoryDecodeOptions& memory, MemoryDecodeStats* stats,
                                        int64_t prefill_len) {
  check(!tokens.empty(), "tokens.size()", 0, ">= 1 token");
  const int64_t S = int64_t(tokens.size());
  check(prefill_len >= -1 && prefill_len <= S, "prefill_len", prefill_len,
        "-1 (every token) or in [0, tokens.size() = " + std::to_string(S) + "]");
  check_memory_decoding(model.config(), model.active_encoding(), memory);
  torch::NoGradGuard no_grad;
  EvalGuard eval(model);
  const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(model.parameters().front().device());
  MemoryDecodeStats sums;
  Decoder dec = memory_decoder(model, memory, sums);
  std::vector<torch::Tensor> parts;
  const int64_t prefill = prefill_len < 0 ? S : prefill_len, chunk = std::max<int64_t>(1, memory.prefill_chunk);
  const torch::Tensor all = torch::tensor(tokens, i64).view({1, S});
  for (int64_t t = 0; t < prefill; t += chunk) {
    const int64_t n = std::min(chunk, prefill - t);
    torch::Tensor logits =
        dec.run(all.narrow(1, t, n), torch::arange(t, t + n, i64).view({1, n}), memory.retrieve_in_prompt);
    if (prefill_len < 0) parts.push_back(std::move(logits));
  }
  const AnswerClock clock(sums);
  for (int64_t t = prefill; t < S; ++t)
    parts.push_back(dec.run(all.narrow(1, t, 1), torch::full({1, 1}, t, i64), /*retrieve=*/true));
  if (stats) {
    *stats = sums;
    if (prefill < S) {
      stats->answer_seconds = clock.seconds();
      stats->answer_tokens = S - prefill;
    }
    average_over_steps(*stats);
  }
  if (parts.empty()) return torch::empty({0, model.config().vocab_size});  // prefill_len = S: nothing after it
  return torch::cat(parts, 1)[0];
}

}  // namespace rotary::nn
