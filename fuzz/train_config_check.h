// What the two run-config targets check once a config is read: validation, the JSON round trip a checkpoint
// relies on (a resumed run compares its config with the stored one field by field), and the TOML round trip of
// --print-config-toml.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "rotary/error.h"
#include "rotary/json_guard.h"
#include "train/config.h"

namespace rotary::fuzz {

// Validates `c`; a valid config must come back unchanged from its JSON text, as a checkpoint stores it.
inline void check_read_config(const train::TrainConfig& c) {
  try {
    c.validate();
  } catch (const Error&) {
    return;  // refused, with a message naming the field
  }
  const nlohmann::json stored = c;
  train::TrainConfig back;
  try {
    train::from_json(parse_json(stored.dump(), "stored config"), back);
  } catch (const Error& e) {
    std::fprintf(stderr, "a valid config does not read back from its JSON: %s\n%s\n", e.what(), stored.dump().c_str());
    std::abort();
  }
  const nlohmann::json again = back;
  if (again != stored) {
    std::fprintf(stderr, "config changed in the JSON round trip at %s:\n%s\n%s\n",
                 train::first_difference(stored, again).c_str(), stored.dump().c_str(), again.dump().c_str());
    std::abort();
  }
  // And from the TOML file --print-config-toml writes, as a user would save and edit it.
  const std::string toml = train::to_toml(c);
  train::TrainConfig from_toml;
  try {
    train::from_json(train::toml_to_json(toml, "printed.toml"), from_toml);
  } catch (const Error& e) {
    std::fprintf(stderr, "a valid config does not read back from its TOML file: %s\n%s\n", e.what(), toml.c_str());
    std::abort();
  }
  const nlohmann::json via_toml = from_toml;
  if (via_toml != stored) {
    std::fprintf(stderr, "config changed in the TOML round trip at %s:\n%s\n", train::first_difference(stored, via_toml).c_str(),
                 toml.c_str());
    std::abort();
  }
}

}  // namespace rotary::fuzz
