// lab/train/checkpoint_file.cpp: see checkpoint_file.h.
#include "train/checkpoint_file.h"

#include <sys/stat.h>

#include <cstring>
#include <sstream>

#include "common/files.h"
#include "rotary/error.h"
#include "rotary/json_guard.h"
#include "rotary/parse_number.h"
#include "train/config.h"

namespace rotary::train {
namespace {

using lab::fnv1a64;

constexpr char kMagic[8] = {'R', 'O', 'T', 'A', 'R', 'Y', 'C', 'K'};
constexpr size_t kHeaderV1 = 8 + 4 + 8;      // magic, version, metadata length
constexpr size_t kHeaderV2 = 8 + 4 + 8 + 8;  // ... and the payload length
constexpr size_t kTrailerV2 = 8;              // checksum
constexpr uint64_t kMaxFileBytes = uint64_t{64} << 30;

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

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw Error("rotary: checkpoint " + path + " " + why);
}

// A metadata field for a message: short, whatever the file holds.
std::string shown(const nlohmann::json& v) { return json_excerpt(v, 60); }

// Every metadata field range-checked; `known` lists the keys this version writes.
CheckpointMeta meta_from_json(const std::string& path, const nlohmann::json& j, uint32_t version,
                              std::initializer_list<const char*> known) {
  if (!j.is_object()) bad(path, "has unreadable metadata (not a JSON object)");
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) bad(path, "has an unknown metadata field \"" + it.key().substr(0, 60) + "\"");
  }
  CheckpointMeta m;
  m.format_version = version;
  if (!j.contains("config") || !j["config"].is_object()) bad(path, "has no config in its metadata");
  m.config = j["config"];
  TrainConfig config;
  try {
    from_json(m.config, config);
    config.validate();
  } catch (const Error& e) {
    bad(path, "holds an invalid config: " + std::string(e.what()));
  }
  if (!j.contains("step") || !j["step"].is_number_integer())
    bad(path, "has metadata step = " + (j.contains("step") ? shown(j["step"]) : "<absent>") +
                  "; allowed: an integer in [0, config.steps]");
  // is_number_integer holds for int64 and uint64 values; compare in the type that holds it.
  const bool in_range = j["step"].is_number_unsigned() ? j["step"].get<uint64_t>() <= static_cast<uint64_t>(config.steps)
                                                       : j["step"].get<int64_t>() >= 0 &&
                                                             j["step"].get<int64_t>() <= config.steps;
  if (!in_range)
    bad(path, "has metadata step = " + shown(j["step"]) + "; allowed: an integer in [0, " +
                  std::to_string(config.steps) + "] (config.steps)");
  m.step = j["step"].get<int64_t>();
  if (j.contains("data_rng")) {
    if (!j["data_rng"].is_string()) bad(path, "has metadata data_rng = " + shown(j["data_rng"]) + "; allowed: a string");
    m.data_rng = j["data_rng"].get<std::string>();
    if (!m.data_rng.empty()) {
      try {
        (void)rng_from_text(m.data_rng);
      } catch (const Error& e) {
        bad(path, "holds a bad data generator state: " + std::string(e.what()));
      }
    }
  }
  if (j.contains("torch_version") && !j["torch_version"].is_string())
    bad(path, "has metadata torch_version = " + shown(j["torch_version"]) + "; allowed: a string");
  return m;
}

nlohmann::json parse_meta(const std::string& path, std::string_view text) {
  try {
    return parse_json(text, "checkpoint " + path + " metadata");  // nesting bounded (rotary/json_guard.h)
  } catch (const Error& e) {
    bad(path, "has unreadable metadata: " + std::string(e.what()));
  }
}

DecodedCheckpoint decode_v1(const std::string& path, std::string_view bytes) {
  if (bytes.size() < kHeaderV1) bad(path, "is truncated (header)");
  const uint64_t meta_len = get_le<uint64_t>(bytes.data() + 12);
  if (meta_len > bytes.size() - kHeaderV1)
    bad(path, "is truncated: metadata length " + std::to_string(meta_len) + " but " +
                  std::to_string(bytes.size() - kHeaderV1) + " bytes follow the header");
  const nlohmann::json j = parse_meta(path, bytes.substr(kHeaderV1, meta_len));
  const std::string_view payload = bytes.substr(kHeaderV1 + meta_len);
  if (!j.is_object() || !j.contains("payload_bytes") || !j["payload_bytes"].is_number_unsigned() ||
      !j.contains("payload_fnv1a64") || !j["payload_fnv1a64"].is_string())
    bad(path, "has unreadable metadata (format 1 without payload_bytes / payload_fnv1a64)");
  if (payload.size() != j["payload_bytes"].get<uint64_t>())
    bad(path, "is truncated: payload has " + std::to_string(payload.size()) + " bytes, expected " +
                  shown(j["payload_bytes"]));
  const std::string sum = hex64(fnv1a64(payload));
  if (sum != j["payload_fnv1a64"].get<std::string>())
    bad(path, "is damaged (payload checksum " + sum + ", expected " + shown(j["payload_fnv1a64"]) + ")");
  DecodedCheckpoint d;
  d.meta = meta_from_json(path, j, 1,
                          {"format_version", "step", "config", "data_rng", "payload_bytes", "payload_fnv1a64",
                           "torch_version"});
  d.payload = payload;
  return d;
}

}  // namespace

std::string encode_checkpoint(const CheckpointMeta& meta, std::string_view payload, std::string_view torch_version) {
  const std::string meta_text = nlohmann::json{{"step", meta.step},
                                               {"config", meta.config},
                                               {"data_rng", meta.data_rng},
                                               {"torch_version", std::string(torch_version)}}
                                    .dump();
  std::string bytes(kMagic, 8);
  bytes.reserve(kHeaderV2 + meta_text.size() + payload.size() + kTrailerV2);
  put_le<uint32_t>(bytes, kCheckpointFormatVersion);
  put_le<uint64_t>(bytes, meta_text.size());
  put_le<uint64_t>(bytes, payload.size());
  bytes += meta_text;
  bytes += payload;
  put_le<uint64_t>(bytes, fnv1a64(bytes));
  return bytes;
}

DecodedCheckpoint decode_checkpoint(const std::string& path, std::string_view bytes) {
  if (bytes.size() < 12 || std::memcmp(bytes.data(), kMagic, 8) != 0)
    throw Error("rotary: " + path + " is not a rotary checkpoint (no ROTARYCK header)");
  const uint32_t version = get_le<uint32_t>(bytes.data() + 8);
  if (version == 1) return decode_v1(path, bytes);
  check(version == kCheckpointFormatVersion, "checkpoint " + path + ": format_version", version,
        "1 or 2 (written by another version of rotary)");
  if (bytes.size() < kHeaderV2 + kTrailerV2) bad(path, "is truncated (header)");
  const uint64_t meta_len = get_le<uint64_t>(bytes.data() + 12);
  const uint64_t payload_len = get_le<uint64_t>(bytes.data() + 20);
  const uint64_t room = bytes.size() - kHeaderV2 - kTrailerV2;  // what the two lengths must add up to
  if (meta_len > room || payload_len != room - meta_len)
    bad(path, "is truncated or damaged: its header gives " + std::to_string(meta_len) + " metadata and " +
                  std::to_string(payload_len) + " payload bytes, the file holds " + std::to_string(room));
  const std::string_view body = bytes.substr(0, bytes.size() - kTrailerV2);
  const uint64_t want = get_le<uint64_t>(bytes.data() + body.size());
  const uint64_t sum = fnv1a64(body);
  if (sum != want) bad(path, "is damaged (checksum " + hex64(sum) + ", expected " + hex64(want) + ")");
  DecodedCheckpoint d;
  d.meta = meta_from_json(path, parse_meta(path, bytes.substr(kHeaderV2, meta_len)), version,
                          {"step", "config", "data_rng", "torch_version"});
  d.payload = bytes.substr(kHeaderV2 + meta_len, payload_len);
  return d;
}

std::string read_checkpoint_bytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) bad(path, "does not exist (or is not a file)");
  if (static_cast<uint64_t>(st.st_size) > kMaxFileBytes)
    bad(path, "is " + std::to_string(st.st_size) + " bytes; a checkpoint of this lab is at most 64 GiB");
  return lab::read_file(path);
}

std::string rng_to_text(const std::mt19937_64& rng) {
  std::ostringstream os;
  os << rng;
  return os.str();
}

std::mt19937_64 rng_from_text(const std::string& text) {
  // The standard library's operator>> trusts the stored index (libstdc++ does not check it, and an index past 312
  // reads outside the state), so the text is checked first: exactly 312 words and an index in [0, 312], decimal.
  constexpr size_t kWords = std::mt19937_64::state_size;
  auto refuse = [&] {
    fail("checkpoint data_rng", quoted_text(text, 40),
         "a std::mt19937_64 state (312 decimal words and an index in [0, 312])");
  };
  std::istringstream tokens(text);
  std::string token;
  size_t count = 0;
  while (tokens >> token) {
    if (!read_unsigned(token, count == kWords ? kWords : std::numeric_limits<uint64_t>::max())) refuse();
    ++count;
  }
  if (count != kWords + 1) refuse();
  std::mt19937_64 rng;
  std::istringstream in(text);
  in >> rng;
  if (in.fail()) refuse();
  return rng;
}

}  // namespace rotary::train
