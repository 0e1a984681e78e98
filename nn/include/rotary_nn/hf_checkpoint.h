// rotary_nn/hf_checkpoint.h: a Hugging Face model directory (config.json + safetensors, one file or sharded)
// loaded as a rotary Transformer, so every position method of the lab runs on real checkpoints.
//
// The weights are memory-mapped (rotary::SafetensorsCheckpoint) and copied once into float32 parameters (stored
// F32, F16, BF16 or F64): the lab's kernels compute in float32, and the mapping is released after loading.
// Families and what is read from config.json: rotary_nn/hf_model.h; how to run one: docs/checkpoints.md.
#pragma once

#include <string>

#include "rotary_nn/hf_model.h"
#include "rotary_nn/model.h"

namespace rotary::nn {

struct HfCheckpoint {
  HfModelSpec spec;
  Transformer model{nullptr};  // in eval mode
};

// rotary::Error naming the directory, the tensor and the field for a missing or mis-shaped tensor, a tensor the
// architecture does not use (another architecture's checkpoint), and everything hf_model_spec and
// SafetensorsCheckpoint refuse.
HfCheckpoint load_hf_checkpoint(const std::string& model_dir);

}  // namespace rotary::nn
