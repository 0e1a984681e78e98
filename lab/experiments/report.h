// lab/experiments/report.h: the results of `rotary compare` - drop-worst means, the markdown report and its gnuplot
// PNGs (torch-free).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "train/metrics.h"
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
  // The held-out loss whose first crossing gives "steps to reach" (seed 002's convergence speed). Unset: the
  // lowest level every run reached (the highest of the runs' best held-out losses), so every run has a number.
  std::optional<double> target_loss;
};

// target_loss, or the level it defaults to; NaN when no run has a finite held-out loss.
double resolved_target_loss(const ReportInputs& in);

struct EncodingStats {
  std::string encoding;
  int runs = 0;
  double final_train_loss = 0, eval_loss = 0, accuracy_greedy = 0, accuracy_sampled = 0;  // drop-worst means
  // The spread over every run (none dropped): min and max; NaN when a run has no value (diverged, not evaluated).
  double eval_loss_min = 0, eval_loss_max = 0, greedy_min = 0, greedy_max = 0;
  double perplexity = 0;        // exp(eval_loss): per token of the task's vocabulary
  // Steps until the held-out loss first reaches resolved_target_loss (linear between the evaluations around the
  // crossing; drop-worst mean, a run that never reaches it being the worst) and how many runs reached it.
  double steps_to_target = 0;
  int reached_target = 0;
  double tokens_per_s = 0;      // training throughput: each run's median over its steps, drop-worst mean
  // Every run's value, in run order (NaN where a run has none): for judging a difference against the noise.
  std::vector<double> run_eval_loss, run_greedy, run_sampled, run_steps_to_target;
};
std::vector<EncodingStats> encoding_stats(const ReportInputs& in);

// The first step at which a run's held-out loss (its evaluation rows) is <= target, interpolated linearly between
// the evaluation before the crossing and the one at it; NaN if it never is.
double steps_to_loss(const std::vector<train::MetricsRow>& rows, double target);

// The results table (markdown), as printed by `rotary compare` and put into report.md. Accuracy columns appear
// when the task has problems, perplexity when it does not (text).
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
