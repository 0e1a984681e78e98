// lab/experiments/reproduce.cpp
#include "experiments/reproduce.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "common/files.h"
#include "common/lists.h"
#include "common/machine.h"
#include "common/process.h"
#include "experiments/compare.h"
#include "experiments/decay.h"
#include "experiments/example_runs.h"
#include "experiments/extrapolate.h"
#include "experiments/report.h"
#include "rotary/error.h"

namespace rotary::experiments {

using namespace train;  // the training engine these experiments run on
namespace {

using nlohmann::json;

bool is_scale(const std::string& s, std::string_view name) { return s == name; }

// ---- the studies' run descriptions, per scale ----------------------------------------------------------------

// The small model every default-scale compare trains (the main job's: docs/lab.md says why one thread per run).
TrainConfig small_run(const std::string& task) {
  TrainConfig c = default_compare_spec().base;
  c.task = task;
  return c;
}

// Smoke: tiny models and a handful of steps - the machinery end to end, not the claims.
void shrink_to_smoke(TrainConfig& c) {
  c.model.d_model = 32;  // head_dim 16: the smallest the fused kernels take (ALiBi and T5 run fused)
  c.model.n_layers = 1;
  c.model.n_heads = 2;
  if (c.model.attention == nn::AttentionKind::Performer) c.model.performer_features = 8;
  c.seq_len = std::min(c.seq_len, 32);
  c.batch_size = 4;
  c.steps = 16;
  c.optim.warmup_steps = 2;
  c.eval_interval = 8;
  c.eval_batches = 1;
  c.eval_problems = c.eval_problems > 0 ? 4 : 0;
  c.threads = 1;
}

// Seed 000's models: the run files users run (examples/runs/seed000-<task>.toml, compiled in), all threads.
TrainConfig seed000_run(const std::string& task) {
  std::string name = "seed000-" + task;
  std::replace(name.begin(), name.end(), '_', '-');
  TrainConfig c = example_run(name);
  c.threads = 0;
  return c;
}

struct StudyCompare {
  CompareSpec spec;
  std::string note;  // the scale in words, for the report
};

}  // namespace

CompareSpec reproduce_compare_spec(const ReproduceSpec& r, const std::string& study);

namespace {

StudyCompare compare_study(const ReproduceSpec& r, const std::string& study) {
  StudyCompare out;
  CompareSpec& s = out.spec;
  s.out_dir = lab::join_path(r.out_dir, study);
  s.rotary_program = r.rotary_program;
  s.jobs = r.jobs;
  s.seeds = 3;
  TrainConfig& c = s.base;
  const bool seed = is_scale(r.scale, "seed"), smoke = is_scale(r.scale, "smoke");
  if (study.rfind("seed000_", 0) == 0) {
    const std::string task = study.substr(8);
    s.encodings = {"rope", "roper"};
    if (seed) {
      c = seed000_run(task);
      s.seeds = 10;
    } else {
      c = small_run(task);
      if (task == "substring_index") c.task_options.max_string = 12;  // ~30 characters a problem, 4 a row
    }
  } else if (study == "seed002_text") {
    s.encodings = {"learned", "t5", "rope", "sinusoidal", "alibi", "roper"};
    c = small_run("text");
    c.task_options.text_tokenizer = "bpe";
    c.eval_problems = 0;
    c.eval_interval = 100;  // the steps-to-loss column reads between evaluations
    c.eval_batches = 4;
    c.steps = 1200;
    if (seed) {
      // GPT-3 small's shape (the seed's 125M models), on our 1M-token corpus rather than OpenWebText2.
      c.model.d_model = 768, c.model.n_layers = 12, c.model.n_heads = 12;
      c.seq_len = 1024, c.batch_size = 32, c.steps = 20000, c.eval_interval = 500;
      c.task_options.text_vocab = 8000;
      c.optim.lr = 6e-4, c.optim.warmup_steps = 1000;
      c.threads = 0;
    }
  } else if (study == "seed002_performer") {
    s.encodings = {"none", "rope"};
    c = small_run("text");
    c.task_options.text_tokenizer = "char";
    c.model.attention = nn::AttentionKind::Performer;
    c.eval_problems = 0;
    c.eval_interval = 100;
    c.eval_batches = 4;
    c.seq_len = 256;
    c.steps = 1000;
    if (seed) {
      // The seed's enwik8 Performers: 8 layers, 512 wide, 8 heads, characters.
      c.model.d_model = 512, c.model.n_layers = 8, c.model.n_heads = 8;
      c.seq_len = 1024, c.batch_size = 16, c.steps = 20000, c.eval_interval = 500;
      c.optim.lr = 1e-3, c.optim.warmup_steps = 1000;
      c.threads = 0;
    }
  } else {
    fail("study", study,
         "a compare study: seed000_addition, seed000_substring_index, seed000_substring_search, seed002_text, "
         "seed002_performer");
  }
  if (smoke) {
    shrink_to_smoke(c);
    s.seeds = 2;
  }
  if (!r.cache_dir.empty()) c.task_options.cache_dir = r.cache_dir;
  c.out_dir = s.out_dir;
  out.note = smoke ? "smoke scale (tiny models, 16 steps): checks the machinery, not the claim"
                   : fmt::format("d_model {} x {} layers, {} steps, batch {} x {}, {} seeds", c.model.d_model,
                                 c.model.n_layers, c.steps, c.batch_size, c.seq_len, s.seeds);
  return out;
}

}  // namespace

ExtrapolateSpec reproduce_extrapolate_spec(const ReproduceSpec& r) {
  ExtrapolateSpec e = default_extrapolate_spec();
  e.out_dir = lab::join_path(r.out_dir, "seed004_extrapolate");
  if (is_scale(r.scale, "smoke")) {
    shrink_to_smoke(e.text);
    e.multiples = {1, 2};
    e.windows = 2;
    e.batch_size = 2;
    e.problems = 2;
  } else if (is_scale(r.scale, "seed")) {
    // The seed's 100M model trained at 512 and tested at 4096 (8L).
    TrainConfig& t = e.text;
    t.model.d_model = 768, t.model.n_layers = 12, t.model.n_heads = 12;
    t.seq_len = 512, t.batch_size = 32, t.steps = 20000, t.eval_interval = 1000;
    t.optim.lr = 6e-4, t.optim.warmup_steps = 1000;
    t.threads = 0;
    e.windows = 64;
  }
  if (!r.cache_dir.empty()) e.text.task_options.cache_dir = e.kv.task_options.cache_dir = r.cache_dir;
  e.text.out_dir = lab::join_path(e.out_dir, "text_model");
  e.kv.out_dir = lab::join_path(e.out_dir, "kv_model");
  return e;
}

MemorySpec reproduce_memory_spec(const ReproduceSpec& r) {
  MemorySpec m = default_memory_spec();
  m.out_dir = lab::join_path(r.out_dir, "seed001_memory");
  if (is_scale(r.scale, "smoke")) {
    TrainConfig& t = m.run;
    t.model.d_model = 32, t.model.n_layers = 1, t.model.n_heads = 2;
    t.seq_len = 128, t.model.encoding.window = 64;  // the passkey problem needs ~100 characters
    t.batch_size = 2, t.steps = 16, t.optim.warmup_steps = 2;
    t.eval_interval = 8, t.eval_batches = 1, t.eval_problems = 2;
    t.threads = 1;
    m.multiples = {1, 2};
    m.full_max_multiple = 2;
    m.problems = 2;
    m.indexes = {};
  } else if (is_scale(r.scale, "seed")) {
    m.problems = 50;  // the default model: seed 001 names no model, only the problem (multiples 1, 8, 64, 512)
  } else {
    m.multiples = {1, 8, 64};
    m.indexes = {};  // the approximate indexes on this model's keys: `rotary memory` (docs/memory.md)
  }
  return m;
}

CompareSpec reproduce_compare_spec(const ReproduceSpec& r, const std::string& study) {
  return compare_study(r, study).spec;
}

namespace {

// ---- numbers and verdicts ------------------------------------------------------------------------------------

std::string num(double v, int decimals) { return std::isfinite(v) ? fmt::format("{:.{}f}", v, decimals) : "n/a"; }
std::string pct(double v) { return std::isfinite(v) ? fmt::format("{:.1f}%", 100 * v) : "n/a"; }

const EncodingStats* stats_of(const std::vector<EncodingStats>& all, const std::string& enc) {
  for (const EncodingStats& s : all)
    if (s.encoding == enc) return &s;
  return nullptr;
}

// "rope 0.2469 (0.2457-0.2496)": the drop-worst mean and the spread of every run.
std::string with_spread(const std::vector<double>& runs, double mean, bool percent, int decimals = 3) {
  double lo = INFINITY, hi = -INFINITY;
  for (double v : runs)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  auto f = [&](double v) { return percent ? pct(v) : num(v, decimals); };
  if (!std::isfinite(lo)) return f(mean);
  return runs.size() > 1 ? fmt::format("{} ({}-{})", f(mean), f(lo), f(hi)) : f(mean);
}

// A claim that one encoding beats another on one metric of a compare.
Claim ordering_claim(const std::string& seed, const std::string& study, const std::string& text,
                     const std::string& theirs, const std::vector<EncodingStats>& stats, const std::string& better,
                     const std::string& worse, const std::string& metric) {
  Claim c{seed, study, text, theirs, "", "not measured", ""};
  const EncodingStats* a = stats_of(stats, better);
  const EncodingStats* b = stats_of(stats, worse);
  if (!a || !b) return c;
  const bool percent = metric == "sampled" || metric == "greedy";
  const bool higher = percent;
  auto runs = [&](const EncodingStats* s) -> const std::vector<double>& {
    if (metric == "sampled") return s->run_sampled;
    if (metric == "greedy") return s->run_greedy;
    if (metric == "steps") return s->run_steps_to_target;
    return s->run_eval_loss;
  };
  auto mean = [&](const EncodingStats* s) {
    if (metric == "sampled") return s->accuracy_sampled;
    if (metric == "greedy") return s->accuracy_greedy;
    if (metric == "steps") return s->steps_to_target;
    return s->eval_loss;
  };
  const int decimals = metric == "steps" ? 0 : 3;
  c.ours = fmt::format("{} {} vs {} {}", better, with_spread(runs(a), mean(a), percent, decimals), worse,
                       with_spread(runs(b), mean(b), percent, decimals));
  c.verdict = ordering_verdict(runs(a), runs(b), higher);
  // The drop-worst means decide "within noise"; ordering_verdict looks at every run's values, so for a claim on
  // the means (the seeds report means) take the means' order when the spreads overlap.
  if (c.verdict == "same ordering, within noise" || c.verdict == "not reproduced") {
    const double ma = mean(a), mb = mean(b);
    if (std::isfinite(ma) && std::isfinite(mb))
      c.verdict = (higher ? ma > mb : ma < mb) ? "same ordering, within noise" : "not reproduced";
  }
  return c;
}

struct ExtrapolateView {
  const ExtrapolateResult* r = nullptr;
  int L = 0;
  // Accuracy of a main-table (or sweep) cell; NaN when absent.
  double acc(const std::string& metric, const std::string& method, bool logn, int test_len, int64_t window = -1,
             bool sweep = false) const {
    for (const Cell& c : r->cells)
      if (c.metric == metric && c.method.name == method && c.method.logn == logn && c.test_len == test_len &&
          c.sweep == sweep && (window < 0 || c.method.window == window))
        return c.accuracy;
    return std::nan("");
  }
  double loss(const std::string& method, int test_len) const {
    for (const Cell& c : r->cells)
      if (c.metric == "text" && c.method.name == method && !c.method.logn && c.test_len == test_len && !c.sweep)
        return c.loss;
    return std::nan("");
  }
};

std::string verdict_of(bool ok) { return ok ? "reproduced" : "not reproduced"; }

// ---- child processes (benchmarks, decay) ---------------------------------------------------------------------

// Runs `rotary <args>` unless <dir>/<name>.json holds the output of the same command (a cell of cell_store.h
// whose settings are the command line); returns its JSON output (the command's stdout) or null with `problem` set.
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

// decay_model.csv (written by `rotary decay --checkpoint`): distance -> measured mean |q R(d) k|, relative to d = 0.
std::map<int64_t, double> read_measured_decay(const std::string& csv_path) {
  std::map<int64_t, double> out;
  std::istringstream in(lab::read_file(csv_path));
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream row(line);
    std::string cell;
    std::vector<std::string> cells;
    while (std::getline(row, cell, ',')) cells.push_back(cell);
    if (cells.size() < 5) continue;
    try {
      out[std::stoll(cells[0])] = std::stod(cells[4]);
    } catch (const std::exception&) {
    }
  }
  return out;
}

double block_mean(const std::vector<double>& v, size_t lo, size_t hi) {
  double s = 0;
  size_t n = 0;
  for (size_t i = lo; i < hi && i < v.size(); ++i) s += v[i], ++n;
  return n ? s / double(n) : std::nan("");
}

}  // namespace

std::string ordering_verdict(const std::vector<double>& expected_better, const std::vector<double>& other,
                             bool higher_is_better) {
  auto finite = [](const std::vector<double>& v) {
    std::vector<double> f;
    for (double x : v)
      if (std::isfinite(x)) f.push_back(x);
    return f;
  };
  const std::vector<double> a = finite(expected_better), b = finite(other);
  if (a.empty() || b.empty()) return "not measured";
  const double a_worst = higher_is_better ? *std::min_element(a.begin(), a.end()) : *std::max_element(a.begin(), a.end());
  const double b_best = higher_is_better ? *std::max_element(b.begin(), b.end()) : *std::min_element(b.begin(), b.end());
  if (higher_is_better ? a_worst > b_best : a_worst < b_best) return "reproduced";
  const double ma = drop_worst_mean(a, higher_is_better), mb = drop_worst_mean(b, higher_is_better);
  if (higher_is_better ? ma > mb : ma < mb) return "same ordering, within noise";
  return "not reproduced";
}

void validate(const ReproduceSpec& spec) {
  check(std::find(std::begin(kReproduceScales), std::end(kReproduceScales), spec.scale) != std::end(kReproduceScales),
        "scale", spec.scale, "smoke, default or seed");
  std::string all;
  for (std::string_view s : kReproduceStudies) all += (all.empty() ? "" : ", ") + std::string(s);
  for (const std::string& s : spec.studies)
    check(std::find(std::begin(kReproduceStudies), std::end(kReproduceStudies), s) != std::end(kReproduceStudies),
          "studies", s, all);
  lab::check_unique(spec.studies, "studies");
  check(spec.jobs >= 0 && spec.jobs <= 256, "jobs", spec.jobs, "an integer in [0, 256] (0: one per core)");
}

namespace {

// What every study reads and adds to: the spec, the claims and the report's sections, and seed 004's extrapolation
// (seed 003 measures its text model).
struct Reproduction {
  const ReproduceSpec& spec;
  bool progress;
  ReproduceResult& result;
  std::ostringstream sections;
  ExtrapolateSpec es;
  std::optional<ExtrapolateResult> ex;
  std::string scale_note;  // for the claims whose note does not already say the scale

  // Records that `study` was interrupted (result.run) and returns false, so a study can `return stopped(...)`.
  bool stopped(const std::string& study, const RunOutcome& run) {
    result.run = RunOutcome::interrupted_by(
        run.signal, study + ": " + run.message + "; rerun the same `rotary reproduce` to continue");
    return false;
  }
  // Runs a compare study into `in`; false when it was interrupted.
  bool compare(const std::string& study, StudyCompare& sc, ReportInputs& in) {
    sc = compare_study(spec, study);
    if (progress) std::fprintf(stderr, "reproduce: %s (%s)\n", study.c_str(), sc.note.c_str());
    CompareResult c = run_compare(sc.spec, progress);
    if (c.run.interrupted()) return stopped(study, c.run);
    in = ReportInputs{sc.spec.out_dir, sc.spec.base.task, sc.spec.encodings, c.runs, sc.spec.base, "", {}};
    return true;
  }
};

// A study: when `wanted`, runs and adds its claims; otherwise adds them as "not measured" (study not run). Returns
// false when it was interrupted (r.result.run says how).
using StudyRun = bool (*)(Reproduction& r, const std::string& study, bool wanted);

// Seed 000: RoPER against RoPE on one of its three tasks (a compare).
bool seed000_study(Reproduction& r, const std::string& study, bool wanted) {
  std::vector<Claim>& claims = r.result.claims;
  std::ostringstream& sections = r.sections;
  struct Seed000 {
    const char* study;
    const char* claim;
    const char* theirs;
    const char* metric;
  };
  const Seed000 seed000[] = {
      {"seed000_addition", "RoPER solves more step-by-step additions than RoPE (exact match, sampled)",
       "RoPER above RoPE (the seed's chart; no number in its text)", "sampled"},
      {"seed000_substring_index", "RoPER solves more substring-by-index problems than RoPE (exact match, sampled)",
       "RoPER 96.11 vs RoPE 62.00 of 128 (75.1% vs 48.4%; the seed's chart as issue 12 reads it)", "sampled"},
      {"seed000_substring_search", "RoPER ends substring-by-search with a lower loss than RoPE",
       "RoPER's loss curves below RoPE's (the seed's chart)", "eval_loss"},
  };
  for (const Seed000& s : seed000) {
    if (study != s.study) continue;
    if (!wanted) {
      claims.push_back({"000", s.study, s.claim, s.theirs, "", "not measured", "study not run"});
      return true;
    }
    StudyCompare sc;
    ReportInputs in;
    if (!r.compare(s.study, sc, in)) return false;
    const std::vector<EncodingStats> st = encoding_stats(in);
    Claim c = ordering_claim("000", s.study, s.claim, s.theirs, st, "roper", "rope", s.metric);
    c.note = sc.note;
    claims.push_back(c);
    sections << "### " << s.study << "\n\n" << sc.note << "; [report](" << s.study << "/report.md)\n\n"
             << results_table(in) << "\n";
  }
  return true;
}

// Seed 001: the seed's problem - every retrieved segment at the same relative positions - and its two questions
// (how far Unlimiformer's approximations move the retrieval; whether the retrieved keys' rotation matters), on a
// ReRoPE passkey model read far past L through the memory (`rotary memory`).
bool seed001_study(Reproduction& r, const std::string& study, bool wanted) {
  Claim far{"001", study,
            "Through a memory that puts every retrieved key at one relative position (the model's own ReRoPE "
            "policy), a model reads far past its training length where full attention fails",
            "the seed's problem statement (no number)", "", "not measured", ""};
  Claim approx{"001", study,
               "Unlimiformer's two approximations (its store query, its key positions) change the keys retrieved "
               "and their logits",
               "\"confirmed experimentally\" (no number given)", "", "not measured", ""};
  Claim rotation{"001", study, "The retrieved keys' rotation is necessary during generation (Experiment 2)",
                 "the seed's question (no answer given)", "", "not measured", ""};
  if (!wanted) {
    far.note = approx.note = rotation.note = "study not run";
  } else {
    MemorySpec m = reproduce_memory_spec(r.spec);
    m.command_line = r.spec.command_line;
    if (r.progress) std::fprintf(stderr, "reproduce: %s\n", study.c_str());
    const MemoryResult res = run_memory(m, r.progress);
    if (res.run.interrupted()) return r.stopped(study, res.run);
    const int L = m.run.seq_len, k = m.top_k.front();
    const int far_len = L * *std::max_element(m.multiples.begin(), m.multiples.end());
    const std::string own = m.run.model.encoding.kind == nn::EncodingKind::Rope ? "exact" : "rerope";
    auto cell = [&](const std::string& kind, const std::string& name, int T) -> const MemoryCell* {
      for (const MemoryCell& c : res.cells)
        if (c.kind == kind && c.name == name && c.test_len == T && (kind == "full" || c.top_k == k)) return &c;
      return nullptr;
    };
    const std::string times = fmt::format("{}L", far_len / L);
    const MemoryCell *own_L = cell("memory", own, L), *own_far = cell("memory", own, far_len);
    // Full attention at the longest length it was run (full_max_multiple): where it has to reach past L.
    const MemoryCell* full = nullptr;
    for (const MemoryCell& c : res.cells)
      if (c.kind == "full" && c.name == "trained" && c.test_len > L && (!full || c.test_len > full->test_len))
        full = &c;
    if (own_L && own_far) {
      far.ours = fmt::format("memory `{}` (top-{}): {} at L, {} at {}", own, k, pct(own_L->accuracy),
                             pct(own_far->accuracy), times);
      bool ok = own_far->accuracy >= own_L->accuracy - 0.1;
      if (full) {
        const MemoryCell* own_there = cell("memory", own, full->test_len);
        far.ours += fmt::format("; full context {} at {}L", pct(full->accuracy), full->test_len / L);
        ok = ok && own_there && own_there->accuracy > full->accuracy;
      }
      far.verdict = verdict_of(ok);
    }
    if (const MemoryCell* u = cell("memory", "unlimiformer", far_len); u && std::isfinite(u->reference_overlap)) {
      approx.ours = fmt::format("at {}: its top-{} holds {:.0f}% of the `{}` top-{}; logits of what it retrieves off "
                                "by {:.2f} (scaled); exact match {}",
                                times, k, 100 * u->reference_overlap, own, k, u->logit_error, pct(u->accuracy));
      approx.verdict = verdict_of(u->reference_overlap < 0.9);
    }
    if (const MemoryCell* none = cell("memory", "none", far_len); none && own_far) {
      rotation.ours = fmt::format("at {}: un-rotated keys (`none`) {} vs `{}` {}", times, pct(none->accuracy), own,
                                  pct(own_far->accuracy));
      if (std::isfinite(none->reference_overlap))
        rotation.ours += fmt::format("; {:.0f}% of the `{}` top-{} retrieved", 100 * none->reference_overlap, own, k);
      rotation.verdict = verdict_of(none->accuracy < own_far->accuracy);
    }
    far.note = approx.note = rotation.note =
        fmt::format("one {} passkey model, L = {}, {} prompts a cell{}",
                    nn::encoding_kind_name(m.run.model.encoding.kind), L, m.problems, r.scale_note);
    r.sections << "### seed001_memory\n\n`rotary memory` on " << res.model.description
               << "; [report](seed001_memory/report.md)\n\n";
  }
  for (Claim* c : {&far, &approx, &rotation}) r.result.claims.push_back(*c);
  return true;
}

// Seed 002: rotary against learned, T5, sinusoidal, ALiBi (and RoPER) on text (a compare).
bool seed002_text_study(Reproduction& r, const std::string& study, bool wanted) {
  std::vector<Claim>& claims = r.result.claims;
  std::ostringstream& sections = r.sections;
  const char* owt2 = "OWT2 2.759 vs learned 2.809, T5 2.801 (125M, 55k steps); Pile 2.173 vs 2.240, 2.223 (1.4B)";
  if (wanted) {
    StudyCompare sc;
    ReportInputs in;
    if (!r.compare(study, sc, in)) return false;
    const std::vector<EncodingStats> st = encoding_stats(in);
    const std::string& note = sc.note;
    auto add = [&](Claim c) {
      c.note = note;
      claims.push_back(c);
    };
    add(ordering_claim("002", "seed002_text", "Rotary ends with a lower validation loss than learned absolute positions",
                       owt2, st, "rope", "learned", "eval_loss"));
    add(ordering_claim("002", "seed002_text", "Rotary ends with a lower validation loss than T5's relative bias", owt2,
                       st, "rope", "t5", "eval_loss"));
    add(ordering_claim("002", "seed002_text", "T5's relative bias ends below learned absolute positions",
                       "OWT2 2.801 vs 2.809; Pile 2.223 vs 2.240", st, "t5", "learned", "eval_loss"));
    const double target = resolved_target_loss(in);
    Claim conv = ordering_claim(
        "002", "seed002_text",
        fmt::format("Rotary reaches a given validation loss ({}) in fewer steps than learned absolute positions",
                    num(target, 3)),
        "~30% faster convergence than learned absolute (Pile, 1.4B)", st, "rope", "learned", "steps");
    const EncodingStats *rope = stats_of(st, "rope"), *learned = stats_of(st, "learned"), *t5 = stats_of(st, "t5");
    if (rope && learned && std::isfinite(rope->steps_to_target) && std::isfinite(learned->steps_to_target))
      conv.ours += fmt::format("; learned / rotary = {:.2f}", learned->steps_to_target / rope->steps_to_target);
    add(conv);
    Claim conv_t5 = ordering_claim("002", "seed002_text",
                                   "Rotary reaches that loss in fewer steps than T5's relative bias",
                                   "10-20% faster than T5 RPE (Pile, 1.4B)", st, "rope", "t5", "steps");
    if (rope && t5 && std::isfinite(rope->steps_to_target) && std::isfinite(t5->steps_to_target))
      conv_t5.ours += fmt::format("; T5 / rotary = {:.2f}", t5->steps_to_target / rope->steps_to_target);
    add(conv_t5);
    // Seed 000's language-model claim: RoPER does not hurt language modelling against RoPE.
    Claim lm{"000", "seed002_text", "RoPER does not degrade language modelling against RoPE",
             "similar training and validation losses (200M model, English Wikipedia)", "", "not measured", note};
    const EncodingStats* roper = stats_of(st, "roper");
    if (rope && roper && std::isfinite(rope->eval_loss) && std::isfinite(roper->eval_loss)) {
      lm.ours = fmt::format("roper {} vs rope {}", with_spread(roper->run_eval_loss, roper->eval_loss, false),
                            with_spread(rope->run_eval_loss, rope->eval_loss, false));
      // "Not worse" up to the seeds' spread: RoPER's mean at most the larger of the two encodings' run ranges above.
      double spread = 0;
      for (const EncodingStats* s : {rope, roper})
        if (std::isfinite(s->eval_loss_max) && std::isfinite(s->eval_loss_min))
          spread = std::max(spread, s->eval_loss_max - s->eval_loss_min);
      lm.verdict = verdict_of(roper->eval_loss <= rope->eval_loss + spread);
    }
    claims.push_back(lm);
    sections << "### seed002_text\n\n" << sc.note << "; [report](seed002_text/report.md)\n\n" << results_table(in)
             << "\n";
  } else {
    claims.push_back({"002", "seed002_text", "Rotary ends with a lower validation loss than learned absolute and T5",
                      owt2, "", "not measured", "study not run"});
  }
  return true;
}

// Seed 002: rotary inside a Performer (a compare).
bool seed002_performer_study(Reproduction& r, const std::string& study, bool wanted) {
  std::vector<Claim>& claims = r.result.claims;
  std::ostringstream& sections = r.sections;
  const char* performer_claim = "Rotary inside a Performer lowers its validation loss";
  const char* performer_theirs = "\"stark decreases in validation loss\" (enwik8, 8 layers x 512, chart)";
  if (wanted) {
    StudyCompare sc;
    ReportInputs in;
    if (!r.compare(study, sc, in)) return false;
    Claim c = ordering_claim("002", "seed002_performer", performer_claim, performer_theirs, encoding_stats(in), "rope",
                             "none", "eval_loss");
    c.note = sc.note + ", KJV characters";
    claims.push_back(c);
    sections << "### seed002_performer\n\nPerformer (FAVOR+) attention; encodings `none` (no position information "
                "but the causal prefix sums) and `rope` (rotary on q and k before the feature map). "
             << sc.note << "; [report](seed002_performer/report.md)\n\n" << results_table(in) << "\n";
  } else {
    claims.push_back({"002", "seed002_performer", performer_claim, performer_theirs, "", "not measured", "study not run"});
  }
  return true;
}

// Seed 002: what rotary costs (two benchmarks, as child processes).
bool seed002_runtime_study(Reproduction& r, const std::string& study, bool wanted) {
  std::vector<Claim>& claims = r.result.claims;
  std::ostringstream& sections = r.sections;
  const ReproduceSpec& spec = r.spec;
  {
    const std::string dir = lab::join_path(spec.out_dir, "seed002_runtime");
    Claim naive{"002", "seed002_runtime", "Rotary applied naively costs several times an additive position embedding",
                "4-5x (5.3 ms vs 2.1 ms for q, k of [2048, 16, 12, 64], PyTorch on a GPU)", "", "not measured", ""};
    Claim fused{"002", "seed002_runtime", "Fused, rotary costs at most 2-2.5x an additive embedding",
                "2-2.5x with TorchScript fusion", "", "not measured", ""};
    Claim model{"002", "seed002_runtime", "In a whole model, rotary costs 1-3% of training time over learned positions",
                "1-3% across model sizes, fused", "", "not measured", ""};
    if (wanted) {
      lab::make_dirs(dir);
      const bool smoke = is_scale(spec.scale, "smoke");
      std::vector<std::string> cost{"bench", "rope-cost", "--json", "--threads", "1"};
      if (smoke) cost.insert(cost.end(), {"--seq", "64", "--batch", "2", "--trials", "3", "--min-trial-ms", "2"});
      else cost.insert(cost.end(), {"--trials", "9"});
      std::string problem;
      const json j = cached_child_json(spec, dir, "rope_cost", cost, problem, r.progress);
      if (!j.is_null()) {
        const double ours = j.value("rope_apply_over_additive", std::nan(""));
        fused.ours = fmt::format("ours {:.2f}x (rope_apply / in-place add, 1 thread, CPU)", ours);
        fused.verdict = verdict_of(ours <= 2.5);
        if (j.contains("torch_rotary_over_torch_additive")) {
          const double t = j["torch_rotary_over_torch_additive"].get<double>();
          naive.ours = fmt::format("{:.2f}x (PyTorch composition / PyTorch add, 1 thread, CPU)", t);
          naive.verdict = verdict_of(t >= 2);
        } else {
          naive.note = "this build has no torch";
        }
        fused.note = naive.note = smoke ? "smoke scale: [64, 2, 12, 64]" : "the seed's shape";
      } else {
        naive.note = fused.note = problem;
      }
      std::vector<std::string> train{"bench", "train", "--json", "--encoding", "rope", "--against", "learned"};
      if (smoke) train.insert(train.end(), {"--seq-len", "32", "--d-model", "32", "--n-layers", "1", "--n-heads", "2",
                                            "--trials", "1", "--steps", "1", "--warmup", "1"});
      else train.insert(train.end(), {"--trials", "7", "--steps", "3"});
      problem.clear();
      const json t = cached_child_json(spec, dir, "train_overhead", train, problem, r.progress);
      if (!t.is_null() && t.contains("overhead_percent_vs_against")) {
        const double o = t["overhead_percent_vs_against"].get<double>();
        model.ours = fmt::format("{:+.1f}% (d_model {}, {} layers, seq {}; median of {} trials)", o,
                                 t.value("d_model", 0), t.value("n_layers", 0), t.value("seq_len", 0),
                                 t.value("trials", 0));
        model.verdict = verdict_of(o <= 3.0);
        model.note = "one run on a shared machine: a few percent is within its noise";
      } else {
        model.note = problem;
      }
      sections << "### seed002_runtime\n\nOutputs: `seed002_runtime/rope_cost.json` (`rotary " << [&] {
        std::string l;
        for (size_t i = 0; i < cost.size(); ++i) l += (i ? " " : "") + cost[i];
        return l;
      }() << "`), `seed002_runtime/train_overhead.json`.\n\n";
    } else {
      naive.note = fused.note = model.note = "study not run";
    }
    claims.push_back(naive);
    claims.push_back(fused);
    claims.push_back(model);
  }
  return true;
}

// Seed 004: the length-extrapolation table, window sweep and Leaky ReRoPE (an extrapolate).
bool seed004_study(Reproduction& r, const std::string& study, bool wanted) {
  std::vector<Claim>& claims = r.result.claims;
  std::ostringstream& sections = r.sections;
  const ReproduceSpec& spec = r.spec;
  std::optional<ExtrapolateResult>& ex = r.ex;
  ExtrapolateSpec& es = r.es;
  if (wanted) {
    es.command_line = spec.command_line;
    if (r.progress) std::fprintf(stderr, "reproduce: seed004_extrapolate\n");
    ex = run_extrapolate(es, r.progress);
    if (ex->run.interrupted()) return r.stopped(study, ex->run);
  }
  {
    const int L = es.text.seq_len;
    const int far = L * es.multiples.back();
    const int64_t w = es.window > 0 ? es.window : L / 2;
    ExtrapolateView v{ex ? &*ex : nullptr, L};
    const std::string note = fmt::format("one text model, L = {}, tested at {} = {}L{}", L, far, es.multiples.back(),
                                         r.scale_note);
    auto claim = [&](const std::string& text, const std::string& theirs) {
      return Claim{"004", "seed004_extrapolate", text, theirs, "", "not measured", ex ? note : "study not run"};
    };
    Claim same = claim("At the training length every method scores the same",
                       "49.41% for every method at 512 (49.40% with log n)");
    Claim keeps = claim("ReRoPE keeps its accuracy far past the training length; plain RoPE does not",
                        "ReRoPE-w256 48.48% at 8L vs 49.41% at L; Baseline 23.16% at 8L");
    Claim ntk = claim("ReRoPE beats NTK-aware scaling far past the training length",
                      "48.48% vs NTK-fixed 39.61%, NTK-mixed 40.12% at 8L");
    Claim pi = claim("Position interpolation without fine-tuning falls below plain RoPE far past L",
                     "PI 13.54% vs Baseline 23.16% at 8L");
    Claim logn = claim("log-n scaling at test time helps ReRoPE", "ReRoPE-w256 48.48% -> 48.85% (log n\u2020) at 8L");
    Claim sweep = claim("ReRoPE's best window is L/4 to L/2; w = L collapses",
                        "best w128-w256 of L = 512 (48.87-49.07%); w512: 8.25% at 8L");
    Claim leaky = claim("Leaky ReRoPE (k = 16) is about as good as ReRoPE", "49.10% vs 48.87% (w128, log n)");
    Claim longer = claim("With ReRoPE a longer context gives a lower loss",
                         "Llama-2-13B: 1.4996 at 4k, 1.4267 at 8k, 1.4001 at 16k");
    if (ex) {
      const std::vector<std::string> methods{"rope", "pi", "ntk", "ntk_mixed", "yarn", "rerope", "leaky_rerope"};
      double lo = INFINITY, hi = -INFINITY;
      for (const std::string& m : methods) {
        const double a = v.acc("text", m, false, L);
        if (std::isfinite(a)) lo = std::min(lo, a), hi = std::max(hi, a);
      }
      if (std::isfinite(lo)) {
        same.ours = fmt::format("{} - {} over {} methods at L", pct(lo), pct(hi), methods.size());
        same.verdict = hi - lo <= 0.01 ? "reproduced" : "not reproduced";
      }
      const double rope_L = v.acc("text", "rope", false, L), rope_far = v.acc("text", "rope", false, far);
      const double re_far = v.acc("text", "rerope", false, far), re_L = v.acc("text", "rerope", false, L);
      if (std::isfinite(re_far) && std::isfinite(rope_far)) {
        keeps.ours = fmt::format("ReRoPE-w{} {} at {}L vs {} at L; RoPE {} at {}L", w, pct(re_far),
                                 es.multiples.back(), pct(re_L), pct(rope_far), es.multiples.back());
        keeps.verdict = verdict_of(re_far >= rope_L - 0.03 && rope_far < re_far);
      }
      const double ntk_far = v.acc("text", "ntk", false, far), mixed_far = v.acc("text", "ntk_mixed", false, far);
      if (std::isfinite(re_far) && std::isfinite(ntk_far) && std::isfinite(mixed_far)) {
        ntk.ours = fmt::format("ReRoPE {} vs NTK {}, NTK-mixed {}", pct(re_far), pct(ntk_far), pct(mixed_far));
        ntk.verdict = verdict_of(re_far > ntk_far && re_far > mixed_far);
      }
      const double pi_far = v.acc("text", "pi", false, far);
      if (std::isfinite(pi_far) && std::isfinite(rope_far)) {
        pi.ours = fmt::format("PI {} vs RoPE {}", pct(pi_far), pct(rope_far));
        pi.verdict = verdict_of(pi_far < rope_far);
      }
      const double re_logn = v.acc("text", "rerope", true, far);
      if (std::isfinite(re_logn) && std::isfinite(re_far)) {
        logn.ours = fmt::format("ReRoPE {} -> {} (log n\u2020)", pct(re_far), pct(re_logn));
        logn.verdict = verdict_of(re_logn > re_far);
      }
      std::map<int64_t, double> by_window;
      for (const Cell& c : ex->cells)
        if (c.sweep && c.metric == "text" && c.test_len == far && c.method.name == "rerope" && !c.method.logn)
          by_window[c.method.window] = c.accuracy;
      if (by_window.size() >= 3 && by_window.count(L)) {
        int64_t best = by_window.begin()->first;
        std::string list;
        for (const auto& [win, a] : by_window) {
          if (a > by_window[best]) best = win;
          list += fmt::format("{}w{} {}", list.empty() ? "" : ", ", win, pct(a));
        }
        double worst = INFINITY;
        for (const auto& [win, a] : by_window) worst = std::min(worst, a);
        sweep.ours = fmt::format("{} (best w{})", list, best);
        sweep.verdict = verdict_of(best >= L / 4 && best <= L / 2 && by_window[L] <= worst + 1e-12);
      }
      const double leaky_far = v.acc("text", "leaky_rerope", false, far);
      if (std::isfinite(leaky_far) && std::isfinite(re_far)) {
        leaky.ours = fmt::format("Leaky-w{}-k{:g} {} vs ReRoPE-w{} {}", w, es.leaky_k, pct(leaky_far), w, pct(re_far));
        leaky.verdict = verdict_of(std::abs(leaky_far - re_far) <= 0.01);
      }
      std::string losses;
      bool falling = true;
      double prev = INFINITY;
      for (int m : es.multiples) {
        const double l = v.loss("rerope", L * m);
        losses += fmt::format("{}{}: {}", losses.empty() ? "" : ", ", L * m, num(l, 4));
        falling = falling && std::isfinite(l) && l <= prev + 1e-9;
        prev = l;
      }
      longer.ours = "ReRoPE loss on the last L tokens at " + losses;
      longer.verdict = verdict_of(falling);
      sections << "### seed004_extrapolate\n\n" << note << "; [report](seed004_extrapolate/report.md)\n\n";
    }
    for (Claim* c : {&same, &keeps, &ntk, &pi, &logn, &sweep, &leaky, &longer}) claims.push_back(*c);
  }
  return true;
}

// Seed 003: the decay bound, and measured on seed 004's text model (`rotary decay`).
bool seed003_study(Reproduction& r, const std::string&, bool wanted) {
  std::vector<Claim>& claims = r.result.claims;
  std::ostringstream& sections = r.sections;
  const ReproduceSpec& spec = r.spec;
  const ExtrapolateSpec& es = r.es;
  {
    Claim bound{"003", "seed003_decay", "The relative upper bound of RoPE's score decays as the distance grows",
                "RoFormer's figure 2 (d = 128, base 10000): decaying with oscillations", "", "not measured", ""};
    Claim measured{"003", "seed003_decay", "On a trained RoPE model the score's magnitude falls with distance",
                   "(not measured in the seed; the bound is its argument)", "", "not measured", ""};
    if (wanted) {
      RopeSpec rs;
      rs.head_dim = 128;
      const std::vector<double> b = decay_bound(rs.freqs(), 4096);
      const double near = block_mean(b, 1, 16), mid = block_mean(b, 16, 256), farb = block_mean(b, 256, 4097);
      bound.ours = fmt::format("mean bound at distances 1-15: {:.2f}, 16-255: {:.2f}, 256-4096: {:.2f} (B(0) = {:.2f})",
                               near, mid, farb, b[0]);
      bound.verdict = verdict_of(near > mid && mid > farb);
      bound.note = "computed exactly (float64), d = 128, base 10000";
      const std::string dir = lab::join_path(spec.out_dir, "seed003_decay");
      const std::string model_dir = lab::join_path(es.out_dir, "text_model");
      if (lab::file_exists(lab::join_path(model_dir, "checkpoint.pt"))) {
        std::string problem;
        std::vector<std::string> args{"decay", "--checkpoint", model_dir, "--out", dir, "--windows",
                                      is_scale(spec.scale, "smoke") ? "2" : "16", "--threads", "0"};
        if (is_scale(spec.scale, "smoke")) args.insert(args.end(), {"--samples", "64"});
        const json j = cached_child_json(spec, dir, "decay_measured", args, problem, r.progress);
        const std::string csv = lab::join_path(dir, "decay_model.csv");
        if (!j.is_null() && lab::file_exists(csv)) {
          const std::map<int64_t, double> rel = read_measured_decay(csv);
          std::vector<double> series;
          for (const auto& [d, val] : rel) series.push_back(val);
          const size_t n = series.size(), L = size_t(es.text.seq_len);
          const double first = block_mean(series, 1, std::min<size_t>(16, n)),
                       last = block_mean(series, std::min(L, n), n);
          measured.ours = fmt::format("mean abs(q R(d) k), relative to d = 0: {:.3f} at d 1-15, {:.3f} at d >= L = {}", first,
                                      last, L);
          measured.verdict = verdict_of(first > last);
          measured.note = "seed004_extrapolate's RoPE text model" + r.scale_note;
        } else {
          measured.note = problem;
        }
      } else {
        measured.note = "needs seed004_extrapolate's text model";
      }
      sections << "### seed003_decay\n\n`rotary decay --checkpoint " << model_dir << " --out " << dir
               << "` (bound and measured curves: [decay_model.png](seed003_decay/decay_model.png))\n\n";
    } else {
      bound.note = measured.note = "study not run";
    }
    claims.push_back(bound);
    claims.push_back(measured);
  }
  return true;
}

struct StudyEntry {
  std::string_view name;
  StudyRun run;
};
// Every study, in the order they run and their claims are listed (seed 003 after seed 004: it reads its model).
constexpr StudyEntry kStudyTable[] = {
    {"seed000_addition", seed000_study},
    {"seed000_substring_index", seed000_study},
    {"seed000_substring_search", seed000_study},
    {"seed001_memory", seed001_study},
    {"seed002_text", seed002_text_study},
    {"seed002_performer", seed002_performer_study},
    {"seed002_runtime", seed002_runtime_study},
    {"seed004_extrapolate", seed004_study},
    {"seed003_decay", seed003_study},
};
constexpr bool same_studies() {
  if (std::size(kStudyTable) != std::size(kReproduceStudies)) return false;
  for (size_t i = 0; i < std::size(kStudyTable); ++i)
    if (kStudyTable[i].name != kReproduceStudies[i]) return false;
  return true;
}
static_assert(same_studies(), "kStudyTable runs the studies of kReproduceStudies, in that order");

}  // namespace

ReproduceResult run_reproduce(const ReproduceSpec& spec, bool progress) {
  validate(spec);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> studies = spec.studies;
  if (studies.empty())
    for (std::string_view s : kReproduceStudies) studies.emplace_back(s);
  auto wanted = [&](const std::string& s) { return std::find(studies.begin(), studies.end(), s) != studies.end(); };
  // Every run description is checked before the first run starts.
  for (const std::string& s : studies) {
    if (s.rfind("seed000_", 0) == 0 || s == "seed002_text" || s == "seed002_performer") {
      const CompareSpec c = compare_study(spec, s).spec;
      for (const std::string& enc : c.encodings) {
        TrainConfig t = c.base;
        t.model.encoding.kind = nn::parse_encoding_kind(enc, "encodings");
        t.validate();
      }
    }
    if (s == "seed004_extrapolate") validate(reproduce_extrapolate_spec(spec));
    if (s == "seed001_memory") validate(reproduce_memory_spec(spec));
  }
  // Held while the studies run (created here, once everything is checked): a second reproduce on this --out is
  // refused naming this one.
  const lab::DirectoryLock lock(spec.out_dir, "--out");

  ReproduceResult result;
  Reproduction r{spec, progress, result, {}, reproduce_extrapolate_spec(spec), std::nullopt,
                 is_scale(spec.scale, "smoke") ? " (smoke scale: not evidence)" : ""};
  for (const StudyEntry& s : kStudyTable)
    if (!s.run(r, std::string(s.name), wanted(std::string(s.name)))) return result;

  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // ---- the report ----------------------------------------------------------------------------------------------
  std::ostringstream md;
  md << "# rotary reproduce: the seeds' claims, rerun\n\n";
  if (!spec.command_line.empty()) md << "Command: `" << spec.command_line << "`\n\n";
  md << fmt::format("Scale: **{}**. Machine: {}, {} cores. This invocation: {:.0f} s (studies finished by an earlier "
                    "invocation were reused).\n\n",
                    spec.scale, lab::cpu_model(), std::thread::hardware_concurrency(), result.seconds);
  md << "Verdicts: *reproduced* - the seed's ordering holds (for compares: every run of the expected winner beats "
        "every run of the other); *same ordering, within noise* - the means are in the seed's order but the runs' "
        "ranges overlap; *not reproduced* - the means are in the other order, or the number misses the seed's; *not "
        "measured* - the study did not run or cannot measure it here.\n\n";
  const std::vector<Claim>& claims = result.claims;
  std::map<std::string, int> counts;
  for (const Claim& c : claims) ++counts[c.verdict];
  md << "Summary:";
  for (const auto& [v, n] : counts) md << " " << v << " " << n << ";";
  md << "\n\n## Claims\n\n| seed | claim | the seed | ours | verdict | scale / note |\n|---|---|---|---|---|---|\n";
  auto cell = [](std::string s) {
    std::replace(s.begin(), s.end(), '|', '/');  // a '|' would split the markdown cell
    return s.empty() ? std::string("-") : s;
  };
  for (const Claim& c : claims)
    md << "| " << c.seed << " | " << cell(c.claim) << " | " << cell(c.theirs) << " | " << cell(c.ours) << " | **"
       << c.verdict << "** | " << cell(c.note) << " |\n";
  md << "\n## Studies\n\n" << r.sections.str();
  result.report_md = lab::join_path(spec.out_dir, "report.md");
  lab::write_file_atomic(result.report_md, md.str());
  json j = json::array();
  for (const Claim& c : claims)
    j.push_back({{"seed", c.seed}, {"study", c.study}, {"claim", c.claim}, {"theirs", c.theirs}, {"ours", c.ours},
                 {"verdict", c.verdict}, {"note", c.note}});
  result.claims_json = lab::join_path(spec.out_dir, "claims.json");
  lab::write_file_atomic(result.claims_json, json{{"scale", spec.scale}, {"claims", j}}.dump(2));
  return result;
}

}  // namespace rotary::experiments
