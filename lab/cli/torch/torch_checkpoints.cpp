// --engine torch for every checkpoint command (generate, perplexity): the nn model installed as CheckpointModel's
// torch runtime when this rotary is built with libtorch (experiments/torch_checkpoint.h).
#include "experiments/torch_checkpoint.h"

namespace rotary::cli {
namespace {

const bool kTorchCheckpoints = (experiments::use_torch_checkpoints(), true);

}  // namespace
}  // namespace rotary::cli
