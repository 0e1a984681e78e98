// The model files the engine opens - a Hugging Face directory's safetensors, a GGUF file - through one loading path:
// each engine slot read from the stored tensor the format's table names (load_named_tensors), the files kept mapped
// while the model lives, every stored tensor read or named as unused.
#include <filesystem>
#include <map>
#include <set>

#include "rotary/error.h"
#include "rotary/gguf.h"
#include "rotary/safetensors.h"
#include "rotary_engine/gguf_model.h"
#include "rotary_engine/hf_model.h"
#include "tensor_names.h"

namespace rotary::engine {

std::shared_ptr<const Model> load_named_tensors(const Architecture& arch, const std::vector<HfTensorName>& names,
                                                const FindStoredTensor& find, const LoadOptions& options,
                                                std::shared_ptr<const void> keep_alive, std::set<std::string>& used) {
  std::map<std::string, const HfTensorName*> by_slot;
  for (const HfTensorName& n : names) by_slot.emplace(n.slot.name, &n);
  auto lookup = [&](const std::string& slot) {
    const HfTensorName& n = *by_slot.at(slot);
    StoredTensor t = find(n.stored, n.slot.shape);
    t.source = n.stored;
    used.insert(n.stored);
    return t;
  };
  return Model::load(arch, lookup, options, std::move(keep_alive));
}

HfModel open_hf_model(const std::string& model_dir, const LoadOptions& options) {
  HfModel out;
  out.description = read_hf_model_file(model_dir);
  auto weights = std::make_shared<const SafetensorsCheckpoint>(SafetensorsCheckpoint::open(model_dir));
  std::set<std::string> used;
  const auto find = [&](const std::string& stored, const std::vector<int64_t>& shape) {
    const SafetensorsTensor& t = weights->get(stored, shape);
    return StoredTensor{t.dtype, t.data, t.shape, stored, std::nullopt};
  };
  out.model = load_named_tensors(out.description.arch, hf_tensor_names(out.description), find, options, weights, used);
  check_hf_tensors_used(out.description, weights->names(), used, model_dir);
  return out;
}

namespace {

// A GGUF tensor as the engine reads it: the float types and the block formats in place.
StoredTensor gguf_stored(const GgufTensor& t, const std::string& source) {
  StoredTensor s;
  s.data = t.data, s.shape = t.shape();
  switch (t.type) {
    case GgmlType::F32: s.dtype = DType::F32; break;
    case GgmlType::F16: s.dtype = DType::F16; break;
    case GgmlType::BF16: s.dtype = DType::BF16; break;
    case GgmlType::Q8_0: s.blocks = WeightFormat::Q8_0; break;
    case GgmlType::Q4_0: s.blocks = WeightFormat::Q4_0; break;
    case GgmlType::Q4_1: s.blocks = WeightFormat::Q4_1; break;
    case GgmlType::Q5_0: s.blocks = WeightFormat::Q5_0; break;
    case GgmlType::Q5_1: s.blocks = WeightFormat::Q5_1; break;
    case GgmlType::Q4_K: s.blocks = WeightFormat::Q4_K; break;
    case GgmlType::Q5_K: s.blocks = WeightFormat::Q5_K; break;
    case GgmlType::Q6_K: s.blocks = WeightFormat::Q6_K; break;
    default:
      fail(source + ": tensor " + t.name + ".type", ggml_type_name(t.type),
           "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K (the types the engine reads from GGUF)");
  }
  return s;
}

}  // namespace

HfModel open_gguf_model(const std::string& path, const LoadOptions& options) {
  auto file = std::make_shared<const GgufFile>(GgufFile::open(path));
  HfModel out;
  out.description = read_gguf_model(*file);
  std::set<std::string> used;
  const auto find = [&](const std::string& stored, const std::vector<int64_t>& shape) {
    return gguf_stored(file->get_tensor(stored, shape), file->source());
  };
  out.model = load_named_tensors(out.description.arch, gguf_tensor_names(out.description), find, options, file, used);
  // rope_freqs.weight is read into the description's RopeSpec (Llama 3.1's scaling).
  std::vector<std::string> names;
  for (const GgufTensor& t : file->tensors()) names.push_back(t.name);
  check_tensors_used(names, used, [](const std::string& name) { return name == "rope_freqs.weight"; },
                     file->source(),
                     "only the tensors of a " + out.description.model_type + " model as its metadata describes it");
  return out;
}

bool is_gguf_path(const std::string& path) {
  std::error_code ec;
  return std::filesystem::path(path).extension() == ".gguf" && !std::filesystem::is_directory(path, ec);
}

HfModel open_model(const std::string& path, const LoadOptions& options) {
  return is_gguf_path(path) ? open_gguf_model(path, options) : open_hf_model(path, options);
}

}  // namespace rotary::engine
