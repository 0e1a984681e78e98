// lab/common/plots.cpp: gnuplot as a child process (process.h), in the plot directory.
#include "common/plots.h"

#include "common/files.h"
#include "common/process.h"

namespace rotary::lab {

std::string run_gnuplot(const std::string& plot_dir, const std::string& script) {
  auto run = [&](const std::string& terminal) {
    const std::string gp = "set terminal " + terminal + " size 1000,600\nset grid\nset key top right\n\n" + script;
    write_file_atomic(join_path(plot_dir, "plots.gp"), gp);
    SpawnOptions options;  // gnuplot plots.gp > gnuplot.log 2>&1, in plot_dir
    options.cwd = plot_dir;
    options.stdout_path = "gnuplot.log";
    options.stderr_to_stdout = true;
    pid_t pid = 0;
    return spawn_process({"gnuplot", "plots.gp"}, options, pid) == 0 && wait_process(pid) == 0;
  };
  if (find_in_path("gnuplot").empty()) return "gnuplot is not installed (Debian: gnuplot-nox); no plots";
  if (!run("pngcairo") && !run("png")) return "gnuplot failed; see " + join_path(plot_dir, "gnuplot.log");
  return "";
}

}  // namespace rotary::lab
