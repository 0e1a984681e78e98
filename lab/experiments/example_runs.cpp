// lab/experiments/example_runs.cpp: reading a compiled-in example run (example_runs.h; the table itself is
// generated into the build directory from examples/runs/*.toml).
#include "experiments/example_runs.h"

#include "rotary/error.h"

namespace rotary::experiments {

train::TrainConfig example_run(const std::string& name) {
  std::string names;
  for (const ExampleRun& r : example_runs()) {
    if (name == r.name) return train::load_config_text(r.toml, "examples/runs/" + name + ".toml");
    names += (names.empty() ? "" : ", ") + std::string(r.name);
  }
  fail("example run", name, names.empty() ? "none (examples/runs/ had no .toml file at build time)" : names);
}

}  // namespace rotary::experiments
