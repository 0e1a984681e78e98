// rotary compare: several encodings x several seeds of one run description, then a markdown report with plots.
#include <cstdio>
#include <sstream>

#include "cli/run_outcome.h"
#include "cli/command.h"
#include "common/exit_status.h"
#include "cli/torch/train_flags.h"
#include "experiments/compare.h"

namespace rotary::cli {
namespace {

struct CompareCommand {
  TrainFlags flags;
  std::string encodings;
  int seeds = 0, jobs = 0;
  double target_loss = 0;
  CLI::Option* target_opt = nullptr;
  bool no_progress = false;
  CLI::Option* encodings_opt = nullptr;
  CLI::Option* seeds_opt = nullptr;
  CLI::Option* jobs_opt = nullptr;

  void run() {
    experiments::CompareSpec spec = experiments::default_compare_spec();
    spec.base = flags.resolve(spec.base);
    if (encodings_opt->count()) spec.encodings = parse_name_list(encodings, "--encodings");
    if (seeds_opt->count()) spec.seeds = seeds;
    if (jobs_opt->count()) spec.jobs = jobs;
    if (target_opt->count()) spec.target_loss = target_loss;
    spec.rotary_program = "/proc/self/exe";  // the side-by-side runs are this program's `train` command
    spec.out_dir = spec.base.out_dir;
    spec.command_line = quoted_command_line();

    experiments::CompareResult r = experiments::run_compare(spec, !no_progress);
    exit_if_interrupted(r.run, "compare");
    experiments::ReportInputs in;
    in.encodings = spec.encodings;
    in.runs = r.runs;
    in.target_loss = spec.target_loss;
    std::printf("%s\n", experiments::results_table(in).c_str());
    if (!r.report.plot_problem.empty()) std::printf("note: %s\n", r.report.plot_problem.c_str());
    std::printf("report: %s\n", r.report.report_md.c_str());
  }
};

const CommandRegistrar kRegister([](CLI::App& root) {
  auto cmd = std::make_shared<CompareCommand>();
  CLI::App* sub = root.add_subcommand(
      "compare",
      "train several encodings x seeds on one task and write a report (default: RoPE vs RoPER on addition, ~5 min)");
  cmd->encodings_opt = sub->add_option("--encodings", cmd->encodings, "comma-separated encodings (default rope,roper)")
                           ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->seeds_opt = sub->add_option("--seeds", cmd->seeds, "runs per encoding, seeds seed..seed+n-1 (default 3)")->transform(integer_in(1, 1000));
  cmd->jobs_opt = sub->add_option("--jobs", cmd->jobs,
                                  "runs trained at once, each a `rotary train` process with its own log (default: "
                                  "cores / --threads; 1: one after the other)")
                      ->transform(integer_in(0, 256));
  cmd->target_opt = sub->add_option("--target-loss", cmd->target_loss,
                                    "report the steps each encoding takes to reach this held-out loss (default: the "
                                    "highest final held-out loss among the encodings)")
                        ->transform(finite_in(1e-9, 1e9));
  sub->add_flag("--no-progress", cmd->no_progress, "no progress on stderr");
  cmd->flags.add_to(*sub);
  sub->footer(
      "Runs go to <out>/<encoding>/seed<k>; rerunning the same compare skips finished runs and resumes interrupted "
      "ones. The table is the mean after dropping each encoding's worst run (seed 000's protocol). Defaults: "
      "--out runs/compare, task addition (max 3 digits), d_model 64, 2 layers, 4 heads, seq 128, batch 16.");
  sub->callback([cmd] { cmd->run(); });
});

}  // namespace
}  // namespace rotary::cli
