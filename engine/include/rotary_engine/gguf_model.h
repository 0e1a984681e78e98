// rotary_engine/gguf_model.h: a GGUF file (llama.cpp's model format) opened by the engine as a model directory is
// (rotary_engine/hf_model.h): its metadata read as the engine's Architecture and RopeSpec (the same description the
// same model's config.json gives), its tensors found by one table of GGUF names -> engine slots and read in place
// through the core's mapping (rotary/gguf.h), the same loading path as safetensors (engine/src/tensor_names.h).
//
// Metadata read (`{arch}` is general.architecture; counts are uint32, floats float32, as llama.cpp writes them):
//   general.architecture                      llama (Llama 2 / 3, Mistral, TinyLlama) or qwen2 (Qwen2 / 2.5)
//   {arch}.block_count, embedding_length, feed_forward_length, attention.head_count, attention.head_count_kv
//   (default: head_count), attention.layer_norm_rms_epsilon, context_length, attention.key_length (default:
//   embedding_length / head_count), rope.dimension_count (default: the head dim), rope.freq_base (default 10000),
//   rope.scaling.type none / linear / yarn with rope.scaling.factor and rope.scaling.original_context_length (yarn:
//   rope.scaling.yarn_beta_fast / yarn_beta_slow / yarn_attn_factor where present), or the older rope.scale_linear.
//   Llama 3.1's llama3 scaling is the tensor rope_freqs.weight (per-pair frequency divisors, as llama.cpp's
//   converter writes it): read as RopeScaling::Explicit with those factors.
// Biases: qwen2 has q, k, v biases; a llama file has them where blk.0.attn_q.bias (attention) or blk.0.ffn_up.bias
// (MLP) is stored. The head is tied when output.weight is absent. The vocabulary is token_embd.weight's rows.
//
// The RoPE layout: llama.cpp's converter permutes the q and k rows of `llama` models per head so that ggml's normal
// rope (adjacent pairs) computes Hugging Face's rotate-half; qwen2 is written unpermuted and runs ggml's NEOX rope.
// So a llama file's RopeSpec has RopeLayout::Interleaved and its weights stay in place (the same rotation of the
// same numbers as the directory's half-split layout; the attention kernels sum q.k in another feature order, so
// logits agree to float32 rounding, not bit for bit); qwen2's is HalfSplit as its config.json's.
//
// Tensor types: F32, F16, BF16 read in place as safetensors' are; Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K
// (llama.cpp's block formats; llama-quantize's Q4_K_M / Q5_K_M write Q5_0 / Q5_1 / Q8_0 for the tensors whose rows
// are not whole 256-value super-blocks) used in place by the linear layers (StoredTensor::blocks; --activations q8
// runs them on integer products), any mix of them in one file. Any other type is refused naming the tensor, its type
// and this list.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "rotary/gguf.h"
#include "rotary_engine/hf_model.h"

namespace rotary::engine {

inline constexpr std::string_view kGgufArchitectures[] = {"llama", "qwen2"};

// The GGUF file's metadata -> the description (model_type: general.architecture). rotary::Error naming the file, the
// key (or tensor), its value and what is allowed for an unknown architecture (listing kGgufArchitectures), a missing
// or ill-typed key, a number out of range, a rope scaling type the engine does not run, or a shape the engine cannot
// run.
HfModelDescription read_gguf_model(const GgufFile& file);
// Every slot of the description's architecture with its GGUF tensor name (token_embd.weight, blk.N.attn_q.weight,
// ...), in tensor_slots' order.
std::vector<HfTensorName> gguf_tensor_names(const HfModelDescription& model);

// A GGUF file opened: described, mapped (kept mapped while the model lives), every tensor found, checked and used in
// place or converted (LoadOptions). rotary::Error naming the file, the tensor and the field for everything refused
// (a missing or mis-shaped tensor, an unsupported type, a tensor the architecture does not use, ...).
HfModel open_gguf_model(const std::string& path, const LoadOptions& options = {});

}  // namespace rotary::engine
