// lab/experiments/prepared_model.h: the model an experiment scores - trained by the engine in its own run
// directory (reused when finished, continued when interrupted) or loaded from a checkpoint - and what a report
// says about it. Shared by `rotary extrapolate` and `rotary memory`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "experiments/cell_store.h"
#include "rotary_nn/model.h"
#include "train/config.h"

namespace rotary::experiments {

struct ModelInfo {
  std::string role;         // text | kv | passkey ...: the experiment's name for it
  std::string checkpoint;
  int64_t step = 0;
  int train_len = 0;
  bool trained_logn = false;
  double train_seconds = 0; // from the run's summary (0 when loaded from elsewhere)
  double heldout_loss = 0;  // at the end of training, at length L (NaN if unknown)
  std::string description;  // one line for the report
};

struct PreparedModel {
  ModelInfo info;
  train::TrainConfig config;
  nn::Transformer model{nullptr};
};

// What an experiment's run returns besides its cells: how it ended (a signal while training or scoring stops it;
// rerunning the same command continues), the report and the plots written (or why none).
struct ExperimentOutcome {
  RunOutcome run;
  std::string report_md;
  std::vector<std::string> plots;
  std::string plot_problem;
  double seconds = 0;
};

// Trains `run` in run.out_dir (or reuses a finished run with the same settings, or continues an interrupted one)
// unless `checkpoint` (a file or run directory) is given, then loads it into `out`. Returns false when training
// was interrupted (`stopped` says how: RunStatus::Interrupted, the signal and the trainer's message).
// rotary::Error when run.out_dir holds a finished run with other settings (naming the first field that differs) or
// the model diverged: a trained model is the expensive input of every cell and is never replaced silently, while
// a cell (cell_store.h) is recomputed when its settings change.
bool prepare_model(const train::TrainConfig& run, const std::string& checkpoint, const std::string& role,
                   bool progress, PreparedModel& out, RunOutcome& stopped);

}  // namespace rotary::experiments
