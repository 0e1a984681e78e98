// lab/experiments/extrapolate.cpp
#include "experiments/extrapolate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <map>
#include <thread>

#include "common/files.h"
#include "common/limits.h"
#include "common/lists.h"
#include "experiments/cell_store.h"
#include "experiments/extrapolate_eval.h"
#include "experiments/extrapolate_report.h"
#include "experiments/prepared_model.h"
#include "rotary/error.h"
#include "rotary/json_guard.h"
#include "rotary_nn/model.h"
#include "train/checkpoint.h"
#include "train/summary.h"
#include "train/trainer.h"

namespace rotary::experiments {

using namespace train;  // the training engine these experiments run on
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int train_len(const ExtrapolateSpec& s) { return s.text.seq_len; }
int max_len(const ExtrapolateSpec& s) { return train_len(s) * *std::max_element(s.multiples.begin(), s.multiples.end()); }
int64_t main_window(const ExtrapolateSpec& s) { return s.window > 0 ? s.window : train_len(s) / 2; }

std::vector<int64_t> sweep_windows(const ExtrapolateSpec& s) {
  if (s.sweep.size() == 1 && s.sweep[0] < 0) return {};
  if (!s.sweep.empty()) return s.sweep;
  const int64_t L = train_len(s);
  std::vector<int64_t> w;
  for (int64_t v : {L / 8, L / 4, L / 2, 3 * L / 4, L})
    if (v >= 1 && (w.empty() || v != w.back())) w.push_back(v);
  return w;
}

using Prepared = PreparedModel;

void check_model(const Prepared& p, const ExtrapolateSpec& spec, const std::string& task) {
  const std::string who = p.info.role + " model (" + p.info.checkpoint + ")";
  check(p.config.task == task, who + " task", p.config.task, task);
  check(p.config.model.encoding.kind == nn::EncodingKind::Rope, who + " encoding.kind", p.config.model.encoding.kind,
        "rope (the methods are applied to a RoPE model at inference time)");
  check(p.config.model.encoding.rope.scaling == RopeScaling::None, who + " encoding.rope.scaling",
        scaling_name(p.config.model.encoding.rope.scaling), "none");
  check(p.config.seq_len == train_len(spec), who + " seq_len", p.config.seq_len,
        fmt::format("the text model's training length L = {}", train_len(spec)));
  const int64_t logn = p.config.model.encoding.logn_train_len;
  check(logn == 0 || logn == p.config.seq_len, who + " encoding.logn_train_len", logn,
        "0 or its training length (seed 004's log-n)");
}

// What makes a cell's result what it is: a cached cell is reused only when all of it matches.
nlohmann::json cell_settings(const Prepared& p, const ExtrapolateSpec& spec, const std::string& metric,
                             const nn::EncodingConfig& active, int test_len, bool decoded) {
  nlohmann::json j{{"model_config", nlohmann::json(p.config)}, {"model_step", p.info.step},
                   {"checkpoint", p.info.checkpoint},         {"metric", metric},
                   {"encoding", nlohmann::json(active)},      {"test_len", test_len},
                   {"decoded", decoded}};
  j["model_config"].erase("out_dir");
  if (metric == "retrieval") j["problems"] = spec.problems, j["eval_seed"] = spec.eval_seed;
  else j["windows"] = spec.windows;
  return j;
}

nlohmann::json cell_to_json(const Cell& c) {
  return {{"metric", c.metric},       {"method", c.method.key()}, {"test_len", c.test_len},
          {"accuracy", c.accuracy},   {"count", c.count},         {"seconds", c.seconds},
          {"answer_distance", c.answer_distance}, {"loss", c.loss}, {"loss_by_position", c.loss_by_position}};
}

void cell_from_json(const nlohmann::json& j, Cell& c) {
  c.loss = cell_number(j.at("loss"));
  c.accuracy = j.at("accuracy").get<double>();
  c.count = j.at("count").get<int64_t>();
  c.seconds = j.at("seconds").get<double>();
  c.answer_distance = j.value("answer_distance", 0.0);
  c.loss_by_position.clear();
  for (const auto& v : j.at("loss_by_position")) c.loss_by_position.push_back(cell_number(v));
}

class CellRunner {
 public:
  CellRunner(const ExtrapolateSpec& spec, bool progress, int total)
      : spec_(spec), cells_(lab::join_path(spec.out_dir, "cells")), progress_(progress), total_(total) {}

  Cell run(Prepared& p, const std::vector<std::vector<int32_t>>& rows, const std::string& metric, const Method& m,
           int test_len, bool sweep) {
    ++index_;
    Cell c;
    c.metric = metric;
    c.method = m;
    c.test_len = test_len;
    c.sweep = sweep;
    const int L = p.info.train_len;
    p.model->set_override(method_override(m, p.model->config().resolved_encoding(), L, test_len));
    const bool decoded = length_dependent_method(m) && metric != "retrieval";
    const nlohmann::json settings = cell_settings(p, spec_, metric, p.model->active_encoding(), test_len, decoded);
    const std::string path = fmt::format("{}_{}/T{}/{}.json", p.info.role, metric, test_len, m.key());
    const std::string label = fmt::format("[{}/{}] {} T={} {}", index_, total_, metric, test_len, m.label(p.info.trained_logn));

    if (auto it = memo_.find(path); it != memo_.end()) {  // the sweep repeats a main-table cell
      Cell same = it->second;
      same.sweep = sweep;
      return same;
    }
    const CellLookup found = cells_.find_cell(path, settings, c, cell_from_json);
    if (found == CellLookup::Reused) {
      if (progress_) std::fprintf(stderr, "%s: done earlier\n", label.c_str());
      memo_[path] = c;
      return c;
    }
    if (progress_ && found != CellLookup::Missing)
      std::fprintf(stderr, "%s: stored cell %s, computed again\n", label.c_str(), cell_lookup_name(found));
    const auto t0 = Clock::now();
    if (metric == "retrieval") {
      const RetrievalScore r = score_retrieval(p.model, test_len, spec_.problems, spec_.eval_seed);
      c.loss = std::nan("");
      c.accuracy = r.accuracy;
      c.count = r.problems;
      c.answer_distance = r.answer_distance;
    } else {
      const WindowMode mode = metric == "text" ? WindowMode::Plain : WindowMode::Repeated;
      const WindowScore s = score_windows(p.model, rows, test_len, L, mode, decoded, spec_.batch_size);
      c.loss = s.loss;
      c.accuracy = s.accuracy;
      c.count = s.tokens;
      if (metric == "text" && test_len == max_len(spec_) && !sweep) c.loss_by_position = s.loss_by_position;
    }
    c.seconds = seconds_since(t0);
    cells_.store(path, settings, cell_to_json(c));
    if (progress_) {
      const std::string what = metric == "retrieval"
                                   ? fmt::format("exact match {:.1f}% of {}", 100 * c.accuracy, c.count)
                                   : fmt::format("accuracy {:.2f}%, loss {:.4f}", 100 * c.accuracy, c.loss);
      std::fprintf(stderr, "%s: %s (%.1f s)\n", label.c_str(), what.c_str(), c.seconds);
    }
    memo_[path] = c;
    return c;
  }

 private:
  const ExtrapolateSpec& spec_;
  CellStore cells_;
  bool progress_;
  int total_, index_ = 0;
  std::map<std::string, Cell> memo_;
};

}  // namespace

ExtrapolateSpec default_extrapolate_spec() {
  ExtrapolateSpec s;
  TrainConfig& t = s.text;
  t.task = "text";
  t.model.d_model = 128;
  t.model.n_layers = 2;
  t.model.n_heads = 4;
  t.model.encoding.kind = nn::EncodingKind::Rope;
  t.seq_len = 128;
  t.batch_size = 32;
  t.steps = 1000;
  t.optim.lr = 3e-3;
  t.optim.warmup_steps = 100;
  t.eval_interval = 250;
  t.eval_batches = 2;
  t.eval_problems = 0;
  TrainConfig& k = s.kv;
  k = t;
  k.task = "kv_retrieval";
  k.task_options.kv_pairs = 8;  // 14 * 8 + 9 = 121 characters: one problem per row of 128
  k.steps = 1000;
  k.eval_problems = 32;
  return s;
}

void validate(const ExtrapolateSpec& spec) {
  check(spec.text.task == "text", "text.task", spec.text.task, "text (the KJV model)");
  check(spec.kv.task == "kv_retrieval", "kv.task", spec.kv.task, "kv_retrieval");
  const int L = train_len(spec);
  check(L >= 8, "seq_len", L, ">= 8");
  check(!spec.multiples.empty(), "lengths", "(none)", "a list of multiples of L such as 1,2,4,8");
  for (int m : spec.multiples) check(m >= 1 && m <= 1024, "lengths", m, "multiples of L in [1, 1024]");
  check(!spec.methods.empty(), "methods", "(none)", "a comma-separated list");
  for (const std::string& m : spec.methods) check_method_name(m, "methods");
  lab::check_unique(spec.multiples, "lengths");
  lab::check_unique(spec.methods, "methods");
  lab::check_unique(spec.sweep, "sweep");
  check(!spec.logn.empty(), "logn", "(none)", "off, on or both");
  check(spec.window >= 0 && spec.window <= L, "window", spec.window, fmt::format("0 (= L/2) or in [1, L = {}]", L));
  check(std::isfinite(spec.leaky_k) && spec.leaky_k >= 1, "leaky_k", spec.leaky_k, "a number >= 1");
  check(std::isfinite(spec.dynamic_factor) && spec.dynamic_factor >= 1, "dynamic_factor", spec.dynamic_factor, ">= 1");
  if (!(spec.sweep.size() == 1 && spec.sweep[0] < 0))
    for (int64_t w : spec.sweep) check(w >= 1 && w <= L, "sweep", w, fmt::format("windows in [1, L = {}]", L));
  check(spec.windows >= 1, "windows", spec.windows, ">= 1");
  check(spec.batch_size >= 1, "eval_batch_size", spec.batch_size, ">= 1");
  check(spec.problems >= 1, "problems", spec.problems, ">= 1");
  check(spec.threads >= 0 && spec.threads <= lab::kMaxThreads, "threads", spec.threads,
        "an integer in [0, " + std::to_string(lab::kMaxThreads) + "] (0 = all cores)");
  for (const TrainConfig* c : {&spec.text, &spec.kv}) {
    if (c == &spec.kv && !spec.retrieval) continue;
    const std::string who = c == &spec.text ? "text." : "kv.";
    check(c->seq_len == L, who + "seq_len", c->seq_len, fmt::format("L = {} (the text model's)", L));
    const nn::EncodingConfig& e = c->model.encoding;
    check(e.kind == nn::EncodingKind::Rope, who + "encoding.kind", e.kind, "rope (the methods are applied at inference time)");
    check(e.rope.scaling == RopeScaling::None, who + "encoding.rope.scaling", scaling_name(e.rope.scaling),
          "none (the methods set the scaling)");
    check(e.logn_train_len == 0 || e.logn_train_len == L, who + "encoding.logn_train_len", e.logn_train_len,
          fmt::format("0 or L = {} (seed 004's log-n)", L));
    c->validate();
  }
}

ExtrapolateResult run_extrapolate(const ExtrapolateSpec& spec_in, bool progress) {
  ExtrapolateSpec spec = spec_in;
  if (!spec.text_checkpoint.empty()) {
    // A loaded model fixes L: both models are then scored at its training length.
    TrainConfig stored;
    from_json(read_checkpoint_meta(resolve_checkpoint(spec.text_checkpoint)).config, stored);
    spec.text.seq_len = spec.kv.seq_len = stored.seq_len;
  }
  spec.text.out_dir = lab::join_path(spec.out_dir, "text_model");
  spec.kv.out_dir = lab::join_path(spec.out_dir, "kv_model");
  validate(spec);
  const lab::DirectoryLock lock(spec.out_dir, "--out");  // one command at a time trains its models and cells
  lab::remove_stale_temp_files(spec.out_dir);  // of an earlier run killed mid-write
  const auto t0 = Clock::now();
  ExtrapolateResult result;

  Prepared text, kv;
  RunOutcome stopped;
  auto stop = [&] {
    result.run =
        RunOutcome::interrupted_by(stopped.signal, stopped.message + "; rerun the same extrapolate to continue");
    return result;
  };
  if (!prepare_model(spec.text, spec.text_checkpoint, "text", progress, text, stopped)) return stop();
  check_model(text, spec, "text");
  if (spec.retrieval) {
    if (!prepare_model(spec.kv, spec.kv_checkpoint, "kv", progress, kv, stopped)) return stop();
    check_model(kv, spec, "kv_retrieval");
  }
  use_threads(spec.threads);

  const int L = train_len(spec);
  std::vector<int> lengths;
  for (int m : spec.multiples) lengths.push_back(L * m);
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  const std::unique_ptr<lab::Task> text_task = lab::make_task("text", text.config.task_options);
  const std::vector<std::vector<int32_t>> rows = heldout_base_rows(*text_task, spec.windows, lengths.back());

  std::vector<Method> methods;
  for (const std::string& name : spec.methods)
    for (bool logn : spec.logn) {
      Method m;
      m.name = name;
      m.logn = logn;
      if (name == "rerope" || name == "leaky_rerope") m.window = main_window(spec);
      if (name == "leaky_rerope") m.leaky_k = spec.leaky_k;
      if (name == "dynamic") m.dynamic_factor = spec.dynamic_factor;
      methods.push_back(m);
    }
  const std::vector<int64_t> sweep = sweep_windows(spec);
  const std::vector<int> sweep_lengths = lengths.size() > 1 ? std::vector<int>{L, lengths.back()} : lengths;
  const int per_length = static_cast<int>(methods.size());
  const int total = per_length * static_cast<int>(lengths.size()) * (2 + (spec.retrieval ? 1 : 0)) +
                    static_cast<int>(sweep.size() * spec.logn.size() * sweep_lengths.size()) * 2;
  CellRunner runner(spec, progress, total);

  for (int T : lengths)
    for (const char* metric : {"text", "repeated"})
      for (const Method& m : methods) result.cells.push_back(runner.run(text, rows, metric, m, T, false));
  if (spec.retrieval)
    for (int T : lengths)
      for (const Method& m : methods) result.cells.push_back(runner.run(kv, rows, "retrieval", m, T, false));
  for (int T : sweep_lengths)
    for (const char* metric : {"text", "repeated"})
      for (int64_t w : sweep)
        for (bool logn : spec.logn) {
          Method m;
          m.name = "rerope";
          m.window = w;
          m.logn = logn;
          result.cells.push_back(runner.run(text, rows, metric, m, T, true));
        }
  text.model->set_override({});

  result.models.push_back(text.info);
  if (spec.retrieval) result.models.push_back(kv.info);
  result.seconds = seconds_since(t0);

  ReportInput in{spec, L, lengths, sweep, result.models, result.cells, result.seconds};
  ReportOutput out = write_extrapolate_report(in);
  result.report_md = out.report_md;
  result.plots = out.plots;
  result.plot_problem = out.plot_problem;
  return result;
}

}  // namespace rotary::experiments
