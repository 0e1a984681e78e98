// Fuzz target: a TOML run config (`rotary train --config run.toml`) as load_config_file reads it: toml_to_json,
// from_json over the defaults, validate, then the JSON round trip (train_config_check.h). Only rotary::Error may
// come out; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "rotary/error.h"
#include "train/config.h"
#include "train_config_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  rotary::train::TrainConfig config;
  try {
    rotary::train::from_json(rotary::train::toml_to_json(text, "fuzz.toml"), config);
  } catch (const rotary::Error&) {
    return 0;
  }
  rotary::fuzz::check_read_config(config);
  return 0;
}
