// Loading a Hugging Face checkpoint's weights into a Transformer: each parameter from the tensor
// hf_tensor_places names, converted to float32, every checkpoint tensor accounted for.
#include "rotary_nn/hf_checkpoint.h"

#include <cstring>
#include <set>

#include "rotary/error.h"
#include "rotary/safetensors.h"

namespace rotary::nn {
namespace {

torch::ScalarType torch_dtype(DType d) {
  switch (d) {
    case DType::F32: return torch::kFloat;
    case DType::F16: return torch::kHalf;
    case DType::BF16: return torch::kBFloat16;
    case DType::F64: return torch::kDouble;
  }
  throw Error("rotary: unexpected safetensors dtype");
}

// A float32 copy of a mapped tensor (memcpy: the format does not promise alignment).
torch::Tensor to_float(const SafetensorsTensor& t) {
  torch::Tensor raw = torch::empty(t.shape, torch::TensorOptions().dtype(torch_dtype(t.dtype)));
  if (t.bytes > 0) std::memcpy(raw.data_ptr(), t.data, t.bytes);
  return raw.to(torch::kFloat);
}

}  // namespace

HfCheckpoint load_hf_checkpoint(const std::string& model_dir) {
  HfCheckpoint out;
  out.spec = hf_model_spec_file(model_dir);
  const SafetensorsCheckpoint weights = SafetensorsCheckpoint::open(model_dir);
  // Every tensor's presence and shape against config.json before the model is allocated from it: a config that
  // lies (vocab_size 2^31 - 1 beside a [64, 32] embedding) is refused at once instead of allocating its size.
  const std::vector<HfTensorPlace> places = hf_tensor_places(out.spec);
  for (const HfTensorPlace& place : places) weights.get(place.theirs, place.their_shape);
  out.model = Transformer(out.spec.config);
  out.model->eval();

  auto params = out.model->named_parameters();
  std::set<std::string> unfilled;
  for (const auto& p : params) unfilled.insert(p.key());
  std::set<std::string> used;
  torch::NoGradGuard no_grad;
  const int64_t heads = out.spec.config.n_heads, hd = out.spec.config.head_dim();
  for (const HfTensorPlace& place : places) {
    torch::Tensor* param = params.find(place.ours);
    if (!param) throw Error("rotary: internal: no parameter " + place.ours + " for " + place.theirs);
    torch::Tensor w = to_float(weights.get(place.theirs, place.their_shape));
    // A NaN or Inf weight poisons every logit after it: refused here, by name, rather than reported as a loss of
    // nan. (A float16 / bfloat16 weight that is finite stays finite in float32.)
    if (!torch::isfinite(w).all().item<bool>()) {
      const int64_t bad = (~torch::isfinite(w)).flatten().nonzero()[0].item<int64_t>();
      fail(model_dir + ": tensor " + place.theirs, "non-finite (element " + std::to_string(bad) + " is " +
               to_text(w.flatten()[bad].item<float>()) + ")", "finite weights");
    }
    if (place.part >= 0) {
      // GPT-NeoX's query_key_value rows: per head [q | k | v], each head_dim rows.
      std::vector<int64_t> split = {heads, 3, hd};
      if (w.dim() == 2) split.push_back(w.size(1));
      w = w.view(split).select(1, place.part).reshape(param->sizes());
    }
    check(w.sizes() == param->sizes(), "internal: " + place.ours, w.sizes(), "the parameter's shape");
    param->copy_(w);
    used.insert(place.theirs);
    unfilled.erase(place.ours);
  }
  if (!unfilled.empty()) throw Error("rotary: internal: parameter " + *unfilled.begin() + " has no checkpoint tensor");

  check_hf_tensors_used(out.spec, weights.names(), used, model_dir);
  return out;
}

}  // namespace rotary::nn
