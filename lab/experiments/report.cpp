// lab/experiments/report.cpp
#include "experiments/report.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <map>
#include <sstream>

#include "common/statistics.h"
#include "common/files.h"
#include "common/plots.h"
#include "rotary/error.h"
#include "train/metrics.h"

namespace rotary::experiments {

using namespace train;  // the training engine these experiments run on
namespace {

// Tableau colours: one per encoding; runs get the same colour, mostly transparent.
constexpr const char* kColours[] = {"1f77b4", "d62728", "2ca02c", "ff7f0e", "9467bd", "8c564b", "e377c2", "17becf"};

std::string colour(size_t i) { return kColours[i % (sizeof kColours / sizeof kColours[0])]; }

std::string num(double v, int decimals) {
  if (!std::isfinite(v)) return "n/a";
  return fmt::format("{:.{}f}", v, decimals);
}
std::string pct(double v) { return std::isfinite(v) ? fmt::format("{:.1f}%", 100 * v) : "n/a"; }
double opt_or_nan(const std::optional<double>& v) { return v ? *v : std::nan(""); }

std::vector<const CompareRun*> runs_of(const ReportInputs& in, const std::string& enc) {
  std::vector<const CompareRun*> out;
  for (const CompareRun& r : in.runs)
    if (r.encoding == enc) out.push_back(&r);
  return out;
}

// One curve per run, sampled at the steps every run has; returns the rows "step v1 .. vn mean".
using Curve = std::map<int64_t, double>;
std::string curve_table(const std::vector<Curve>& curves) {
  if (curves.empty()) return "";
  std::ostringstream os;
  os << "# step";
  for (size_t i = 0; i < curves.size(); ++i) os << " run" << i + 1;
  os << " mean\n";
  for (const auto& [step, unused] : curves[0]) {
    std::vector<double> vals;
    for (const Curve& c : curves) {
      auto it = c.find(step);
      if (it == c.end()) break;
      vals.push_back(it->second);
    }
    if (vals.size() != curves.size()) continue;
    double sum = 0;
    int finite = 0;
    os << step;
    for (double v : vals) {
      os << ' ' << (std::isfinite(v) ? fmt::format("{:.6g}", v) : "NaN");
      if (std::isfinite(v)) sum += v, ++finite;
    }
    os << ' ' << (finite ? fmt::format("{:.6g}", sum / finite) : "NaN") << '\n';
  }
  return os.str();
}

Curve smoothed(const std::vector<MetricsRow>& rows, size_t window) {
  Curve c;
  double sum = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    sum += rows[i].loss;
    if (i >= window) sum -= rows[i - window].loss;
    const size_t n = std::min(i + 1, window);
    // Plot every point for short runs, thin out long ones (a PNG is ~1000 pixels wide anyway).
    if (rows.size() <= 2000 || i % (rows.size() / 1000) == 0 || i + 1 == rows.size()) c[rows[i].step] = sum / n;
  }
  return c;
}

}  // namespace

double drop_worst_mean(const std::vector<double>& values, bool higher_is_better) {
  if (values.empty()) return std::nan("");
  std::vector<double> v = values;
  if (v.size() >= 2) {
    auto worse = [&](double a, double b) {  // is a worse than b?
      if (std::isnan(a)) return !std::isnan(b);
      if (std::isnan(b)) return false;
      return higher_is_better ? a < b : a > b;
    };
    auto worst = v.begin();
    for (auto it = v.begin(); it != v.end(); ++it)
      if (worse(*it, *worst)) worst = it;
    v.erase(worst);
  }
  double sum = 0;
  int n = 0;
  for (double x : v)
    if (std::isfinite(x)) sum += x, ++n;
  // A NaN that survives the drop means a second run diverged: the mean is not meaningful.
  if (n == 0 || n != static_cast<int>(v.size())) return std::nan("");
  return sum / n;
}

double steps_to_loss(const std::vector<MetricsRow>& rows, double target) {
  if (!std::isfinite(target)) return std::nan("");
  const MetricsRow* before = nullptr;
  for (const MetricsRow& m : rows) {
    if (!m.eval_loss || !std::isfinite(*m.eval_loss)) continue;
    if (*m.eval_loss <= target) {
      if (!before) return double(m.step);
      const double l0 = *before->eval_loss, l1 = *m.eval_loss;  // l0 > target >= l1
      return double(before->step) + double(m.step - before->step) * (l0 - target) / (l0 - l1);
    }
    before = &m;
  }
  return std::nan("");
}

double resolved_target_loss(const ReportInputs& in) {
  if (in.target_loss) return *in.target_loss;
  // The lowest level every run reached: the highest of the runs' best held-out losses.
  double target = std::nan("");
  for (const CompareRun& r : in.runs) {
    double best = opt_or_nan(r.summary.eval_loss);
    for (const MetricsRow& m : read_metrics(lab::join_path(r.dir, "metrics.jsonl")))
      if (m.eval_loss && std::isfinite(*m.eval_loss) && !(*m.eval_loss >= best)) best = *m.eval_loss;
    if (std::isfinite(best) && !(best <= target)) target = best;
  }
  return target;
}

std::vector<EncodingStats> encoding_stats(const ReportInputs& in) {
  std::vector<EncodingStats> out;
  const double target = resolved_target_loss(in);
  for (const std::string& enc : in.encodings) {
    std::vector<double> train, eval, greedy, sampled, to_target, throughput;
    for (const CompareRun* r : runs_of(in, enc)) {
      train.push_back(r->summary.final_train_loss);
      eval.push_back(opt_or_nan(r->summary.eval_loss));
      greedy.push_back(opt_or_nan(r->summary.accuracy_greedy));
      sampled.push_back(opt_or_nan(r->summary.accuracy_sampled));
      const std::vector<MetricsRow> rows = read_metrics(lab::join_path(r->dir, "metrics.jsonl"));
      to_target.push_back(steps_to_loss(rows, target));
      std::vector<double> tps;
      for (const MetricsRow& m : rows)
        if (std::isfinite(m.tokens_per_s) && m.tokens_per_s > 0) tps.push_back(m.tokens_per_s);
      throughput.push_back(lab::median(tps));
    }
    EncodingStats s;
    s.encoding = enc;
    s.runs = static_cast<int>(train.size());
    s.final_train_loss = drop_worst_mean(train, false);
    s.eval_loss = drop_worst_mean(eval, false);
    s.perplexity = std::exp(s.eval_loss);
    s.accuracy_greedy = drop_worst_mean(greedy, true);
    s.accuracy_sampled = drop_worst_mean(sampled, true);
    s.steps_to_target = drop_worst_mean(to_target, false);
    s.reached_target = int(std::count_if(to_target.begin(), to_target.end(), [](double v) { return std::isfinite(v); }));
    s.tokens_per_s = drop_worst_mean(throughput, true);
    auto range = [](const std::vector<double>& v, double& lo, double& hi) {
      lo = hi = v.empty() ? std::nan("") : v.front();
      for (double x : v) {
        if (std::isnan(x)) lo = hi = std::nan("");
        if (std::isnan(lo)) return;
        lo = std::min(lo, x), hi = std::max(hi, x);
      }
    };
    range(eval, s.eval_loss_min, s.eval_loss_max);
    range(greedy, s.greedy_min, s.greedy_max);
    s.run_eval_loss = eval, s.run_greedy = greedy, s.run_sampled = sampled, s.run_steps_to_target = to_target;
    out.push_back(s);
  }
  return out;
}

std::string results_table(const ReportInputs& in) {
  const std::vector<EncodingStats> stats = encoding_stats(in);
  bool accuracy = false;
  for (const CompareRun& r : in.runs) accuracy = accuracy || r.summary.accuracy_greedy.has_value();
  const double target = resolved_target_loss(in);
  std::ostringstream os;
  os << "| encoding | runs | final train loss | held-out loss | held-out loss, every run | "
     << (accuracy ? "" : "perplexity | ") << "steps to held-out loss " << num(target, 4) << " | tokens/s |"
     << (accuracy ? " exact match (greedy) | greedy, every run | exact match (sampled) |" : "") << "\n"
     << "|---|---:|---:|---:|---:|" << (accuracy ? "" : "---:|") << "---:|---:|"
     << (accuracy ? "---:|---:|---:|" : "") << "\n";
  for (const EncodingStats& s : stats) {
    os << "| " << s.encoding << " | " << s.runs << " | " << num(s.final_train_loss, 4) << " | " << num(s.eval_loss, 4)
       << " | " << num(s.eval_loss_min, 4) << " - " << num(s.eval_loss_max, 4) << " | ";
    if (!accuracy) os << num(s.perplexity, 2) << " | ";
    os << num(s.steps_to_target, 0) << " (" << s.reached_target << "/" << s.runs << " runs) | "
       << num(s.tokens_per_s, 0) << " |";
    if (accuracy)
      os << " " << pct(s.accuracy_greedy) << " | " << pct(s.greedy_min) << " - " << pct(s.greedy_max) << " | "
         << pct(s.accuracy_sampled) << " |";
    os << "\n";
  }
  return os.str();
}

ReportFiles write_report(const ReportInputs& in) {
  ReportFiles files;
  const std::string plot_dir = lab::join_path(in.out_dir, "plots");
  lab::make_dirs(plot_dir);
  int64_t steps = in.base_config.value("steps", int64_t{0});
  const size_t window = static_cast<size_t>(std::max<int64_t>(1, steps / 50));

  // Data files: per encoding, training loss (moving average), held-out loss and accuracy at evaluation steps.
  std::string loss_plot, eval_plot, acc_plot;
  bool any_accuracy = false;
  for (size_t e = 0; e < in.encodings.size(); ++e) {
    const std::string& enc = in.encodings[e];
    std::vector<Curve> loss, eval, acc;
    for (const CompareRun* r : runs_of(in, enc)) {
      const std::vector<MetricsRow> rows = read_metrics(lab::join_path(r->dir, "metrics.jsonl"));
      loss.push_back(smoothed(rows, window));
      Curve ev, ac;
      for (const MetricsRow& m : rows) {
        if (m.eval_loss) ev[m.step] = *m.eval_loss;
        if (m.eval_accuracy) ac[m.step] = *m.eval_accuracy;
      }
      eval.push_back(ev);
      acc.push_back(ac);
      any_accuracy = any_accuracy || !ac.empty();
    }
    const size_t n = loss.size();
    if (n == 0) continue;
    auto add = [&](std::string& plot, const std::string& kind, const std::vector<Curve>& curves, const char* style) {
      const std::string file = kind + "_" + enc + ".dat";
      lab::write_file_atomic(lab::join_path(plot_dir, file), curve_table(curves));
      for (size_t i = 0; i < n; ++i)
        plot += fmt::format("{}'{}' using 1:{} with {} lw 1 lc rgb '#b0{}' notitle", plot.empty() ? "" : ", \\\n  ",
                            file, i + 2, style, colour(e));
      plot += fmt::format(", \\\n  '{}' using 1:{} with {} lw 3 lc rgb '#{}' title '{} (mean of {})'", file, n + 2,
                          style, colour(e), enc, n);
    };
    add(loss_plot, "loss", loss, "lines");
    add(eval_plot, "eval_loss", eval, "linespoints");
    add(acc_plot, "accuracy", acc, "linespoints");
  }

  const std::string task = in.task;
  std::vector<lab::Figure> figures;
  auto figure = [&](const std::string& png, const std::string& title, const std::string& ylabel,
                    const std::string& plot, const std::string& extra) {
    if (!plot.empty()) figures.push_back({"../" + png, title, "step", ylabel, {extra}, {plot}});
  };
  figure("loss.png",
         fmt::format("{}: training loss (moving average over {} steps); thin: each run, thick: mean", task, window),
         "loss", loss_plot, "set autoscale y");
  figure("eval_loss.png", task + ": held-out loss; thin: each run, thick: mean", "loss", eval_plot, "set autoscale y");
  if (any_accuracy)
    figure("accuracy.png", task + ": exact match, greedy decoding; thin: each run, thick: mean", "accuracy", acc_plot,
           "set yrange [0:1]");

  files.plot_problem = figures.empty() ? "" : lab::run_gnuplot(plot_dir, lab::figure_script(figures));
  if (files.plot_problem.empty()) {
    for (const char* png : {"loss.png", "eval_loss.png", "accuracy.png"})
      if (lab::file_exists(lab::join_path(in.out_dir, png))) files.plots.push_back(lab::join_path(in.out_dir, png));
  }

  // The markdown report.
  std::ostringstream md;
  md << "# rotary compare: " << task << "\n\n";
  if (!in.command_line.empty()) md << "Command: `" << in.command_line << "`\n\n";
  const nlohmann::json& c = in.base_config;
  const nlohmann::json model = c.value("model", nlohmann::json::object());
  const nlohmann::json optim = c.value("optim", nlohmann::json::object());
  md << fmt::format(
      "Settings: {} steps, sequence length {}, batch {}, model d_model {} x {} layers x {} heads, AdamW lr {} "
      "(warm-up {}, cosine to {}x), seeds {}..{}. Each encoding ran once per seed; the table gives the mean after "
      "dropping each encoding's worst run for that column (seed 000's protocol, \"the mean of the 9 after removing "
      "the worst session\"; with a single run, that run); the \"every run\" columns give the lowest and highest "
      "value over all runs, the spread over seeds.\n\n",
      c.value("steps", 0), c.value("seq_len", 0), c.value("batch_size", 0), model.value("d_model", 0),
      model.value("n_layers", 0), model.value("n_heads", 0), optim.value("lr", 0.0),
      optim.value("warmup_steps", 0), optim.value("min_lr_ratio", 0.0),
      in.runs.empty() ? 0 : in.runs.front().seed, in.runs.empty() ? 0 : in.runs.back().seed);
  md << "## Results\n\n" << results_table(in) << "\n";
  md << "Final train loss: mean training loss of the last 5% of steps. Held-out loss: " << c.value("eval_batches", 0)
     << " x " << c.value("batch_size", 0) << " held-out rows, every " << c.value("eval_interval", 0)
     << " steps and at the end. Steps to held-out loss: the first evaluation at or below it, interpolated "
     << "linearly from the one before (" << (in.target_loss ? "the level asked for"
                                                     : "the lowest level every run reached: the highest of the "
                                                       "runs' best held-out losses") << "); a run that never reaches it counts as the "
     << "worst. Tokens/s: each run's median training throughput over its steps (runs side by side share the "
     << "machine, so compare encodings of one invocation only).";
  if (c.value("eval_problems", 0) > 0)
    md << " Exact match: " << c.value("eval_problems", 0)
       << " fresh problems, generated through the KV-cache decoder until the stop token, greedy and sampled at "
          "temperature 1.";
  md << "\n\n";
  md << "## Runs\n\n| encoding | seed | status | steps | final train loss | held-out loss | greedy | sampled | time | "
        "directory |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---|\n";
  for (const CompareRun& r : in.runs) {
    const RunSummary& s = r.summary;
    md << "| " << r.encoding << " | " << r.seed << " | " << s.status << (r.reused ? " (earlier)" : "") << " | "
       << s.steps << " | " << num(s.final_train_loss, 4) << " | " << num(opt_or_nan(s.eval_loss), 4) << " | "
       << pct(opt_or_nan(s.accuracy_greedy)) << " | " << pct(opt_or_nan(s.accuracy_sampled)) << " | "
       << fmt::format("{:.0f} s", s.seconds) << " | `" << r.dir << "` |\n";
  }
  md << "\n## Plots\n\n";
  if (!files.plot_problem.empty()) md << "(" << files.plot_problem << ")\n";
  for (const std::string& p : files.plots) {
    const std::string name = p.substr(p.find_last_of('/') + 1);
    md << "![" << name.substr(0, name.size() - 4) << "](" << name << ")\n\n";
  }
  files.report_md = lab::join_path(in.out_dir, "report.md");
  lab::write_file_atomic(files.report_md, md.str());
  return files;
}

}  // namespace rotary::experiments
