// Fuzz target: the checkpoint file reader (lab/train/checkpoint_file.h) - header, lengths against the size,
// checksum over every byte, metadata fields - everything a checkpoint goes through before torch reads its payload.
// Only rotary::Error may come out. Most mutations break the checksum, so the target also re-frames each input's
// metadata and payload with a fresh checksum (encode_checkpoint) to reach the field checks, and checks that an
// accepted file re-encodes to the same metadata.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/files.h"
#include "rotary/error.h"
#include "train/checkpoint_file.h"

namespace {

using rotary::train::DecodedCheckpoint;

// An accepted file must round-trip: the same metadata from its re-encoding.
void check_round_trip(const DecodedCheckpoint& d) {
  const std::string again = rotary::train::encode_checkpoint(d.meta, d.payload, "fuzz");
  DecodedCheckpoint back;
  try {
    back = rotary::train::decode_checkpoint("again", again);
  } catch (const rotary::Error& e) {
    std::fprintf(stderr, "an accepted checkpoint does not read back after re-encoding: %s\n", e.what());
    std::abort();
  }
  if (back.meta.step != d.meta.step || back.meta.config != d.meta.config || back.meta.data_rng != d.meta.data_rng ||
      back.payload != d.payload) {
    std::fprintf(stderr, "checkpoint metadata changed in the round trip\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    check_round_trip(rotary::train::decode_checkpoint("fuzz.pt", bytes));
  } catch (const rotary::Error&) {
  }
  // The same bytes as "<metadata text>\0<payload>" behind a valid frame (magic, version 2, lengths, checksum): the
  // JSON parser, the field checks and the config reader see every mutation, not only those that keep the checksum.
  const size_t nul = bytes.find('\0');
  const std::string_view text = bytes.substr(0, nul), payload = nul == bytes.npos ? "" : bytes.substr(nul + 1);
  std::string frame("ROTARYCK", 8);
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) frame.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(2, 4);
  put(text.size(), 8);
  put(payload.size(), 8);
  frame += text;
  frame += payload;
  put(rotary::lab::fnv1a64(frame), 8);
  try {
    check_round_trip(rotary::train::decode_checkpoint("framed.pt", frame));
  } catch (const rotary::Error&) {
  }
  return 0;
}
