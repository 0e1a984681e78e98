// lab/common/plots.cpp: the reports' figures and gnuplot as a child process (process.h), in the plot directory.
#include "common/plots.h"

#include <fmt/format.h>

#include "common/files.h"
#include "common/process.h"

namespace rotary::lab {

std::string gnuplot_quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '\\' || c == '"') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

std::string figure_script(const std::vector<Figure>& figures) {
  std::string script;
  for (const Figure& f : figures) {
    if (f.series.empty()) continue;
    script += "reset\nset grid\nset key top right\n";
    script += "set output '" + f.png + "'\n";
    script += "set title " + gnuplot_quoted(f.title) + " noenhanced\n";
    script += "set xlabel " + gnuplot_quoted(f.xlabel) + " noenhanced\n";
    script += "set ylabel " + gnuplot_quoted(f.ylabel) + " noenhanced\n";
    for (const std::string& line : f.setup) script += line + "\n";
    script += "plot ";
    for (size_t i = 0; i < f.series.size(); ++i) script += (i ? ", \\\n     " : "") + f.series[i];
    script += "\nset output\n\n";  // closes the PNG before the next figure
  }
  return script;
}

int DataBlocks::add(const std::string& comment, const std::vector<std::pair<double, double>>& points) {
  text_ += "# " + comment + "\n";
  for (const auto& [x, y] : points) text_ += fmt::format("{:.9g} {:.9g}\n", x, y);
  text_ += "\n\n";
  return blocks_++;
}

std::string data_series(const std::string& file, int index, const std::string& style, const std::string& title) {
  return fmt::format("'{}' index {} with {} title {} noenhanced", file, index, style, gnuplot_quoted(title));
}

std::string run_gnuplot(const std::string& plot_dir, const std::string& script) {
  auto run = [&](const std::string& terminal) {
    const std::string gp = "set terminal " + terminal + " size 1000,600\n\n" + script;
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
