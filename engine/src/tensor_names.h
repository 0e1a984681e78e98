// engine/src/tensor_names.h (internal): what the checkpoint formats the engine opens share - a table of a format's
// tensor names -> engine slots, the check that every stored tensor was read, and the one loading path from a
// format's lookup of stored tensors into Model::load (a Hugging Face directory's safetensors, a GGUF file).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "rotary_engine/hf_model.h"

namespace rotary::engine {

// One format's (or family's) tensor names: the module of each slot part, outside the blocks and inside them (after
// `layer_prefix` and the block's index); a slot's stored name is the module + ".weight" or ".bias".
struct TensorNameTable {
  std::string_view layer_prefix;
  std::map<std::string_view, std::string_view> parts;
};
// Every slot of `arch`, in tensor_slots' order, with its stored name under `table`.
std::vector<HfTensorName> named_slots(const TensorNameTable& table, const Architecture& arch);

// Every stored tensor (`names`) must be read (`used`) or `allowed`: rotary::Error naming `where`'s tensors (the first
// five) and `expected` otherwise.
void check_tensors_used(const std::vector<std::string>& names, const std::set<std::string>& used,
                        const std::function<bool(const std::string&)>& allowed, const std::string& where,
                        const std::string& expected);

// Model::load over a format's names: each slot's tensor is `find(stored name, the slot's shape)` (which checks the
// shape and names the file), and the stored names read are added to `used`.
using FindStoredTensor = std::function<StoredTensor(const std::string& stored, const std::vector<int64_t>& shape)>;
std::shared_ptr<const Model> load_named_tensors(const Architecture& arch, const std::vector<HfTensorName>& names,
                                                const FindStoredTensor& find, const LoadOptions& options,
                                                std::shared_ptr<const void> keep_alive, std::set<std::string>& used);

}  // namespace rotary::engine
