// Fuzz target: the JSON form of a run config, as a checkpoint stores it and a resumed run reads it back:
// parse_json (the depth bound every JSON reader shares), from_json over the defaults, validate, then the JSON
// round trip (train_config_check.h). Only rotary::Error may come out; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "rotary/error.h"
#include "rotary/json_guard.h"
#include "train/config.h"
#include "train_config_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  rotary::train::TrainConfig config;
  try {
    rotary::train::from_json(rotary::parse_json(text, "config.json"), config);
  } catch (const rotary::Error&) {
    return 0;
  }
  rotary::fuzz::check_read_config(config);
  return 0;
}
