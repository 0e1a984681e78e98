// rotary extrapolate: seed 004's length-extrapolation table (train at L, test at L..8L with every inference-time
// method, with and without log-n), its plots and a ReRoPE window sweep.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "cli/run_outcome.h"
#include "cli/command.h"
#include "common/exit_status.h"
#include "cli/torch/train_flags.h"
#include "experiments/extrapolate.h"
#include "experiments/extrapolate_report.h"

namespace rotary::cli {
namespace {

struct ExtrapolateCommand {
  TrainFlags flags;
  CLI::App* app = nullptr;
  std::string text_checkpoint, kv_checkpoint, lengths, methods, logn_variants, sweep;
  int64_t kv_steps = 0;
  int windows = 0, eval_batch = 0, problems = 0;
  double dynamic_factor = 1;
  bool retrieval = false, no_progress = false;

  bool given(const std::string& name) const { return app->get_option(name)->count() > 0; }

  experiments::ExtrapolateSpec resolve() const {
    experiments::ExtrapolateSpec spec = experiments::default_extrapolate_spec();
    spec.text = flags.resolve(spec.text);
    spec.kv = flags.resolve(spec.kv);
    // The shared training flags --window, --leaky-k and --threads mean the test-time window, k and threads here;
    // the models themselves train with plain RoPE (+ log-n with --logn L).
    if (given("--window")) spec.window = spec.text.model.encoding.window;
    if (given("--leaky-k")) spec.leaky_k = spec.text.model.encoding.leaky_k;
    for (train::TrainConfig* c : {&spec.text, &spec.kv}) {
      c->model.encoding.window = 0;
      c->model.encoding.leaky_k = 1.0;
    }
    spec.threads = spec.text.threads;
    spec.eval_seed = spec.text.eval_seed;
    if (given("--out")) spec.out_dir = spec.text.out_dir;
    if (given("--kv-steps")) spec.kv.steps = kv_steps;
    if (!text_checkpoint.empty()) spec.text_checkpoint = text_checkpoint;
    if (!kv_checkpoint.empty()) spec.kv_checkpoint = kv_checkpoint;
    spec.retrieval = retrieval || !kv_checkpoint.empty();
    if (given("--lengths")) {
      spec.multiples.clear();
      for (int64_t m : parse_integer_list(lengths, "--lengths", 1, 1024)) spec.multiples.push_back(static_cast<int>(m));
    }
    if (given("--methods")) spec.methods = parse_name_list(methods, "--methods");
    if (given("--logn-variants")) {
      check(logn_variants == "both" || logn_variants == "off" || logn_variants == "on", "--logn-variants",
            logn_variants, "both, off, on");
      spec.logn = logn_variants == "both" ? std::vector<bool>{false, true} : std::vector<bool>{logn_variants == "on"};
    }
    if (given("--sweep")) spec.sweep = sweep == "none" ? std::vector<int64_t>{-1} : parse_integer_list(sweep, "--sweep", 1, kMaxSequenceLength);
    if (given("--dynamic-factor")) spec.dynamic_factor = dynamic_factor;
    if (given("--windows")) spec.windows = windows;
    if (given("--eval-batch-size")) spec.batch_size = eval_batch;
    if (given("--problems")) spec.problems = problems;
    spec.command_line = quoted_command_line();
    return spec;
  }

  void run() {
    const experiments::ExtrapolateSpec spec = resolve();
    experiments::ExtrapolateResult r = experiments::run_extrapolate(spec, !no_progress);
    exit_if_interrupted(r.run, "extrapolate");
    std::vector<int> lengths;
    for (int m : spec.multiples) lengths.push_back(spec.text.seq_len * m);
    std::sort(lengths.begin(), lengths.end());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    experiments::ReportInput in{spec, spec.text.seq_len, lengths, {}, r.models, r.cells, r.seconds};
    std::printf("%s\n", experiments::seed_table(in).c_str());
    if (!r.plot_problem.empty()) std::printf("note: %s\n", r.plot_problem.c_str());
    std::printf("report: %s (%.0f s)\n", r.report_md.c_str(), r.seconds);
  }
};

const CommandRegistrar kRegister([](CLI::App& root) {
  auto cmd = std::make_shared<ExtrapolateCommand>();
  CLI::App* sub = root.add_subcommand(
      "extrapolate",
      "seed 004's experiment: train at L, test at L..8L with RoPE, PI, NTK, dynamic NTK, YaRN, ReRoPE, Leaky ReRoPE "
      "(+ log-n); tables, plots, window sweep (default ~15 min on 2 cores)");
  cmd->app = sub;
  auto take_last = [](CLI::Option* o) { return o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast); };
  take_last(sub->add_option("--text-checkpoint", cmd->text_checkpoint, "use this RoPE text model instead of training one"));
  take_last(sub->add_option("--kv-checkpoint", cmd->kv_checkpoint, "use this RoPE kv_retrieval model instead of training one"));
  sub->add_flag("--retrieval", cmd->retrieval,
                "also train (or --kv-checkpoint: load) a kv_retrieval model and score retrieval at every length");
  take_last(sub->add_option("--kv-steps", cmd->kv_steps, "training steps of the kv_retrieval model (default: as --steps)"))->transform(integer_in(1, int64_t{1} << 40));
  take_last(sub->add_option("--lengths", cmd->lengths, "test lengths as multiples of L (default 1,2,4,8)"));
  take_last(sub->add_option("--methods", cmd->methods,
                            "comma-separated: rope, pi, ntk, ntk_mixed, dynamic, yarn, rerope, leaky_rerope (default all)"));
  take_last(sub->add_option("--logn-variants", cmd->logn_variants, "both | off | on: log-n at test time (default both)"));
  take_last(sub->add_option("--sweep", cmd->sweep, "ReRoPE windows of the sweep, or none (default L/8,L/4,L/2,3L/4,L)"));
  take_last(sub->add_option("--dynamic-factor", cmd->dynamic_factor, "HF dynamic NTK factor (default 1)"))->transform(finite());
  take_last(sub->add_option("--windows", cmd->windows, "held-out text windows per length (default 32)"))->transform(integer_in(1, 1 << 16));
  take_last(sub->add_option("--eval-batch-size", cmd->eval_batch, "windows per forward pass (default 4)"))->transform(integer_in(1, 1 << 16));
  take_last(sub->add_option("--problems", cmd->problems, "retrieval problems per length (default 32)"))->transform(integer_in(1, 1 << 20));
  sub->add_flag("--no-progress", cmd->no_progress, "no progress on stderr");
  cmd->flags.add_to(*sub);
  sub->footer(
      "The training flags set both models (text, and kv_retrieval with --retrieval; --steps, --seq-len = L, "
      "--d-model, ...); --logn L "
      "trains them with log-n. --window and --leaky-k set the ReRoPE / Leaky ReRoPE test window (default L/2) and k "
      "(default 16); --threads the torch threads. Output in --out (default runs/extrapolate): report.md with the "
      "tables and PNGs, results.csv; a rerun reuses the trained models and every scored cell. See docs/extrapolate.md.");
  sub->callback([cmd] { cmd->run(); });
});

}  // namespace
}  // namespace rotary::cli
