// lab/experiments/memory_experiment.h: `rotary memory` - seed 001's experiment. A RoPE model trained (or loaded) at
// length L on the passkey task (ReRoPE by default) answers pass-key prompts of L x each multiple (default 1, 8,
// 64, 512: 256 -> 128k tokens) through the retrieval memory (nn MemoryDecodeOptions: a window of W exact tokens per layer, older ones in
// a KvMemory, the top-k of it retrieved at the answer's tokens) under each position policy (exact, rerope, none,
// unlimiformer) and top-k, and without a memory where the full context fits (the model's own encoding, and for a
// RoPE model the methods of extrapolate_methods.h; through the KV-cache decoder).
//
// The prompt goes through in chunks of W tokens that attend to the window alone (retrieve_in_prompt = false: the
// memory is read where the answer is produced, the last prompt token and the generated ones), so a 128k-token
// prompt costs what a windowed model costs. Per cell: exact match, the share of the softmax mass on retrieved keys,
// the memory's tokens, wall time per answer token (the steps that search the memory), the key's distance from the
// end of the prompt.
//
// Index cells decode through search indexes (lab/memory: FAISS, the core's page search) over the model's own
// memory: each answer step attends to the index's candidates; exact match that way, the candidates' recall of the
// exact top-k, the keys the search scored, and the speed of one step against the exact scan.
//
// A text model (task text, KJV BPE: --checkpoint of a `rotary train --task text` run) is scored instead on
// windows of its training text: T prompt tokens, then 32 tokens predicted teacher-forced, each through the memory
// (nn::decode_logits_with_memory's tokens after the prompt) - next-token accuracy and loss per cell, and the
// searches measured on a language model's keys (issue 23).
//
// Layout of <out>: model/ (the trainer's run directory, resumable), cells/ (one JSON per (kind, name, top-k,
// length): a rerun skips cells whose settings match), results.csv, report.md, accuracy_vs_length.png,
// latency_vs_memory.png, search_vs_memory.png.
#pragma once

#include <cstdint>
#include <string>

#include "rotary/dtype.h"
#include <vector>

#include "experiments/prepared_model.h"
#include "train/config.h"

namespace rotary::experiments {

struct MemorySpec {
  train::TrainConfig run;           // the model's run (task passkey; kv_retrieval: prompts of as many pairs as
                                    // fill each length; text: windows of its training text; encoding rope, rerope
                                    // or leaky_rerope; seq_len = L; default a passkey ReRoPE model with w = L/2)
  std::string checkpoint;           // non-empty: load this model (file or run directory) instead of training
  std::vector<int> multiples{1, 8, 64, 512};   // test lengths L x m
  std::vector<std::string> policies{"exact", "rerope", "none", "unlimiformer"};
  // Memory keys per head and step. 8 by default: the 2-layer passkey model answers at 8L with every k from 8 to 16
  // and at 30% with 32 (Memorizing Transformers' k), where the 24 next-best keys of a large memory take the softmax
  // mass the key needs (docs/memory.md has the sweep).
  std::vector<int> top_k{8};
  // Full context, no memory (may be empty): "trained" (the model's own encoding) or, for a RoPE model, a method of
  // extrapolate_methods.h applied at the test length (rope, pi, ntk, yarn, rerope at w = W, ...).
  std::vector<std::string> baselines{"trained"};
  int full_max_multiple = 8;        // baselines at lengths <= L x this only (full attention is quadratic)
  DType memory_dtype = DType::F32;  // the memories' keys and values: f32, bf16 or f16 (KvMemoryConfig::storage)
  int64_t window = 0;               // W: tokens per layer kept exact (0: L / 2, at least a ReRoPE model's window);
                                    // also the rerope baseline's window
  int problems = 10;                // prompts per cell
  // Approximate search on the model's real keys: with the model's own policy, the first index_problems prompts of
  // each length decoded through each of these indexes over every layer's memory (lab/memory/memory_index.h:
  // flat, hnsw, ivf at their defaults; pages certified exact, pages<P> reading P pages): exact match, recall of the
  // exact top-k, the keys scored, the index's build time, and one step's memory attention through the index
  // against the exact scan. Empty: none.
  std::vector<std::string> indexes{"flat", "ivf", "kdtree"};
  int index_problems = 3;
  uint64_t eval_seed = 1234;
  int threads = 0;                  // torch and memory threads (0: the training setting / all cores)
  std::string out_dir = "runs/memory";
  std::string command_line;         // recorded in the report
};

// The default run (no flags): L = 256 tested up to 128k tokens on 2 cores in about 16 minutes (docs/memory.md).
MemorySpec default_memory_spec();

// Every setting checked before anything runs (rotary::Error naming the field, e.g. "policies = nearest").
void validate(const MemorySpec& spec);

struct MemoryCell {
  std::string kind;          // memory | full | index
  std::string name;          // the policy (memory), the baseline method (full) or the FAISS index kind (index)
  int top_k = 0;             // memory and index
  int test_len = 0;          // prompt tokens
  double accuracy = 0;       // exact match (text: next-token accuracy on the tokens scored after the prompt)
  int problems = 0;
  double key_distance = 0;   // mean tokens from the needle (the pass key's first digit; the asked key's value) to
                             // the end of the prompt
  double memory_mass = 0;    // memory: mean share of the softmax mass on retrieved keys (retrieving steps, heads)
  double memory_tokens = 0;  // memory: mean tokens per layer's memory at the end
  double ms_per_answer_token = 0;  // memory: wall time per token fed from the prompt's last one on
  // memory, a policy other than the model's own (exact for RoPE, rerope for ReRoPE: the reference): how it moves
  // the retrieved set and the logits from the reference, over the answer's steps (seed 001's question 1).
  std::string reference;
  double reference_overlap = 0;  // share of the reference's top-k rows this policy retrieved
  double logit_error = 0;        // mean |logit - reference logit| of the rows it retrieved (scaled logits)
  // index: decoding through the index's candidates (accuracy: exact match that way) with the model's own policy
  // (`reference`), over every answer step and layer of index_problems prompts
  double recall = 0;             // share of the exact top-k rows (every query head) the index proposed
  double build_seconds = 0;      // building one layer's index over its memory (all kv heads), mean
  double exact_step_ms = 0;      // one layer's memory attention for one token, exact scan (median)
  double index_step_ms = 0;      // the same through the index's candidates (median)
  double scored = 0;             // vectors the search scored, as a share of an exact scan's (mean over steps)
  double loss = 0;               // text: mean next-token loss (nats) on the scored tokens; NaN for the other tasks
  double seconds = 0;        // to score the cell (0 when reused)
  bool reused = false;
};

struct MemoryResult : ExperimentOutcome {
  ModelInfo model;
  std::vector<MemoryCell> cells;
  int64_t memory_bytes_per_token = 0;  // every layer's keys and values (memory_dtype) and position (int64)
};

MemoryResult run_memory(const MemorySpec& spec, bool progress);

}  // namespace rotary::experiments
