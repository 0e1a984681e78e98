// A Hugging Face model directory opened by the engine: each engine slot read from the stored tensor the family's
// table names, the safetensors kept mapped while the model lives.
#include <map>
#include <set>

#include "rotary/safetensors.h"
#include "rotary_engine/hf_model.h"

namespace rotary::engine {

HfModel open_hf_model(const std::string& model_dir, const LoadOptions& options) {
  HfModel out;
  out.description = read_hf_model_file(model_dir);
  auto weights = std::make_shared<const SafetensorsCheckpoint>(SafetensorsCheckpoint::open(model_dir));
  std::map<std::string, HfTensorName> by_slot;
  for (HfTensorName& n : hf_tensor_names(out.description)) by_slot.emplace(n.slot.name, std::move(n));
  std::set<std::string> used;
  auto lookup = [&](const std::string& slot) {
    const HfTensorName& n = by_slot.at(slot);
    const SafetensorsTensor& t = weights->get(n.stored, n.slot.shape);
    used.insert(n.stored);
    return StoredTensor{t.dtype, t.data, t.shape, n.stored};
  };
  out.model = Model::load(out.description.arch, lookup, options, weights);
  check_hf_tensors_used(out.description, weights->names(), used, model_dir);
  return out;
}

}  // namespace rotary::engine
