// rotary::rope_freqs - the inverse frequencies and attention factor of a Hugging Face config's rotary embedding,
// as transformers computes them (rotary/hf_config.h reads the config, RopeSpec::freqs computes in float64):
//
//   torch.ops.rotary.rope_freqs(config_json, seq_len) -> (Tensor inv_freq, float attention_factor)
// inv_freq: float64 [rotary_dim / 2]. seq_len: the sequence length the frequencies are for (only "dynamic" and
// "longrope" depend on it); 0: not longer than max_position_embeddings. rotary.RotaryEmbedding builds the config.
#include <torch/torch.h>

#include "rotary/error.h"
#include "rotary/hf_config.h"
#include "rotary/rope_spec.h"

namespace rotary::torch_ops {
namespace {

std::tuple<at::Tensor, double> rope_freqs(c10::string_view config_json, int64_t seq_len) {
  const RopeSpec spec = rope_spec_from_hf_config(std::string_view(config_json.data(), config_json.size()));
  if (seq_len < 0) fail("seq_len", std::to_string(seq_len), ">= 0 (0: not longer than max_position_embeddings)");
  const RopeFreqs f = spec.freqs(seq_len);
  at::Tensor inv = at::empty({int64_t(f.inv_freq.size())}, at::kDouble);
  std::copy(f.inv_freq.begin(), f.inv_freq.end(), inv.data_ptr<double>());
  return {inv, f.attention_factor};
}

}  // namespace
}  // namespace rotary::torch_ops

TORCH_LIBRARY_FRAGMENT(rotary, m) {
  m.def("rope_freqs(str config_json, int seq_len=0) -> (Tensor, float)", rotary::torch_ops::rope_freqs);
}
