// engine/src/model_impl.h (internal): what a loaded Model holds - per layer the matrices (in place or owned) and
// the float32 norms and biases - and the norm the session uses.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "rotary/linear.h"
#include "rotary_engine/model.h"

namespace rotary::engine {

struct Linear {
  WeightMatrix w;  // data null: absent (e.g. gate without SwiGLU)
  const float* bias = nullptr;
};
struct NormWeights {
  const float* weight = nullptr;
  const float* bias = nullptr;  // LayerNorm only
};
struct Layer {
  NormWeights attn_norm, mlp_norm;
  Linear q, k, v, qkv, o, gate, up, down;  // qkv: fused_qkv only, else q, k, v
};

struct Model::Impl {
  Architecture arch;
  std::shared_ptr<const void> keep_alive;  // the stored bytes (mapped files)
  std::deque<std::vector<uint8_t>> owned;  // converted matrices
  std::deque<std::vector<float>> owned_floats;     // norms, biases
  std::deque<std::vector<uint16_t>> owned_halves;  // q8 weights' block scales (f16 bits)
  int64_t owned_bytes = 0;
  uint64_t weights_hash = 0;  // Model::weights_hash
  WeightMatrix embed;
  std::vector<Layer> layers;
  NormWeights final_norm;
  Linear head;
  ActivationFormat activations = ActivationFormat::F32;  // of every product (all bf16 matrices when bf16)
};

// out = norm(x) for n rows of d: RMSNorm x / sqrt(mean x^2 + eps) * weight, or LayerNorm (x - mean) / sqrt(var +
// eps) * weight + bias; the means in double.
void apply_norm(NormKind kind, const NormWeights& w, double eps, const float* x, int64_t n, int64_t d, float* out,
                int threads);

}  // namespace rotary::engine
