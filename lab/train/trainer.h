// lab/train/trainer.h: the training loop of `rotary train` (and of every run of `rotary compare`).
//
// A run lives in config.out_dir: config.json, metrics.csv + metrics.jsonl, checkpoint.pt (checkpoint.h) and, once
// finished, summary.json (summary.h). Resuming continues the same run: the checkpoint restores the model, the
// AdamW state, the data RNG (so the next batches are the ones the uninterrupted run would have drawn) and the
// torch generator, so the loss curve is the same as without the interruption.
#pragma once

#include "common/stop_signal.h"

#include <csignal>

#include <cstdint>
#include <optional>
#include <string>

#include "train/config.h"
#include "train/distributed.h"
#include "train/summary.h"

namespace rotary::train {

enum class ResumeMode {
  Never,      // a fresh run; an existing checkpoint in out_dir is an error unless overwrite
  Required,   // continue the run in out_dir; no checkpoint there is an error
  IfPresent,  // continue if there is a checkpoint, else start (compare)
};

struct TrainOptions {
  ResumeMode resume = ResumeMode::Never;
  bool overwrite = false;    // with Never: discard what out_dir holds
  bool progress = true;      // the progress bar / lines on stderr (rank 0 only)
  Communicator* comm = nullptr;  // data-parallel group; null = single process
  int64_t stop_after_step = -1;  // test hook: behave as if Ctrl-C arrived during this step
  std::string label;             // prefix of progress messages (compare: "rope seed 1")
};

enum class TrainStatus { Finished, Interrupted, NonFinite };

struct TrainResult {
  TrainStatus status = TrainStatus::Finished;
  int64_t step = 0;            // updates completed (and saved, unless NonFinite)
  std::string message;         // for Interrupted / NonFinite: what happened and what was kept
  std::optional<RunSummary> summary;  // Finished only
  int signal = 0;              // Interrupted by this signal (0: the test hook)
};

// Runs (or continues) the run described by `config`. rotary::Error for bad settings, an unknown task, a
// checkpoint of a different run. Status Interrupted after SIGINT/SIGTERM (checkpoint saved at the end of the
// step), NonFinite when the loss or gradient norm stops being finite (nothing saved: the last good checkpoint
// stays).
TrainResult train(TrainConfig config, const TrainOptions& options);

// SIGINT/SIGTERM: while train() runs (it holds a StopSignalGuard), the signals set the flag the loop reads at the end
// of each step (common/stop_signal.h: one flag for training and the experiments' loops); threads as resolved there.
using lab::clear_stop_request;
using lab::resolve_threads;
using lab::stop_requested;
using lab::stop_signal;
using lab::StopSignalGuard;
// Sets torch's, OpenMP's and OpenBLAS's thread counts to resolve_threads(requested, processes) and returns it
// (Debian's libtorch multiplies matrices in OpenBLAS, which keeps a pool of its own).
int use_threads(int requested, int processes = 1);

// The path of the checkpoint of a run directory.
std::string checkpoint_path(const std::string& out_dir);

}  // namespace rotary::train
