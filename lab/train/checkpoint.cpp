// lab/train/checkpoint.cpp
#include "train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "common/files.h"
#include "rotary/error.h"
#include "train/config.h"

namespace rotary::train {
namespace {

constexpr char kMagic[8] = {'R', 'O', 'T', 'A', 'R', 'Y', 'C', 'K'};
constexpr size_t kHeaderBytes = 8 + 4 + 8;

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

template <class T>
void put_le(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

template <class T>
T get_le(const char* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

struct Parsed {
  CheckpointMeta meta;
  nlohmann::json meta_json;
  size_t payload_offset = 0;
};

Parsed parse_header(const std::string& path, const std::string& bytes, bool whole_file) {
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 8) != 0)
    throw Error("rotary: " + path + " is not a rotary checkpoint (no ROTARYCK header)");
  Parsed p;
  p.meta.format_version = get_le<uint32_t>(bytes.data() + 8);
  check(p.meta.format_version == kCheckpointFormatVersion, "checkpoint format_version", p.meta.format_version,
        std::to_string(kCheckpointFormatVersion) + " (written by another version of rotary)");
  const uint64_t meta_len = get_le<uint64_t>(bytes.data() + 12);
  if (bytes.size() < kHeaderBytes + meta_len) throw Error("rotary: checkpoint " + path + " is truncated (metadata)");
  p.meta_json = nlohmann::json::parse(bytes.substr(kHeaderBytes, meta_len), nullptr, false);
  if (!p.meta_json.is_object() || !p.meta_json.contains("step") || !p.meta_json.contains("config"))
    throw Error("rotary: checkpoint " + path + " has unreadable metadata");
  p.meta.step = p.meta_json["step"].get<int64_t>();
  p.meta.config = p.meta_json["config"];
  p.meta.data_rng = p.meta_json.value("data_rng", "");
  p.payload_offset = kHeaderBytes + meta_len;
  if (whole_file) {
    const uint64_t want = p.meta_json["payload_bytes"].get<uint64_t>();
    if (bytes.size() - p.payload_offset != want)
      throw Error("rotary: checkpoint " + path + " is truncated: payload has " +
                  std::to_string(bytes.size() - p.payload_offset) + " bytes, expected " + std::to_string(want));
    const std::string sum = hex64(fnv1a64(std::string_view(bytes).substr(p.payload_offset)));
    if (sum != p.meta_json["payload_fnv1a64"].get<std::string>())
      throw Error("rotary: checkpoint " + path + " is damaged (payload checksum " + sum + ", expected " +
                  p.meta_json["payload_fnv1a64"].get<std::string>() + ")");
  }
  return p;
}

}  // namespace

std::string rng_to_text(const std::mt19937_64& rng) {
  std::ostringstream os;
  os << rng;
  return os.str();
}

std::mt19937_64 rng_from_text(const std::string& text) {
  std::mt19937_64 rng;
  std::istringstream in(text);
  in >> rng;
  if (in.fail()) fail("checkpoint data_rng", text.substr(0, 40) + "...", "a std::mt19937_64 state");
  return rng;
}

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
  const std::string payload = payload_stream.str();

  nlohmann::json mj{{"format_version", kCheckpointFormatVersion},
                    {"step", meta.step},
                    {"config", meta.config},
                    {"data_rng", meta.data_rng},
                    {"payload_bytes", payload.size()},
                    {"payload_fnv1a64", hex64(fnv1a64(payload))},
                    {"torch_version", TORCH_VERSION}};
  const std::string meta_text = mj.dump();
  std::string bytes(kMagic, 8);
  put_le<uint32_t>(bytes, kCheckpointFormatVersion);
  put_le<uint64_t>(bytes, meta_text.size());
  bytes += meta_text;
  bytes += payload;
  lab::write_file_atomic(path, bytes);
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  if (!lab::file_exists(path)) throw Error("rotary: checkpoint " + path + " does not exist");
  // The metadata sits at the front; read just enough of the file.
  std::ifstream in(path, std::ios::binary);
  std::string head(kHeaderBytes, '\0');
  in.read(head.data(), kHeaderBytes);
  head.resize(static_cast<size_t>(in.gcount()));
  if (head.size() == kHeaderBytes && std::memcmp(head.data(), kMagic, 8) == 0) {
    const uint64_t meta_len = get_le<uint64_t>(head.data() + 12);
    std::string meta(meta_len, '\0');
    in.read(meta.data(), static_cast<std::streamsize>(meta_len));
    meta.resize(static_cast<size_t>(in.gcount()));
    head += meta;
  }
  return parse_header(path, head, false).meta;
}

CheckpointMeta load_checkpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                               bool restore_torch_rng) {
  if (!lab::file_exists(path)) throw Error("rotary: checkpoint " + path + " does not exist");
  const std::string bytes = lab::read_file(path);
  Parsed p = parse_header(path, bytes, true);
  torch::serialize::InputArchive root, model_ar, optim_ar;
  root.load_from(bytes.data() + p.payload_offset, bytes.size() - p.payload_offset);
  root.read("model", model_ar);
  model.load(model_ar);
  if (optimizer) {
    if (!root.try_read("optimizer", optim_ar))
      throw Error("rotary: checkpoint " + path + " has no optimizer state (an inference export?); cannot resume from it");
    optimizer->load(optim_ar);
  }
  if (restore_torch_rng) {
    torch::Tensor state;
    if (root.try_read("torch_rng", state)) {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
  }
  return p.meta;
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
