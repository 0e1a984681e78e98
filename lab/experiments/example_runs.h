// lab/experiments/example_runs.h: the run descriptions of examples/runs/*.toml, compiled into the program
// (lab/CMakeLists.txt generates the table), so that an experiment that runs one of them - `rotary reproduce`'s
// seed-scale seed 000 - reads the very file users run, through the settings tables, instead of a second copy of its
// settings in C++.
#pragma once

#include <string>
#include <vector>

#include "train/config.h"

namespace rotary::experiments {

struct ExampleRun {
  const char* name;  // the file's name without .toml ("seed000-addition")
  const char* toml;  // its text
};
const std::vector<ExampleRun>& example_runs();

// The run `name` describes, read over the defaults (train::load_config_text); rotary::Error naming the runs there
// are for another name.
train::TrainConfig example_run(const std::string& name);

}  // namespace rotary::experiments
