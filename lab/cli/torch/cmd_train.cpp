// rotary train: train one model on one task (lab/train/trainer.h), optionally data-parallel over processes.
#include <unistd.h>

#include <cstdio>
#include <fmt/format.h>

#include "cli/command.h"
#include "common/exit_status.h"
#include "cli/torch/train_flags.h"
#include "common/files.h"
#include "rotary/error.h"
#include "train/checkpoint.h"
#include "train/distributed.h"
#include "train/trainer.h"

namespace rotary::cli {
namespace {

struct TrainCommand {
  TrainFlags flags;
  bool resume = false, overwrite = false, no_progress = false, print_config = false, print_toml = false;
  int nproc = 1, nnodes = 1, node_rank = 0;

  // defaults <- file <- flags; with --resume the checkpoint's config takes the place of the defaults, so
  // `rotary train --resume --out DIR` alone continues the run as it was started.
  train::TrainConfig resolve_config() const {
    train::TrainConfig config = flags.resolve(train::TrainConfig{});
    if (resume) {
      const std::string ckpt = train::checkpoint_path(config.out_dir);
      if (!lab::file_exists(ckpt)) throw Error("rotary: nothing to resume: no checkpoint at " + ckpt);
      train::TrainConfig stored;
      train::from_json(train::read_checkpoint_meta(ckpt).config, stored);
      stored.out_dir = config.out_dir;
      config = flags.resolve(stored);
    }
    return config;
  }

  void run() {
    std::optional<train::WorkerEnv> worker = train::worker_env_from_environment();
    train::TrainConfig config = resolve_config();
    config.validate();
    if (print_config) {  // what would run, resolved and validated; nothing is written
      nlohmann::json j;
      train::to_json(j, config);
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    if (print_toml) {  // the same, as a commented TOML file for --config
      std::fputs(train::to_toml(config).c_str(), stdout);
      return;
    }

    if (!worker && (nproc > 1 || nnodes > 1)) {
      // The launcher: check what can be checked once, then start the ranks (each re-runs this command line).
      check(config.batch_size % (nproc * nnodes) == 0, "batch_size", config.batch_size,
            fmt::format("a multiple of the number of processes ({})", nproc * nnodes));
      lab::make_dirs(config.out_dir);
      train::LaunchSpec spec;
      spec.nproc = nproc;
      spec.nnodes = nnodes;
      spec.node_rank = node_rank;
      spec.store_file = lab::join_path(config.out_dir, fmt::format(".ddp_store.{}", ::getpid()));
      std::remove(spec.store_file.c_str());
      const int code = train::launch_workers(spec, own_command_line());
      std::remove(spec.store_file.c_str());
      if (code != 0) throw CLI::RuntimeError(code);
      return;
    }

    std::unique_ptr<train::Communicator> comm;
    if (worker && worker->world_size > 1) comm = train::connect_from_environment();
    const bool leader = !comm || comm->rank() == 0;
    train::TrainOptions opts;
    opts.resume = resume ? train::ResumeMode::Required : train::ResumeMode::Never;
    opts.overwrite = overwrite;
    opts.progress = leader && !no_progress;
    opts.comm = comm.get();

    train::TrainResult r = train::train(config, opts);
    switch (r.status) {
      case train::TrainStatus::Finished:
        if (leader && r.summary) {
          const train::RunSummary& s = *r.summary;
          std::string line = fmt::format("finished {} steps in {:.1f} s: final train loss {:.4f}", s.steps, s.seconds,
                                         s.final_train_loss);
          if (s.eval_loss) line += fmt::format(", held-out loss {:.4f}", *s.eval_loss);
          if (s.accuracy_greedy) line += fmt::format(", exact match {:.1f}% greedy", 100 * *s.accuracy_greedy);
          if (s.accuracy_sampled) line += fmt::format(" / {:.1f}% sampled", 100 * *s.accuracy_sampled);
          std::printf("%s (%d problems)\nrun: %s\n", line.c_str(), s.problems, config.out_dir.c_str());
        }
        return;
      case train::TrainStatus::Interrupted:
        if (leader) std::fprintf(stderr, "rotary train: %s\n", r.message.c_str());
        throw CLI::RuntimeError(lab::interrupted_exit_status(r.signal));
      case train::TrainStatus::NonFinite:
        if (leader) std::fprintf(stderr, "rotary train: %s\n", r.message.c_str());
        throw CLI::RuntimeError(lab::kExitNonFiniteLoss);
    }
  }
};

const CommandRegistrar kRegister([](CLI::App& root) {
  auto cmd = std::make_shared<TrainCommand>();
  CLI::App* sub = root.add_subcommand("train", "train a transformer on a task (settings: flags > --config TOML > defaults)");
  cmd->flags.add_to(*sub);
  CLI::Option* resume =
      sub->add_flag("--resume", cmd->resume, "continue the run in --out from its checkpoint (same data order and curve)");
  sub->add_flag("--overwrite", cmd->overwrite, "start afresh even if --out holds a run")->excludes(resume);
  sub->add_flag("--no-progress", cmd->no_progress, "no progress bar / lines on stderr");
  sub->add_flag("--print-config", cmd->print_config,
                "print the resolved settings (defaults <- --config <- flags) as JSON, validated, and exit");
  sub->add_flag("--print-config-toml", cmd->print_toml,
                "print them as a commented TOML file (every setting, its flag and allowed values) for --config, and exit");
  sub->add_option("--nproc", cmd->nproc, "data-parallel processes on this machine (torch c10d, Gloo)")->transform(integer_in(1, 256));
  sub->add_option("--nnodes", cmd->nnodes, "machines taking part (needs MASTER_ADDR, MASTER_PORT)")->transform(integer_in(1, 4096));
  sub->add_option("--node-rank", cmd->node_rank, "this machine's index in [0, nnodes)")->transform(integer_in(0, 4095));
  sub->footer(
      "Exit status: 0 finished; 2 bad settings; 3 non-finite loss (the last good checkpoint is kept); 130/143 "
      "interrupted by SIGINT/SIGTERM (checkpoint saved; continue with --resume). See docs/lab.md.");
  sub->callback([cmd] { cmd->run(); });
});

}  // namespace
}  // namespace rotary::cli
