// lab/cli/run_outcome.h: how every experiment command ends when its run was interrupted.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "common/exit_status.h"
#include "experiments/cell_store.h"

namespace rotary::cli {

// An interrupted run (experiments::RunStatus::Interrupted) prints "rotary <command>: <message>" and exits with
// 128 + its signal (common/exit_status.h); a finished one returns.
inline void exit_if_interrupted(const experiments::RunOutcome& run, const std::string& command) {
  if (!run.interrupted()) return;
  std::fprintf(stderr, "rotary %s: %s\n", command.c_str(), run.message.c_str());
  throw CLI::RuntimeError(lab::interrupted_exit_status(run.signal));
}

}  // namespace rotary::cli
