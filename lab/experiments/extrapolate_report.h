// lab/experiments/extrapolate_report.h: the tables, results.csv, gnuplot PNGs and report.md of `rotary extrapolate`.
#pragma once

#include <string>
#include <vector>

#include "experiments/extrapolate.h"

namespace rotary::experiments {

struct ReportInput {
  const ExtrapolateSpec& spec;
  int train_len = 0;
  std::vector<int> lengths;        // ascending
  std::vector<int64_t> sweep;      // ReRoPE windows of the sweep
  const std::vector<ModelInfo>& models;
  const std::vector<Cell>& cells;
  double seconds = 0;
};

struct ReportOutput {
  std::string report_md;
  std::vector<std::string> plots;
  std::string plot_problem;
};

// Seed 004's table: one row per method, next-token accuracy at L (train), at the longest length on repeated
// windows and on ordinary text (and retrieval exact match there when scored). Markdown.
std::string seed_table(const ReportInput& in);

// Methods x lengths of one metric ("text", "repeated", "retrieval"); loss instead of accuracy when `loss`.
std::string length_table(const ReportInput& in, const std::string& metric, bool loss);

// The ReRoPE window sweep: windows x (lengths of the sweep) x (text, repeated) accuracy.
std::string sweep_table(const ReportInput& in);

// Writes <out>/results.csv, the plots (loss_vs_position, loss_vs_length, accuracy_vs_length, repeated_vs_length,
// retrieval_vs_length, window_sweep; data and script in <out>/plots/) and <out>/report.md.
ReportOutput write_extrapolate_report(const ReportInput& in);

}  // namespace rotary::experiments
