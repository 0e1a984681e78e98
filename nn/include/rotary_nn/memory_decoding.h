// rotary_nn/memory_decoding.h: decoding a model past its window through a retrieval memory (core's
// rotary/kv_memory.h, docs/memory.md): every layer keeps the newest `window` tokens exact and moves older ones to a
// memory; each step attends to the window and to the top-k memory keys, merged by log-sum-exp. Fused softmax models
// with a rotary kind (rope, rerope, leaky_rerope; not RoPER, whose values turn with the distance). The hooks
// (on_retrieve, search) and the reference policy are how `rotary memory` measures an index and a policy.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "rotary/kv_memory.h"
#include "rotary_nn/model.h"

namespace rotary::nn {

// One retrieving token-by-token step of one layer, shown to MemoryDecodeOptions::on_retrieve: the layer's memory
// as the step saw it, the step's query heads and the rows the exact search retrieved, so that a caller can ask
// another search (an approximate index, lab/memory) the same question and compare.
struct MemoryStep {
  int layer = 0;
  const rotary::KvMemory* memory = nullptr;  // the layer's memory (valid during the call)
  const float* q = nullptr;                  // [q_heads, head_dim] fp32, un-rotated (the policy rotates)
  int64_t q_heads = 0, head_dim = 0;
  int64_t position = 0;                      // the query's position
  int64_t query_origin = 0;                  // MemoryAttentionParams::query_origin for this step
  double softmax_scale = 0;
  int top_k = 0;                             // min(top_k, memory size)
  const int64_t* retrieved = nullptr;        // [q_heads, top_k] the rows attended, best first (on_retrieve only)
};

struct MemoryDecodeOptions {
  int64_t window = 0;             // tokens per layer kept exact, >= 1 (>= the ReRoPE window for policy rerope)
  MemoryPolicy policy = MemoryPolicy::Exact;  // where retrieved keys sit (kv_memory.h)
  DType storage = DType::F32;     // the memories' keys and values: f32, bf16 or f16 (KvMemoryConfig::storage)
  int top_k = 32;                 // memory keys per head and step (0: the window alone)
  bool retrieve_in_prompt = true; // false: prompt tokens see the window alone, retrieval starts at the last one
  int64_t prefill_chunk = 0;      // > 1: the prompt goes through in chunks of this many tokens, each attending to
                                  // the window and itself in one fused call (0 or 1: one token at a time)
  // Set: a second memory under this policy is kept beside the first, and each token-by-token step that retrieves
  // measures how `policy` moves the retrieved set and the logits from it (MemoryDecodeStats: seed 001's question
  // on Unlimiformer).
  std::optional<MemoryPolicy> reference_policy;
  // Set: called at every token-by-token step that retrieves, per layer, after the step (its time is not counted
  // in MemoryDecodeStats::answer_seconds). rotary memory measures an approximate index's recall with it.
  std::function<void(const MemoryStep&)> on_retrieve;
  // Set: at every token-by-token step that retrieves, the memory rows each layer attends to come from this search
  // instead of the exact scan (an approximate index, lab/memory): fill candidates [q_heads, top_k] with memory
  // rows or -1 (none); they are scored exactly, and a head with none attends to the window alone. Its time counts
  // in answer_seconds. Prefill chunks that retrieve (retrieve_in_prompt) still scan exactly.
  std::function<void(const MemoryStep&, int64_t* candidates)> search;
  // Set: called per layer with each prompt chunk's queries (chunks of 2 or more tokens: prefill_chunk > 1; a chunk
  // of one token goes the single-token way and is not shown; p.tokens, p.q [tokens, Hq, D] fp32
  // un-rotated, p.q_positions, p.softmax_scale, p.query_origin; no outputs) and the layer's memory before the chunk
  // joins it: what a query-routed index (lab/memory's graph) learns from. Valid during the call only.
  std::function<void(int layer, const rotary::KvMemory& memory, const MemoryAttentionParams& queries)>
      on_prompt_queries;
};
struct MemoryDecodeStats {
  int64_t retrieving_steps = 0;   // (token, layer) steps that searched the memory
  double memory_mass = 0;         // mean share of the softmax mass on retrieved keys over those steps and heads
  int64_t memory_tokens = 0;      // tokens in each layer's memory at the end
  double answer_seconds = 0;      // generate_with_memory: wall time from the prompt's last token to the end (the
                                  // steps that retrieve: latency per generated token = this / tokens it fed),
                                  // without the reference memory's work; decode_logits_with_memory: the time of
                                  // the tokens after prefill_len
  int64_t answer_tokens = 0;      // tokens fed in that time (the prompt's last one and the generated ones; the
                                  // tokens after prefill_len)
  // With reference_policy, over the compared (token, layer) steps and their query heads:
  int64_t compared_steps = 0;
  double reference_overlap = 0;   // mean share of the reference's top-k that `policy` retrieved: rows whose reference
                                  // logit reaches the reference's k-th best (by score: equal keys are common)
  double logit_error = 0;         // mean |logit - reference logit| (scaled) over the rows `policy` retrieved
  double reference_seconds = 0;   // time spent on the reference memory
  double probe_seconds = 0;       // time spent in on_retrieve
};

// generate() with the memory of `memory`: every token, the prompt's included, goes through the window-and-memory
// caches (the prompt in chunks of prefill_chunk, its last token alone, which always retrieves), then the model's
// sampling loop. rotary::Error naming the field for a model or option it cannot serve.
std::vector<int64_t> generate_with_memory(TransformerImpl& model, const std::vector<int64_t>& prompt, int max_new,
                                          double temperature, int64_t stop_id, uint64_t seed,
                                          const MemoryDecodeOptions& memory, MemoryDecodeStats* stats = nullptr);
// Teacher-forced logits through the same caches (with top_k past the memory's size they equal
// model.forward(tokens)[0] up to rounding: tested). prefill_len -1: every token in chunks of prefill_chunk,
// retrieving when retrieve_in_prompt; logits [S, V]. prefill_len >= 0: the first prefill_len tokens so (their
// logits not kept: a book-length prompt's would not fit in memory), then the rest one at a time, each retrieving as
// generate_with_memory's answer does (so `search` and `on_retrieve` see them, and stats' answer_seconds and
// answer_tokens count them); logits [S - prefill_len, V] of those tokens: a text scored through the memory after a
// long prompt (rotary memory's text cells).
torch::Tensor decode_logits_with_memory(TransformerImpl& model, const std::vector<int64_t>& tokens,
                                        const MemoryDecodeOptions& memory, MemoryDecodeStats* stats = nullptr,
                                        int64_t prefill_len = -1);

}  // namespace rotary::nn
