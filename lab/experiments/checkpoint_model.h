// lab/experiments/checkpoint_model.h: one Hugging Face checkpoint for the lab's commands (perplexity, generate,
// bench checkpoint) - on the torch-free engine (rotary_engine/model.h; the default: weights used in place in their
// stored dtype or converted once with --weights, the KV cache in --kv-dtype) or on the nn model (--engine torch:
// float32 copies of the weights, the path the engine is tested against) - behind one interface, so that every
// command runs either and a run can be checked against the machine's memory before it starts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "rotary_engine/model.h"
#include "rotary_nn/config.h"
#include "rotary_nn/hf_model.h"

namespace rotary::experiments {

struct CheckpointRunOptions {
  std::string engine = "engine";  // engine | torch
  std::string weights;            // engine: f32, f16, bf16, q8, or a block format q8_0, q4_k, ... (empty: as stored)
  std::string kv_dtype = "f32";   // engine: f32, bf16, f16, q8 (int8 blocks of 32 with a scale: KvStorage::Q8)
  // engine: the linear products' activations, f32, bf16 (bf16 weights) or q8 (q8 or block weights); "auto": as the
  // weights choose (engine::LoadOptions::activations), replaced by what they chose once the model is loaded
  // (CheckpointModel::options()), so that a stored result's key names the activations that computed it.
  std::string activations = "auto";
  int threads = 0;                // 0: all cores
  void validate() const;          // rotary::Error naming --engine, --weights, --kv-dtype, --activations
  std::optional<ActivationFormat> activation_choice() const;  // activations parsed; unset for "auto"
  // What changes the numbers a run computes (engine, weights, kv dtype, activations): part of a stored result's
  // key.
  nlohmann::json key() const;
  std::string describe() const;   // "engine (weights bf16 as stored, kv cache f32)" / "torch (float32 weights)"
  // Sets o.kv_dtype and o.kv_storage from kv_dtype ("q8": f32 queries and outputs, the cache in q8 blocks).
  void set_kv_cache(engine::SessionOptions& o) const;
};

// --search faiss-flat, faiss-hnsw, faiss-ivf: the lab's FAISS indexes (lab/memory/memory_index.h) on a checkpoint.
inline bool is_faiss_search(const std::string& search) { return search.rfind("faiss-", 0) == 0; }
// --search pages, kdtree, pages<P>, kdtree<P>: the core's page search, whose page size (--page-size) names a run.
inline bool is_paged_search(const std::string& search) {
  return search.rfind("pages", 0) == 0 || search.rfind("kdtree", 0) == 0;
}

// A retrieval memory for a checkpoint's run (seed 001 on a pretrained model; rotary_engine/model.h MemoryOptions):
// the flags --memory, --memory-window, --top-k, --memory-dtype. Engine only.
struct CheckpointMemoryOptions {
  std::string policy;         // exact, rerope, none, unlimiformer (rotary/kv_memory.h); empty: no memory
  int64_t window = 0;         // W: tokens kept exact (W to 2W); 0: half the checkpoint's trained context
  int top_k = 32;             // memory rows per (query, head); 0: the window alone
  std::string dtype = "f32";  // the memory's keys and values: f32, bf16, f16
  std::string search = "exact";  // exact (the scan), pages / kdtree (certified), pages<P> / kdtree<P> (P pages),
                                 // graph / graph<W> (the query-routed graph, search width W), faiss-flat,
                                 // faiss-hnsw, faiss-ivf (lab/memory/memory_index.h, their defaults)
  int64_t page_size = 32;     // pages, kdtree: rows per page
  bool enabled() const { return !policy.empty(); }
  void validate() const;      // rotary::Error naming --memory, --top-k, --memory-dtype, --search, --page-size
  // The engine's options for a checkpoint trained at `trained_context` (W resolved).
  engine::MemoryOptions engine_options(int64_t trained_context) const;
  std::string describe(int64_t trained_context) const;  // "memory exact, W 2048, top-32, f32"
};

class CheckpointModel {
 public:
  CheckpointModel(const std::string& model_dir, const CheckpointRunOptions& options);
  ~CheckpointModel();

  const nn::HfModelSpec& spec() const;
  const CheckpointRunOptions& options() const;
  // The weights by content, for results stored under a key (perplexity's cells): the engine's Model::weights_hash
  // (every tensor as stored), or on the torch path every parameter's float32 values by name. Two copies of the same
  // weights give the same value whatever their paths and mtimes; other weights another.
  uint64_t weights_hash() const;
  // The encoding later calls run: the trained one with `o` applied (nn::apply_override; rotary::Error naming the
  // override field when it does not fit). Each call starts again from the trained encoding.
  void set_override(const nn::EncodingOverride& o);
  const nn::EncodingConfig& active_encoding() const;
  // The memory later calls run through (hidden_states, generate, memory_needed); nullopt: none. rotary::Error on
  // the torch path (naming --engine) and for settings the engine cannot run with the active encoding (checked by
  // making a session; call after set_override).
  void set_memory(const std::optional<engine::MemoryOptions>& memory);
  // What the memory did in the last hidden_states / generate call (zeros without a memory).
  engine::MemoryStats memory_stats() const;

  // What a run of the engine keeps: Score, one pass over the tokens that keeps no KV cache (hidden_states:
  // `rotary perplexity`; with a memory the memory is kept); Generate, a KV cache for every token to decode from.
  enum class RunKind { Score, Generate };
  // Refuses (rotary::Error naming the bytes, what is available and the flags that would shrink it) a run of
  // `tokens` tokens at once that does not fit the memory /proc/meminfo reports available: the weights (mapped or
  // converted), the KV cache (Generate, or with a memory) and the activations. The torch path is not estimated.
  // `available`: the bytes to compare with (-1: available_memory_bytes()).
  void check_memory(int64_t tokens, RunKind kind, const std::string& what, int64_t available = -1) const;
  // The bytes check_memory counts for a run of `tokens`: what is still to be allocated or read in (the weights
  // read in place from the files, the KV cache, activations, logits), not the converted weights the model holds
  // already (0 on the torch path).
  int64_t memory_needed(int64_t tokens, RunKind kind) const;

  // The final norm's output for tokens at positions 0..T-1, handed to `rows(first, n, hidden [n, d_model])` in
  // order: one forward (fused attention) and one call, or with a memory a chunk per forward and per call (the
  // activations and hidden rows of one chunk held at a time, however long the sequence).
  void hidden_states(const std::vector<int64_t>& tokens,
                     const std::function<void(int64_t first, int64_t n, const float* hidden)>& rows);
  std::vector<float> hidden_states(const std::vector<int64_t>& tokens);  // all [T, d_model] at once
  // logits [n, vocab] of n hidden rows.
  void project(const float* hidden, int64_t n, std::vector<float>& logits);
  // A session of the engine for `capacity` tokens with the active encoding, memory and KV cache settings (`rotary
  // chat`: one conversation whose tokens stay between turns). rotary::Error naming --engine on the torch path.
  engine::Session session(int64_t capacity) const;
  // The engine's model (`rotary serve` batches several sessions over it); rotary::Error naming --engine on the torch
  // path.
  std::shared_ptr<const engine::Model> engine_model() const;
  // New tokens after `prompt` (greedy at temperature 0), at most max_new, stopping at any of stop_ids; only
  // ids below sample_vocab (0: all) are chosen.
  // `on_prompt(done, total)`: progress through a long prompt (optional). On the engine (with or without a memory):
  // `context` non-empty continues the session saved there (engine::Session::open_context: the prompt goes after its
  // tokens), `save_context` non-empty saves the session there once the prompt is read (before generating).
  std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t max_new, double temperature,
                                const std::vector<int64_t>& stop_ids, uint64_t seed, int64_t sample_vocab,
                                const std::function<void(int64_t, int64_t)>& on_prompt = {},
                                const std::string& context = "", const std::string& save_context = "");

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The nn float32 model of a checkpoint (--engine torch: the path the engine is tested against). It needs libtorch,
// so the torch build provides it (lab/experiments/torch_checkpoint.cpp: use_torch_checkpoints()) and a build without
// libtorch refuses --engine torch by name.
class TorchCheckpoint {
 public:
  virtual ~TorchCheckpoint() = default;
  virtual const nn::HfModelSpec& spec() const = 0;
  // Every parameter's float32 values by name (CheckpointModel::weights_hash).
  virtual uint64_t weights_hash(int threads) const = 0;
  // The trained encoding with `o` applied; returns the encoding now active (rotary::Error when it does not fit).
  virtual nn::EncodingConfig set_override(const nn::EncodingOverride& o) = 0;
  virtual void hidden_states(const std::vector<int64_t>& tokens, float* out) = 0;  // [T, d_model]
  virtual void project(const float* hidden, int64_t n, float* logits) = 0;        // [n, vocab]
  // (The nn model stops at one token: stop_id -1 for none.)
  virtual std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t max_new, double temperature,
                                        int64_t stop_id, uint64_t seed, int64_t sample_vocab) = 0;
};
using TorchCheckpointLoader = std::function<std::unique_ptr<TorchCheckpoint>(const std::string& model_dir,
                                                                             int threads)>;
// Installs the loader of --engine torch (once, by the torch build; nullptr: none).
void set_torch_checkpoint_loader(TorchCheckpointLoader loader);
bool torch_checkpoints_available();

// Bytes of memory available to a new allocation now (/proc/meminfo MemAvailable); -1 when unknown.
int64_t available_memory_bytes();

}  // namespace rotary::experiments
