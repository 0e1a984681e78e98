// lab/train/config.h: everything that defines a training run, its JSON form (stored in checkpoints) and its
// TOML form (`rotary train --config run.toml`; flags override the file).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "rotary_nn/config.h"
#include "tasks/task.h"

namespace rotary::train {

struct OptimConfig {
  double lr = 1e-3;  // AdamW peak learning rate
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.1;   // decoupled; applied to matrices only (not to norms, biases)
  int64_t warmup_steps = 100;  // linear warm-up, then cosine decay to lr * min_lr_ratio at the last step
  double min_lr_ratio = 0.1;
  double grad_clip = 1.0;      // max global gradient norm; 0 = no clipping
};

struct TrainConfig {
  std::string task = "addition";
  lab::TaskOptions task_options;
  nn::ModelConfig model;  // model.vocab_size 0 = take it from the task's vocabulary
  int seq_len = 256;
  int batch_size = 16;    // the GLOBAL batch: data-parallel ranks each take batch_size / world rows
  int64_t steps = 1000;
  uint64_t seed = 0;      // parameters, data order and dropout
  OptimConfig optim;
  int64_t eval_interval = 100;     // 0 = only at the end
  int eval_batches = 2;            // held-out rows = eval_batches * batch_size
  int eval_problems = 32;          // exact-match problems per evaluation (0 = none)
  uint64_t eval_seed = 1234;       // held-out rows and problems are the same for every run, whatever its seed
  int64_t checkpoint_interval = 0; // 0 = at every evaluation
  std::string out_dir = "runs/train";
  int threads = 0;                 // torch intra-op threads; 0 = cores / processes
  // A curriculum: a fresh run's parameters start as those of another run (a run directory or checkpoint file) -
  // e.g. a model that learned the lookup on one-letter keys, trained on two-letter ones. Every parameter must
  // match by name and shape; the optimizer, schedule and data start afresh. Empty: the model's own start.
  std::string init_from;

  // rotary::Error naming the first bad field: each inside its declared range (train_settings), then the rules
  // between fields (the model's through ModelConfig::validate).
  void validate() const;
};

// Every setting of a run declared once - JSON path, flag, help, allowed values (rotary/settings.h): the task's
// options (lab::task_option_settings), the model's (nn::model_settings) and the run's own. JSON, TOML files, the
// flags of `rotary train` / `compare` / `extrapolate`, validate() and --print-config all come from it.
const settings::Table<TrainConfig>& train_settings();

void to_json(nlohmann::json& j, const TrainConfig& c);
// Fields missing from `j` keep their values; unknown or ill-typed fields, unknown names and values outside their
// declared range are a rotary::Error naming the field ("optim.lr").
void from_json(const nlohmann::json& j, TrainConfig& c);
// The config as a commented TOML file (every setting, its flag and allowed values) that --config reads back.
std::string to_toml(const TrainConfig& c);

// A TOML document as JSON (tables -> objects, arrays -> arrays, scalars -> scalars; dates are rejected).
nlohmann::json toml_to_json(const std::string& toml_text, const std::string& source_name);
// Reads a TOML run description over the defaults; rotary::Error names the file, the line of a syntax error, or
// the bad field.
TrainConfig load_config_file(const std::string& path);
// The same for TOML text; `source_name` names it in errors (a file name).
TrainConfig load_config_text(const std::string& toml_text, const std::string& source_name);

// Fields that do not change what the run computes: they may differ between a checkpoint and the run resuming
// it (the output directory, threads, how often to checkpoint).
bool is_bookkeeping_field(const std::string& json_path);
// The first field (dotted path, e.g. "model.encoding.kind") where two configs differ, ignoring bookkeeping
// fields; empty when they describe the same run.
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b, const std::string& prefix = "");
// The value at a dotted path as text, "<absent>" if missing.
std::string value_at(const nlohmann::json& j, const std::string& dotted_path);

}  // namespace rotary::train
