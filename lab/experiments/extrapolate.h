// lab/experiments/extrapolate.h: `rotary extrapolate` - seed 004's length-extrapolation experiment.
//
// Train (or load) a RoPE model at length L on KJV text, then score it at L, 2L, 4L, 8L (the multiples are
// settable) with every inference-time method of extrapolate_methods.h, each with and without log-n: next-token
// accuracy and loss on the last L tokens of plain and repeated held-out windows (extrapolate_eval.h). With
// `retrieval`, a second model trained on kv_retrieval at L is scored on retrieval prompts of each length, its
// answers generated through the KV-cache decoder. Then a ReRoPE window sweep (w from L/8 to L) at L and at the
// longest length, and the report (extrapolate_report.h).
//
// Layout of <out>: text_model/ and kv_model/ (trainer run directories, resumable), cells/ (one JSON per scored
// (model, metric, method, length): a rerun skips cells whose settings match), report.md, results.csv, *.png.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "experiments/extrapolate_methods.h"
#include "experiments/prepared_model.h"
#include "train/config.h"

namespace rotary::experiments {

struct ExtrapolateSpec {
  train::TrainConfig text;                 // the text model's run (task text, encoding rope; seq_len = L; log-n 0 or L)
  std::string text_checkpoint;      // non-empty: load this RoPE model (file or run dir) instead of training
  bool retrieval = false;           // also the kv_retrieval model and its table (off by default: a model that
                                    // retrieves takes far longer to train than the default's budget)
  train::TrainConfig kv;                   // the retrieval model's run (task kv_retrieval, same L)
  std::string kv_checkpoint;
  std::vector<int> multiples{1, 2, 4, 8};  // test lengths L * m
  std::vector<std::string> methods{std::begin(kExtrapolateMethods), std::end(kExtrapolateMethods)};
  std::vector<bool> logn{false, true};     // log-n variants of every method
  int64_t window = 0;               // ReRoPE / Leaky window (0: L / 2)
  double leaky_k = 16;              // Leaky ReRoPE k
  double dynamic_factor = 1;        // HF dynamic factor
  std::vector<int64_t> sweep;       // ReRoPE windows of the sweep (empty: L/8, L/4, L/2, 3L/4, L; {-1}: none)
  int windows = 32;                 // held-out text windows per length
  int batch_size = 4;               // windows per forward
  int problems = 32;                // retrieval problems per length
  uint64_t eval_seed = 1234;
  int threads = 0;                  // torch threads for the evaluation (0: the training setting / all cores)
  std::string out_dir = "runs/extrapolate";
  std::string command_line;         // recorded in the report
};

// The default run (no flags): L = 128 tested up to 1024 on 2 cores in about 15 minutes (docs/extrapolate.md).
ExtrapolateSpec default_extrapolate_spec();

// Checks every setting before anything runs (rotary::Error naming the field, e.g. "methods = rerope2").
void validate(const ExtrapolateSpec& spec);

// One scored (model, metric, method, length).
struct Cell {
  std::string metric;       // text | repeated | retrieval
  Method method;
  int test_len = 0;
  bool sweep = false;       // part of the window sweep, not the main table
  double loss = 0;          // text / repeated: mean CE on the last L tokens; retrieval: NaN
  double accuracy = 0;      // next-token accuracy, or retrieval exact match
  int64_t count = 0;        // scored tokens or problems
  double answer_distance = 0;  // retrieval: mean tokens from the answer to the end of the prompt
  std::vector<double> loss_by_position;  // text at the longest length: [T]
  double seconds = 0;       // time to score it (0 when reused)
  bool reused = false;      // read from cells/ of an earlier invocation
};


struct ExtrapolateResult : ExperimentOutcome {
  std::vector<ModelInfo> models;
  std::vector<Cell> cells;
};

ExtrapolateResult run_extrapolate(const ExtrapolateSpec& spec, bool progress);

}  // namespace rotary::experiments
