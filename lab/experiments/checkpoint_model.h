// lab/experiments/checkpoint_model.h: one Hugging Face checkpoint for the lab's commands (perplexity, generate,
// bench checkpoint) - on the torch-free engine (rotary_engine/model.h; the default: weights used in place in their
// stored dtype or converted once with --weights, the KV cache in --kv-dtype) or on the nn model (--engine torch:
// float32 copies of the weights, the path the engine is tested against) - behind one interface, so that every
// command runs either and a run can be checked against the machine's memory before it starts.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "rotary_engine/model.h"
#include "rotary_nn/config.h"
#include "rotary_nn/hf_model.h"

namespace rotary::experiments {

struct CheckpointRunOptions {
  std::string engine = "engine";  // engine | torch
  std::string weights;            // engine: f32, f16, bf16, q8 (empty: as stored)
  std::string kv_dtype = "f32";   // engine: f32, bf16, f16
  int threads = 0;                // 0: all cores
  void validate() const;          // rotary::Error naming --engine, --weights, --kv-dtype
  // What changes the numbers a run computes (engine, weights, kv dtype): part of a stored result's key.
  nlohmann::json key() const;
  std::string describe() const;   // "engine (weights bf16 as stored, kv cache f32)" / "torch (float32 weights)"
};

class CheckpointModel {
 public:
  CheckpointModel(const std::string& model_dir, const CheckpointRunOptions& options);
  ~CheckpointModel();

  const nn::HfModelSpec& spec() const;
  const CheckpointRunOptions& options() const;
  // The encoding later calls run: the trained one with `o` applied (nn::apply_override; rotary::Error naming the
  // override field when it does not fit). Each call starts again from the trained encoding.
  void set_override(const nn::EncodingOverride& o);
  const nn::EncodingConfig& active_encoding() const;

  // Refuses (rotary::Error naming the bytes, what is available and the flags that would shrink it) a run of
  // `tokens` tokens at once that does not fit the memory /proc/meminfo reports available: the weights (mapped or
  // converted), the KV cache and the activations. The torch path is not estimated. `available`: the bytes to
  // compare with (-1: available_memory_bytes()).
  void check_memory(int64_t tokens, const std::string& what, int64_t available = -1) const;
  // The bytes check_memory counts for a run of `tokens` (0 on the torch path).
  int64_t memory_needed(int64_t tokens) const;

  // The final norm's output [T, d_model] for tokens at positions 0..T-1: one forward (fused attention).
  std::vector<float> hidden_states(const std::vector<int64_t>& tokens);
  // logits [n, vocab] of n hidden rows.
  void project(const float* hidden, int64_t n, std::vector<float>& logits);
  // New tokens after `prompt` (greedy at temperature 0), at most max_new, stopping at stop_id (-1: never); only
  // ids below sample_vocab (0: all) are chosen.
  std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t max_new, double temperature,
                                int64_t stop_id, uint64_t seed, int64_t sample_vocab);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Bytes of memory available to a new allocation now (/proc/meminfo MemAvailable); -1 when unknown.
int64_t available_memory_bytes();

}  // namespace rotary::experiments
