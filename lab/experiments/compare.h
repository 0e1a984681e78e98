// lab/experiments/compare.h: `rotary compare` - several encodings x several seeds of one run description, then the
// report (report.h). Runs go side by side as `rotary train` processes (--jobs; small models train faster on one
// core each than on two cores one after the other) or one after the other in this process (--jobs 1).
//
// Runs live in <out>/<encoding>/seed<k>/. Rerunning the same compare skips runs that finished (summary.json
// present, same config), continues runs that were interrupted (checkpoint present) and starts the rest.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "experiments/cell_store.h"
#include "experiments/report.h"
#include "train/config.h"

namespace rotary::experiments {

struct CompareSpec {
  train::TrainConfig base;                    // encoding kind, seed and out_dir are set per run
  std::vector<std::string> encodings;  // model.encoding.kind values
  int seeds = 3;                       // seeds base.seed, base.seed + 1, ...
  int jobs = 0;                        // runs trained at once, each a `rotary train` process (0: cores / threads
                                       // per run; 1: one after the other in this process)
  std::string rotary_program;          // the `rotary` executable those processes run (the CLI sets its own,
                                       // /proc/self/exe); empty: always one after the other in this process
  std::string out_dir = "runs/compare";
  std::string command_line;            // recorded in the report
  std::optional<double> target_loss;   // the report's "steps to held-out loss" level (report.h; unset: automatic)
};

// The built-in default (no flags): RoPE vs RoPER on addition with a tiny model, 3 seeds, sized to take about
// five minutes on a 2-core machine (docs/lab.md gives the measured time and accuracy).
CompareSpec default_compare_spec();

struct CompareResult {
  std::vector<CompareRun> runs;
  ReportFiles report;          // empty when interrupted
  RunOutcome run;
};

// rotary::Error for an unknown encoding (before anything runs), or a run directory that holds a different run.
CompareResult run_compare(const CompareSpec& spec, bool progress);

}  // namespace rotary::experiments
