// lab/experiments/torch_checkpoint.h: --engine torch for CheckpointModel (the nn float32 model), in the torch build.
#pragma once

namespace rotary::experiments {

// Installs the nn model as the loader of --engine torch (set_torch_checkpoint_loader).
void use_torch_checkpoints();

}  // namespace rotary::experiments
