// lab/train/checkpoint.cpp
#include "train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <mutex>
#include <sstream>

#include "common/files.h"
#include "rotary/error.h"
#include "rotary/files.h"
#include "train/config.h"
#include "train/trainer.h"

namespace rotary::train {

void save_checkpoint(const std::string& path, const CheckpointMeta& meta, torch::nn::Module& model,
                     torch::optim::Optimizer* optimizer) {
  torch::serialize::OutputArchive root, model_ar, optim_ar;
  model.save(model_ar);
  root.write("model", model_ar);
  if (optimizer) {
    optimizer->save(optim_ar);
    root.write("optimizer", optim_ar);
  }
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    root.write("torch_rng", gen.get_state());
  }
  std::ostringstream payload_stream;
  root.save_to(payload_stream);
  lab::write_file_atomic(path, encode_checkpoint(meta, payload_stream.str(), TORCH_VERSION));
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  return decode_checkpoint(path, read_checkpoint_bytes(path)).meta;
}

namespace {

// The payload (a torch archive) into the model, the optimizer and the torch generator.
void load_payload(const std::string& path, std::string_view payload, torch::nn::Module& model,
                  torch::optim::Optimizer* optimizer, bool restore_torch_rng) {
  torch::serialize::InputArchive root, model_ar, optim_ar;
  bool has_optimizer = false;
  try {
    root.load_from(payload.data(), payload.size());
    root.read("model", model_ar);
    model.load(model_ar);
    has_optimizer = optimizer && root.try_read("optimizer", optim_ar);
    if (has_optimizer) optimizer->load(optim_ar);
  } catch (const c10::Error& e) {
    // The checksum held, so the bytes are as written: a payload torch cannot read was written by another torch or
    // made by hand. Say so in one line (torch's message carries C++ frames after its first line).
    const std::string first_line = std::string(e.what_without_backtrace()).substr(0, 200);
    throw Error("rotary: checkpoint " + path + " has a payload torch cannot read (torch " + TORCH_VERSION +
                "): " + first_line.substr(0, first_line.find('\n')));
  }
  if (optimizer && !has_optimizer)
    throw Error("rotary: checkpoint " + path + " has no optimizer state (an inference export?); cannot resume from it");
  if (restore_torch_rng) {
    torch::Tensor state;
    if (root.try_read("torch_rng", state)) {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
  }
}

}  // namespace

CheckpointMeta load_checkpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                               bool restore_torch_rng) {
  const std::string bytes = read_checkpoint_bytes(path);
  const DecodedCheckpoint d = decode_checkpoint(path, bytes);
  load_payload(path, d.payload, model, optimizer, restore_torch_rng);
  return d.meta;
}

std::string resolve_checkpoint(const std::string& where) {
  // Something that is there but is neither a file nor a directory (a FIFO, a device) is named as what it is.
  std::error_code ec;
  if (std::filesystem::exists(where, ec) && !std::filesystem::is_directory(where, ec))
    check_regular_file(where, "checkpoint", "a checkpoint file or a run directory");
  const std::string path = lab::file_exists(where) ? where : checkpoint_path(where);
  if (!lab::file_exists(path))
    throw Error("rotary: no checkpoint at " + where + " (give a checkpoint file or a run directory)");
  return path;
}

TrainedModel load_trained_model(const std::string& where) {
  TrainedModel t;
  t.checkpoint = resolve_checkpoint(where);
  const auto slash = t.checkpoint.find_last_of('/');
  t.run_dir = slash == std::string::npos ? "." : t.checkpoint.substr(0, slash);
  const std::string bytes = read_checkpoint_bytes(t.checkpoint);
  const DecodedCheckpoint d = decode_checkpoint(t.checkpoint, bytes);
  from_json(d.meta.config, t.config);
  t.step = d.meta.step;
  t.model = nn::Transformer(t.config.model);
  load_payload(t.checkpoint, d.payload, *t.model, nullptr, /*restore_torch_rng=*/false);
  t.model->eval();
  return t;
}

void check_config_matches(const std::string& path, const nlohmann::json& checkpoint_config,
                          const nlohmann::json& run_config) {
  const std::string field = first_difference(checkpoint_config, run_config);
  if (field.empty()) return;
  throw Error("rotary: checkpoint " + path + " was written for a different run: " + field + " = " +
              value_at(checkpoint_config, field) + " in the checkpoint, " + value_at(run_config, field) +
              " in this run (start a new --out directory, or resume without changing " + field + ")");
}

}  // namespace rotary::train
