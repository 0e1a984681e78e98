// lab/experiments/extrapolate_report.cpp
#include "experiments/extrapolate_report.h"

#include <cmath>
#include <fmt/format.h>
#include <map>
#include <sstream>
#include <thread>

#include "common/files.h"
#include "common/plots.h"

namespace rotary::experiments {

using namespace train;  // the training engine these experiments run on
namespace {

// One colour per method name (the log-n variant is dashed).
constexpr const char* kColours[] = {"1f77b4", "d62728", "2ca02c", "ff7f0e", "9467bd", "8c564b", "e377c2", "17becf"};

std::string colour_of(const std::string& name) {
  for (size_t i = 0; i < std::size(kExtrapolateMethods); ++i)
    if (kExtrapolateMethods[i] == name) return kColours[i % std::size(kColours)];
  return "000000";
}

std::string pct(double v) { return std::isfinite(v) ? fmt::format("{:.2f}%", 100 * v) : "n/a"; }
std::string num(double v) { return std::isfinite(v) ? fmt::format("{:.4f}", v) : "n/a"; }
std::string g(double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : "NaN"; }

const ModelInfo* model_of(const ReportInput& in, const std::string& metric) {
  const std::string role = metric == "retrieval" ? "kv" : "text";
  for (const ModelInfo& m : in.models)
    if (m.role == role) return &m;
  return nullptr;
}

bool trained_logn(const ReportInput& in, const std::string& metric) {
  const ModelInfo* m = model_of(in, metric);
  return m && m->trained_logn;
}

const Cell* find(const ReportInput& in, const std::string& metric, const std::string& key, int T, bool sweep) {
  for (const Cell& c : in.cells)
    if (c.metric == metric && c.sweep == sweep && c.test_len == T && c.method.key() == key) return &c;
  return nullptr;
}

// The main table's methods in the order they ran.
std::vector<Method> main_methods(const ReportInput& in, const std::string& metric) {
  std::vector<Method> out;
  for (const Cell& c : in.cells)
    if (c.metric == metric && !c.sweep && c.test_len == in.lengths.front()) out.push_back(c.method);
  return out;
}

bool has_metric(const ReportInput& in, const std::string& metric) { return !main_methods(in, metric).empty(); }

std::string length_header(const ReportInput& in, int T) {
  return T == in.train_len ? fmt::format("{} (train)", T) : fmt::format("{} ({}L)", T, T / in.train_len);
}

}  // namespace

std::string seed_table(const ReportInput& in) {
  const int T = in.lengths.back();
  const bool retrieval = has_metric(in, "retrieval");
  std::ostringstream os;
  os << "| method | " << in.train_len << " (train) | " << T << " (repeated) | " << T << " (non-repeated) |"
     << (retrieval ? fmt::format(" {} kv retrieval |", T) : "") << "\n|---|---:|---:|---:|" << (retrieval ? "---:|" : "")
     << "\n";
  const std::vector<Method> methods = main_methods(in, "text");
  const std::vector<Method> kv_methods = main_methods(in, "retrieval");
  for (const Method& m : methods) {
    auto acc = [&](const std::string& metric, int len) {
      const Cell* c = find(in, metric, m.key(), len, false);
      return c ? pct(c->accuracy) : std::string("-");
    };
    os << "| " << m.label(trained_logn(in, "text")) << " | " << acc("text", in.train_len) << " | " << acc("repeated", T)
       << " | " << acc("text", T) << " |" << (retrieval ? " " + acc("retrieval", T) + " |" : "") << "\n";
  }
  return os.str();
}

std::string length_table(const ReportInput& in, const std::string& metric, bool loss) {
  std::ostringstream os;
  os << "| method |";
  for (int T : in.lengths) os << " " << length_header(in, T) << " |";
  os << "\n|---|";
  for (size_t i = 0; i < in.lengths.size(); ++i) os << "---:|";
  os << "\n";
  for (const Method& m : main_methods(in, metric)) {
    os << "| " << m.label(trained_logn(in, metric)) << " |";
    for (int T : in.lengths) {
      const Cell* c = find(in, metric, m.key(), T, false);
      os << " " << (c ? (loss ? num(c->loss) : pct(c->accuracy)) : "-") << " |";
    }
    os << "\n";
  }
  if (metric == "retrieval") {
    os << "| *pairs per prompt / mean answer distance (tokens)* |";
    for (int T : in.lengths) {
      const std::vector<Method> ms = main_methods(in, metric);
      const Cell* c = ms.empty() ? nullptr : find(in, metric, ms.front().key(), T, false);
      os << " " << std::max(1, (T - 5) / 14) << " / " << (c ? fmt::format("{:.0f}", c->answer_distance) : "-") << " |";
    }
    os << "\n";
  }
  return os.str();
}

std::string sweep_table(const ReportInput& in) {
  if (in.sweep.empty()) return "";
  struct Column {
    int T;
    std::string metric;
    bool logn;
  };
  std::vector<Column> columns;
  for (bool logn : {false, true})
    for (int T : {in.train_len, in.lengths.back()})
      for (const char* metric : {"text", "repeated"}) {
        // At T = L the repeated window is the plain text; a second L column only when the sweep has one.
        if (T == in.train_len && std::string(metric) == "repeated") continue;
        if (T == in.train_len && !columns.empty() && columns.back().T == T && columns.back().logn == logn) continue;
        Method m;
        m.name = "rerope";
        m.window = in.sweep.front();
        m.logn = logn;
        if (find(in, metric, m.key(), T, true)) columns.push_back({T, metric, logn});
      }
  std::ostringstream os;
  os << "| window |";
  for (const Column& c : columns)
    os << " " << c.T << (c.metric == "repeated" ? " repeated" : " text")
       << (c.logn ? (trained_logn(in, "text") ? " log n" : " log n†") : "") << " |";
  os << "\n|---:|";
  for (size_t i = 0; i < columns.size(); ++i) os << "---:|";
  os << "\n";
  for (int64_t w : in.sweep) {
    os << "| " << w << (w == in.train_len ? " (= L)" : "") << " |";
    for (const Column& col : columns) {
      Method m;
      m.name = "rerope";
      m.window = w;
      m.logn = col.logn;
      const Cell* c = find(in, col.metric, m.key(), col.T, true);
      os << " " << (c ? pct(c->accuracy) : "-") << " |";
    }
    os << "\n";
  }
  return os.str();
}

ReportOutput write_extrapolate_report(const ReportInput& in) {
  ReportOutput out;
  const std::string& dir = in.spec.out_dir;
  const std::string plot_dir = lab::join_path(dir, "plots");
  lab::make_dirs(plot_dir);

  // results.csv: every cell.
  std::string csv = "model_metric,method,label,logn,window,leaky_k,test_len,sweep,loss,accuracy,count,answer_distance,seconds,reused\n";
  for (const Cell& c : in.cells)
    csv += fmt::format("{},{},\"{}\",{},{},{},{},{},{},{},{},{},{:.2f},{}\n", c.metric, c.method.key(),
                       c.method.label(trained_logn(in, c.metric)), c.method.logn ? 1 : 0, c.method.window,
                       c.method.leaky_k, c.test_len, c.sweep ? 1 : 0, g(c.loss), g(c.accuracy), c.count,
                       g(c.answer_distance), c.seconds, c.reused ? 1 : 0);
  lab::write_file_atomic(lab::join_path(dir, "results.csv"), csv);

  // Plot data and script.
  const int L = in.train_len, Tmax = in.lengths.back();
  std::vector<lab::Figure> figures;
  auto style = [](const Method& m) {
    return fmt::format("lc rgb '#{}' dt {} lw 2", colour_of(m.name), m.logn ? 2 : 1);
  };
  auto title = [&](const Method& m, const std::string& metric) {
    std::string t = m.label(trained_logn(in, metric));
    std::string esc;
    for (char ch : t) esc += ch == '_' ? std::string("\\\\_") : std::string(1, ch);  // gnuplot enhanced text
    return esc;
  };
  auto figure = [&](const std::string& png, const std::string& heading, const std::string& xlabel,
                    const std::string& ylabel, const std::string& extra, const std::vector<std::string>& series) {
    if (series.empty()) return;
    figures.push_back({"../" + png, heading, xlabel, ylabel, {extra}, series});
    out.plots.push_back(lab::join_path(dir, png));
  };

  // Loss against position at the longest length, averaged over buckets of tokens.
  std::vector<std::string> pos_series;
  const size_t bucket = static_cast<size_t>(std::max(1, Tmax / 64));  // 64 points: readable, less noisy
  for (const Method& m : main_methods(in, "text")) {
    const Cell* c = find(in, "text", m.key(), Tmax, false);
    if (!c || c->loss_by_position.empty()) continue;
    std::string data = "# position mean_loss (bucket of " + std::to_string(bucket) + " targets)\n";
    for (size_t b = 0; b < c->loss_by_position.size(); b += bucket) {
      double sum = 0;
      size_t n = 0;
      for (size_t t = b; t < std::min(b + bucket, c->loss_by_position.size()); ++t)
        if (std::isfinite(c->loss_by_position[t])) sum += c->loss_by_position[t], ++n;
      if (n) data += fmt::format("{} {}\n", b + bucket / 2, g(sum / n));
    }
    const std::string file = "position_" + m.key() + ".dat";
    lab::write_file_atomic(lab::join_path(plot_dir, file), data);
    pos_series.push_back(fmt::format("'{}' using 1:2 with lines {} title \"{}\"", file, style(m), title(m, "text")));
  }
  figure("loss_vs_position.png",
         fmt::format("Loss by position, KJV windows of {} (L = {}; dashed: log n)", Tmax, L),
         "position in the window", "loss (mean over windows and " + std::to_string(bucket) + " positions)",
         fmt::format("set arrow from {0}, graph 0 to {0}, graph 1 nohead dt 3 lc rgb '#000000'\nset key outside right", L),
         pos_series);

  // Metric against test length.
  auto by_length = [&](const std::string& metric, bool loss, const std::string& png, const std::string& heading,
                       const std::string& ylabel) {
    std::vector<std::string> series;
    for (const Method& m : main_methods(in, metric)) {
      std::string data = "# test_len value\n";
      for (int T : in.lengths)
        if (const Cell* c = find(in, metric, m.key(), T, false))
          data += fmt::format("{} {}\n", T, g(loss ? c->loss : c->accuracy));
      const std::string file = metric + (loss ? "_loss_" : "_acc_") + m.key() + ".dat";
      lab::write_file_atomic(lab::join_path(plot_dir, file), data);
      series.push_back(fmt::format("'{}' using 1:2 with linespoints pt 7 {} title \"{}\"", file, style(m), title(m, metric)));
    }
    std::string xt;
    for (int T : in.lengths) xt += (xt.empty() ? "" : ", ") + fmt::format("'{0}' {0}", T);
    figure(png, heading, "test length T (context before the scored last L tokens: T - L)", ylabel,
           "set logscale x 2\nset xtics (" + xt + ")\nset key outside right", series);
  };
  by_length("text", true, "loss_vs_length.png",
            fmt::format("KJV text: loss on the last {} tokens against the context length (dashed: log n)", L), "loss");
  by_length("text", false, "accuracy_vs_length.png",
            fmt::format("KJV text: next-token accuracy on the last {} tokens (dashed: log n)", L), "accuracy");
  by_length("repeated", false, "repeated_vs_length.png",
            fmt::format("Repeated text (period L = {}): accuracy on the last {} tokens (dashed: log n)", L, L), "accuracy");
  if (has_metric(in, "retrieval"))
    by_length("retrieval", false, "retrieval_vs_length.png",
              "Key-value retrieval: greedy exact match, answers decoded through the KV cache (dashed: log n)",
              "exact match");

  // The window sweep at the longest length.
  if (!in.sweep.empty()) {
    std::vector<std::string> series;
    for (const char* metric : {"text", "repeated"})
      for (bool logn : {false, true}) {
        std::string data = "# window accuracy\n";
        bool any = false;
        for (int64_t w : in.sweep) {
          Method m;
          m.name = "rerope";
          m.window = w;
          m.logn = logn;
          if (const Cell* c = find(in, metric, m.key(), Tmax, true)) data += fmt::format("{} {}\n", w, g(c->accuracy)), any = true;
        }
        if (!any) continue;
        const std::string file = fmt::format("sweep_{}{}.dat", metric, logn ? "_logn" : "");
        lab::write_file_atomic(lab::join_path(plot_dir, file), data);
        series.push_back(fmt::format("'{}' using 1:2 with linespoints pt 7 lw 2 lc rgb '#{}' dt {} title \"{}{}\"", file,
                                     std::string(metric) == "text" ? "1f77b4" : "d62728", logn ? 2 : 1,
                                     std::string(metric) == "text" ? "text" : "repeated",
                                     logn ? (trained_logn(in, "text") ? ", log n" : ", log n†") : ""));
      }
    if (const Cell* base = find(in, "text", "rope", L, false))
      series.push_back(fmt::format("{} with lines lc rgb '#000000' dt 3 title \"RoPE at L (text)\"", g(base->accuracy)));
    figure("window_sweep.png", fmt::format("ReRoPE window sweep at T = {} (trained at L = {})", Tmax, L), "window w",
           "accuracy on the last L tokens", fmt::format("set arrow from {0}, graph 0 to {0}, graph 1 nohead dt 3", L), series);
  }

  out.plot_problem = lab::run_gnuplot(plot_dir, lab::figure_script(figures));
  std::vector<std::string> made;
  for (const std::string& p : out.plots)
    if (lab::file_exists(p)) made.push_back(p);
  out.plots = made;

  // report.md
  std::ostringstream md;
  md << "# rotary extrapolate: length extrapolation without fine-tuning (seed 004)\n\n";
  if (!in.spec.command_line.empty()) md << "Command: `" << in.spec.command_line << "`\n\n";
  double scoring = 0, training = 0;
  int reused = 0;
  for (const Cell& c : in.cells) scoring += c.seconds, reused += c.reused ? 1 : 0;
  for (const ModelInfo& m : in.models) training += m.train_seconds;
  md << fmt::format(
      "Machine: {} cores. Time: training {:.0f} s, scoring {:.0f} s ({} cells; each counted once, as first computed), "
      "this invocation {:.0f} s wall ({} cells reused from an earlier one).\n\n",
      std::max(1u, std::thread::hardware_concurrency()), training, scoring, in.cells.size(), in.seconds, reused);
  md << "## Models\n\n";
  for (const ModelInfo& m : in.models)
    md << "- **" << m.role << "**: " << m.description << "; held-out loss at L " << num(m.heldout_loss)
       << fmt::format(", trained in {:.0f} s", m.train_seconds) << " (`" << m.checkpoint << "`)\n";
  md << fmt::format(
      "\nScoring: {} held-out KJV windows per length; every window's last L = {} targets are scored (the same "
      "tokens at every length, only the context before them grows): {} tokens per cell. \"Repeated\": the same L "
      "tokens tiled to the window length.{}\n\n",
      in.spec.windows, L, static_cast<int64_t>(in.spec.windows) * L,
      has_metric(in, "retrieval")
          ? fmt::format(" Retrieval: {} kv_retrieval prompts per length with (T - 5) / 14 pairs, greedy exact match "
                        "of the answer and '#', generated through the KV-cache decoder.", in.spec.problems)
          : std::string());
  md << "Methods at test length T: factor T / L for PI, NTK-fixed, NTK-mixed and YaRN (original context L); "
        "NTK-dynamic recomputes the base for each token's own length over max_position_embeddings = L and is "
        "scored by decoding the last L tokens one at a time; ReRoPE / Leaky ReRoPE replace the distances beyond the "
        "window. log n: q_n *= max(1, ln(n + 1) / ln L) († = added at test time to a model trained without it).\n\n";
  md << "## Seed 004's table (next-token accuracy)\n\n" << seed_table(in) << "\n";
  md << "## Text: accuracy on the last L tokens\n\n" << length_table(in, "text", false) << "\n";
  md << "## Text: loss on the last L tokens\n\n" << length_table(in, "text", true) << "\n";
  md << "## Repeated text: accuracy on the last L tokens\n\n" << length_table(in, "repeated", false) << "\n";
  if (has_metric(in, "retrieval"))
    md << "## Key-value retrieval: exact match\n\n" << length_table(in, "retrieval", false) << "\n";
  if (!in.sweep.empty()) md << "## ReRoPE window sweep (accuracy)\n\n" << sweep_table(in) << "\n";
  md << "## Plots\n\n";
  if (!out.plot_problem.empty()) md << "(" << out.plot_problem << ")\n\n";
  for (const std::string& p : out.plots) {
    const std::string name = p.substr(p.find_last_of('/') + 1);
    md << "![" << name.substr(0, name.size() - 4) << "](" << name << ")\n\n";
  }
  md << "All numbers: `results.csv`; per cell: `cells/`.\n";
  out.report_md = lab::join_path(dir, "report.md");
  lab::write_file_atomic(out.report_md, md.str());
  return out;
}

}  // namespace rotary::experiments
