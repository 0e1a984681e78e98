// lab/experiments/report.h: the results of `rotary compare` - drop-worst means, the markdown report and its gnuplot
// PNGs (torch-free).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/summary.h"

namespace rotary::experiments {

// Seed 000's protocol: "the mean of the 9 after removing the worst session". With n >= 2 values the worst one
// (highest when lower is better, lowest when higher is better; a NaN - a diverged run - is always the worst) is
// dropped and the rest averaged; with one value, that value. NaN if nothing finite remains.
double drop_worst_mean(const std::vector<double>& values, bool higher_is_better);

struct CompareRun {
  std::string encoding;
  uint64_t seed = 0;
  std::string dir;      // the run's out_dir
  train::RunSummary summary;
  bool reused = false;  // finished by an earlier invocation
};

struct ReportInputs {
  std::string out_dir;
  std::string task;
  std::vector<std::string> encodings;  // in the order asked for
  std::vector<CompareRun> runs;
  nlohmann::json base_config;          // the train::TrainConfig shared by all runs (encoding and seed vary)
  std::string command_line;
};

struct EncodingStats {
  std::string encoding;
  int runs = 0;
  double final_train_loss = 0, eval_loss = 0, accuracy_greedy = 0, accuracy_sampled = 0;  // drop-worst means
  // The spread over every run (none dropped): min and max; NaN when a run has no value (diverged, not evaluated).
  double eval_loss_min = 0, eval_loss_max = 0, greedy_min = 0, greedy_max = 0;
};
std::vector<EncodingStats> encoding_stats(const ReportInputs& in);

// The results table (markdown), as printed by `rotary compare` and put into report.md.
std::string results_table(const ReportInputs& in);

struct ReportFiles {
  std::string report_md;            // <out_dir>/report.md
  std::vector<std::string> plots;   // the PNGs made
  std::string plot_problem;         // why plots are missing, if they are
};
// Writes report.md and, with gnuplot, loss.png, eval_loss.png and accuracy.png (their data and scripts stay in
// <out_dir>/plots/ so they can be re-plotted by hand).
ReportFiles write_report(const ReportInputs& in);

}  // namespace rotary::experiments
