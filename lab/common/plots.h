// lab/common/plots.h: the gnuplot PNGs of the reports (compare, extrapolate, decay).
#pragma once

#include <string>

namespace rotary::lab {

// Runs a gnuplot script in plot_dir (as plots.gp, output to gnuplot.log; PNG paths in the script are relative to
// plot_dir), with a 1000x600 pngcairo terminal (png if cairo is missing) prepended. Returns "" on success, else
// why there are no plots (gnuplot missing or failing).
std::string run_gnuplot(const std::string& plot_dir, const std::string& script);

}  // namespace rotary::lab
