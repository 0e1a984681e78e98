// lab/experiments/reproduce/child_cache.h: the benchmarks and the measured decay of `rotary reproduce`, run as
// child processes of the `rotary` program and their output kept, so a rerun reuses it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "experiments/reproduce.h"

namespace rotary::experiments::reproduce {

// Runs `rotary <args>` unless <dir>/<name>.json holds the output of the same command (a cell of cell_store.h
// whose settings are the command line); returns its JSON output (the command's stdout) or null with `problem` set.
nlohmann::json cached_child_json(const ReproduceSpec& r, const std::string& dir, const std::string& name,
                                 const std::vector<std::string>& args, std::string& problem, bool progress);

}  // namespace rotary::experiments::reproduce
