// lab/cli/torch/load_model.h: what `rotary eval` and `rotary generate` share - a checkpoint (file or run
// directory) loaded into a model, and the encoding overrides applied to it (cli/override_flags.h).
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>

#include "cli/override_flags.h"
#include "common/files.h"
#include "rotary/error.h"
#include "rotary_nn/model.h"
#include "tasks/task.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

namespace rotary::cli {

// A trained model (train/checkpoint.h) with its task, for commands that feed it text.
struct LoadedRun : train::TrainedModel {
  std::unique_ptr<lab::Task> task;
};

// `where` is a checkpoint file or a run directory holding checkpoint.pt.
inline LoadedRun load_run(const std::string& where) {
  LoadedRun run;
  static_cast<train::TrainedModel&>(run) = train::load_trained_model(where);
  run.task = lab::make_task(run.config.task, run.config.task_options);
  return run;
}

// Applies the flags' override to a trained model (rotary::Error from the model if it does not fit what was trained).
inline void apply_overrides(const OverrideFlags& flags, LoadedRun& run) {
  if (flags.any()) run.model->set_override(flags.override_of(run.config.model));
}

}  // namespace rotary::cli
