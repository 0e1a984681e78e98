// lab/train/checkpoint.h: one file that holds everything needed to continue a run exactly where it stopped.
//
// The file layout, its checksum over every byte and the checks on the metadata are in checkpoint_file.h (torch-free).
// The payload is a torch archive (torch::serialize) with "model" (parameters and buffers), "optimizer" (AdamW
// moments and step counts) and "torch_rng" (the CPU generator, for dropout). The file is written atomically
// (common/files.h), so the last good checkpoint survives any crash; the checksum catches a file damaged later.
#pragma once

#include <torch/torch.h>

#include <string>

#include "rotary_nn/model.h"
#include "train/checkpoint_file.h"
#include "train/config.h"

namespace rotary::train {

// Writes the checkpoint atomically. `optimizer` may be null (an inference-only export).
void save_checkpoint(const std::string& path, const CheckpointMeta& meta, torch::nn::Module& model,
                     torch::optim::Optimizer* optimizer);

// Reads and checks the whole file (checkpoint_file.h: decode_checkpoint) but loads no tensors. rotary::Error
// naming the file for a missing, truncated, damaged or out-of-range one.
CheckpointMeta read_checkpoint_meta(const std::string& path);

// Loads the state into an already constructed model (and optimizer, and the torch generator when
// restore_torch_rng), after the checks of read_checkpoint_meta. The caller checks the config first (check_config_matches), so the
// module shapes fit.
CheckpointMeta load_checkpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                               bool restore_torch_rng);

// A trained model ready to score or generate: what `rotary eval`, `generate`, `decay` and `extrapolate` load.
struct TrainedModel {
  std::string checkpoint;  // the file
  std::string run_dir;     // its directory
  TrainConfig config;      // the run's settings, as stored (validated when read)
  int64_t step = 0;
  nn::Transformer model{nullptr};  // in eval mode
};

// The checkpoint file of `where`: the file itself, or <where>/checkpoint.pt for a run directory. rotary::Error
// naming `where` if neither exists.
std::string resolve_checkpoint(const std::string& where);
// Reads the checkpoint of `where` once (all of checkpoint_file.h's checks), builds the model its config describes
// and loads its parameters.
TrainedModel load_trained_model(const std::string& where);

// rotary::Error "checkpoint <path> was written for a different run: model.encoding.kind = "roper" there,
// "rope" here" for the first differing non-bookkeeping field (config.h: first_difference).
void check_config_matches(const std::string& path, const nlohmann::json& checkpoint_config,
                          const nlohmann::json& run_config);

}  // namespace rotary::train
