// lab/train/summary.h: what a finished run leaves in <out_dir>/summary.json (torch-free). Its presence marks
// the run as complete (compare skips such runs when rerun).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace rotary::train {

struct RunSummary {
  std::string status = "finished";       // finished | non_finite (diverged: metrics are NaN)
  int64_t steps = 0;
  double seconds = 0;                       // wall time of the last process that worked on the run
  double final_train_loss = 0;              // mean training loss of the last 5% of steps (at least one)
  std::optional<double> eval_loss;          // held-out loss at the end
  std::optional<double> accuracy_greedy;    // exact match, greedy decoding
  std::optional<double> accuracy_sampled;   // exact match, sampling at temperature 1 (seed 000's protocol)
  int problems = 0;
  nlohmann::json config;                    // the run's TrainConfig
};

void to_json(nlohmann::json& j, const RunSummary& s);
void from_json(const nlohmann::json& j, RunSummary& s);

// Reads <dir>/summary.json; nullopt if there is none (an unfinished run).
std::optional<RunSummary> read_summary(const std::string& dir);
void write_summary(const std::string& dir, const RunSummary& s);

}  // namespace rotary::train
