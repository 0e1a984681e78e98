// lab/train/checkpoint.h: one file that holds everything needed to continue a run exactly where it stopped.
//
// Layout (format version 1):
//   8 bytes   magic "ROTARYCK"
//   4 bytes   format version, little-endian uint32
//   8 bytes   length N of the metadata, little-endian uint64
//   N bytes   metadata JSON: {"format_version", "step", "config" (the full TrainConfig), "data_rng" (the
//             std::mt19937_64 state as text), "payload_bytes", "payload_fnv1a64", "torch_version"}
//   payload   a torch archive (torch::serialize) with "model" (parameters and buffers), "optimizer" (AdamW moments
//             and step counts) and "torch_rng" (the CPU generator, for dropout)
// The file is written atomically (common/files.h), so the last good checkpoint survives any crash; the checksum catches
// a file damaged later.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace rotary::train {

constexpr uint32_t kCheckpointFormatVersion = 1;

struct CheckpointMeta {
  uint32_t format_version = kCheckpointFormatVersion;
  int64_t step = 0;             // optimizer updates completed
  nlohmann::json config;        // TrainConfig as JSON
  std::string data_rng;         // std::mt19937_64 state after the batch of `step`
};

// Writes the checkpoint atomically. `optimizer` may be null (an inference-only export).
void save_checkpoint(const std::string& path, const CheckpointMeta& meta, torch::nn::Module& model,
                     torch::optim::Optimizer* optimizer);

// Reads only the metadata (cheap: the model is not loaded). rotary::Error for a missing file, a bad magic, an
// unknown format version or a truncated file.
CheckpointMeta read_checkpoint_meta(const std::string& path);

// Loads the state into an already constructed model (and optimizer, and the torch generator when
// restore_torch_rng). Checks the checksum. The caller checks the config first (check_config_matches), so the
// module shapes fit.
CheckpointMeta load_checkpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                               bool restore_torch_rng);

// rotary::Error "checkpoint <path> was written for a different run: model.encoding.kind = "roper" there,
// "rope" here" for the first differing non-bookkeeping field (config.h: first_difference).
void check_config_matches(const std::string& path, const nlohmann::json& checkpoint_config,
                          const nlohmann::json& run_config);

std::string rng_to_text(const std::mt19937_64& rng);
std::mt19937_64 rng_from_text(const std::string& text);  // rotary::Error if malformed

}  // namespace rotary::train
