// lab/train/checkpoint_file.h: the bytes of a checkpoint file and every check made on them before torch reads
// one (torch-free, so the reader can be fuzzed: fuzz/). checkpoint.h puts the model and optimizer in the payload.
//
// Layout (format version 2, written since 2026-11):
//   8 bytes   magic "ROTARYCK"
//   4 bytes   format version, little-endian uint32 = 2
//   8 bytes   length M of the metadata, little-endian uint64
//   8 bytes   length P of the payload, little-endian uint64
//   M bytes   metadata JSON, exactly the keys {"step", "config", "data_rng", "torch_version"}
//   P bytes   payload (a torch archive, see checkpoint.h)
//   8 bytes   FNV-1a 64 of every byte before it, little-endian
// The checksum covers every byte, the metadata included: one changed digit of the stored step is "damaged", not a
// different run resumed. The file size must be exactly 36 + M + P, checked before anything is allocated.
//
// Format version 1 (read, never written): magic, version 1, M, metadata (with "payload_bytes" and
// "payload_fnv1a64"), payload; its checksum covers the payload only, so its metadata is protected by the range
// checks alone. Saving again writes version 2.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>

namespace rotary::train {

constexpr uint32_t kCheckpointFormatVersion = 2;

struct CheckpointMeta {
  uint32_t format_version = kCheckpointFormatVersion;  // of the file it was read from
  int64_t step = 0;       // optimizer updates completed, in [0, config.steps]
  nlohmann::json config;  // TrainConfig as JSON; a valid one (checked when read)
  std::string data_rng;   // std::mt19937_64 state after the batch of `step`; "" in an inference-only export
};

// The whole file: header, metadata, payload and checksum.
std::string encode_checkpoint(const CheckpointMeta& meta, std::string_view payload, std::string_view torch_version);

struct DecodedCheckpoint {
  CheckpointMeta meta;
  std::string_view payload;  // points into the bytes given to decode_checkpoint
};

// Checks, in this order, and throws rotary::Error naming `path` at the first failure: the magic, the version, the
// lengths against the file size, the checksum, then every metadata field (keys known, step an integer in
// [0, config.steps], config a valid TrainConfig (TrainConfig::validate), data_rng empty or a generator state).
DecodedCheckpoint decode_checkpoint(const std::string& path, std::string_view bytes);

// The file's bytes, refusing (before allocating) a file that is not a regular file or is larger than 64 GiB.
std::string read_checkpoint_bytes(const std::string& path);

std::string rng_to_text(const std::mt19937_64& rng);
std::mt19937_64 rng_from_text(const std::string& text);  // rotary::Error if malformed or followed by anything

}  // namespace rotary::train
