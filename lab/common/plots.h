// lab/common/plots.h: the gnuplot PNGs of the reports (compare, extrapolate, decay, memory, perplexity, the memory
// benchmark), built one way: data files of blocks (DataBlocks), figures of plot items (Figure), one script
// (figure_script), run by run_gnuplot.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace rotary::lab {

// One PNG: a title, axis labels, `setup` lines ("set logscale x 2", "set yrange [0:1]", "set arrow ...", "set key
// outside right", "set datafile separator ','") and the plot items. A figure with no items is left out.
struct Figure {
  std::string png;  // relative to the plot directory the script runs in
  std::string title, xlabel, ylabel;
  std::vector<std::string> setup;
  std::vector<std::string> series;  // plot items: data_series(...), or any gnuplot item ("0.5 with lines ...")
};

// The script drawing `figures`, each from the same state: gnuplot's defaults (`reset`) plus the reports' style
// (grid, key top right), then its setup - so no figure's scales, ranges or arrows leak into the next. Titles and
// labels are shown as written (no enhanced-text subscripts for the '_' in names such as leaky_rerope).
std::string figure_script(const std::vector<Figure>& figures);

// A gnuplot data file of blocks separated by two blank lines; a plot item addresses block i as `index i`.
class DataBlocks {
 public:
  // Adds a block of (x, y) points under a "# comment" line; returns its index.
  int add(const std::string& comment, const std::vector<std::pair<double, double>>& points);
  int size() const { return blocks_; }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
  int blocks_ = 0;
};

// The plot item of block `index` of `file` ("'file' index i with <style> title \"<title>\" noenhanced").
std::string data_series(const std::string& file, int index, const std::string& style, const std::string& title);
// `text` as a gnuplot double-quoted string ("..." with '\' and '"' escaped).
std::string gnuplot_quoted(const std::string& text);

// Runs a gnuplot script in plot_dir (as plots.gp, output to gnuplot.log; PNG paths in the script are relative to
// plot_dir), with a 1000x600 pngcairo terminal (png if cairo is missing) prepended. Returns "" on success, else
// why there are no plots (gnuplot missing or failing).
std::string run_gnuplot(const std::string& plot_dir, const std::string& script);

}  // namespace rotary::lab
