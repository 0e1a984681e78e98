// lab/cli/torch/checkpoint_flags.h: the flags that choose how a Hugging Face checkpoint runs (--engine, --weights,
// --kv-dtype), declared once for every command that runs one (perplexity, generate, bench checkpoint).
#pragma once

#include <CLI/CLI.hpp>

#include <vector>

#include "experiments/checkpoint_model.h"

namespace rotary::cli {

// Returns the three options (a command that also runs other models refuses them there).
inline std::vector<CLI::Option*> add_checkpoint_run_flags(CLI::App& app, experiments::CheckpointRunOptions& o) {
  return {app.add_option("--engine", o.engine,
                 "engine: the torch-free engine, weights used in place (default); torch: the nn model with float32 "
                 "copies of the weights (the reference path)"),
          app.add_option("--weights", o.weights,
                 "engine: convert the weight matrices at load to f32, f16, bf16 or q8 (int8 blocks of 32 with a "
                 "scale; default: as stored)"),
          app.add_option("--kv-dtype", o.kv_dtype, "engine: KV cache storage f32, bf16, f16 (default f32)")};
}

}  // namespace rotary::cli
