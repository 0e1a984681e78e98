// lab/experiments/reproduce/child_cache.cpp
#include "experiments/reproduce/child_cache.h"

#include <cstdio>
#include <fmt/format.h>

#include "common/process.h"
#include "experiments/cell_store.h"

namespace rotary::experiments::reproduce {

using nlohmann::json;

json cached_child_json(const ReproduceSpec& r, const std::string& dir, const std::string& name,
                       const std::vector<std::string>& args, std::string& problem, bool progress) {
  const CellStore store(dir);
  std::string line;
  for (const std::string& a : args) line += (line.empty() ? "" : " ") + a;
  const json settings{{"command", line}};
  json stored;
  if (store.find(name + ".json", settings, [&](const json& result) { stored = result; }) == CellLookup::Reused)
    return stored;
  if (r.rotary_program.empty()) {
    problem = "no rotary program to run `rotary " + line + "`";
    return nullptr;
  }
  if (progress) std::fprintf(stderr, "reproduce: rotary %s\n", line.c_str());
  std::vector<std::string> argv{r.rotary_program};
  argv.insert(argv.end(), args.begin(), args.end());
  const lab::CommandResult res = lab::run_command(argv);
  if (res.status != 0) {
    problem = fmt::format("`rotary {}` exited {}: {}", line, res.status, res.err.substr(0, 400));
    return nullptr;
  }
  json j;
  if (args.front() == "decay") {
    j = json::object();  // decay writes files; its stdout is text
  } else {
    try {
      j = json::parse(res.out);
    } catch (const std::exception& e) {
      problem = fmt::format("`rotary {}` printed no JSON ({})", line, e.what());
      return nullptr;
    }
  }
  store.store(name + ".json", settings, j);
  return j;
}

}  // namespace rotary::experiments::reproduce
