// rotary eval: held-out loss (overall and by position) and exact-match accuracy of a checkpoint, optionally with
// inference-time encoding overrides (context extension without retraining).
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/torch/load_model.h"
#include "train/evaluate.h"
#include "train/trainer.h"

namespace rotary::cli {
namespace {

struct EvalCommand {
  std::string checkpoint, out;
  int rows = 0, batch_size = 0, seq_len = 0, problems = 128, show = 3, threads = 0;
  double temperature = 1.0;
  bool json = false;
  CLI::Option* seed_opt = nullptr;
  uint64_t seed_value = 0;
  OverrideFlags overrides;

  void run() {
    train::use_threads(threads);
    LoadedRun r = load_run(checkpoint);
    apply_overrides(overrides, r);
    const train::TrainConfig& c = r.config;
    const int bs = batch_size > 0 ? batch_size : c.batch_size;
    const int len = seq_len > 0 ? seq_len : c.seq_len;
    const int n_rows = rows > 0 ? rows : std::max(1, c.eval_batches) * c.batch_size;
    const uint64_t eval_seed = seed_opt->count() ? seed_value : c.eval_seed;
    const std::string out_dir = out.empty() ? lab::join_path(r.run_dir, "eval") : out;

    train::HeldoutLoss h = train::heldout_loss(r.model, *r.task, len, n_rows, bs, eval_seed);
    train::Accuracy greedy, sampled;
    if (problems > 0) {
      greedy = train::exact_match(r.model, *r.task, problems, eval_seed, 0.0, eval_seed);
      sampled = train::exact_match(r.model, *r.task, problems, eval_seed, temperature, eval_seed);
    }

    lab::make_dirs(out_dir);
    std::string csv = "position,loss,weight\n";
    for (size_t t = 0; t < h.loss_by_position.size(); ++t)
      csv += std::isfinite(h.loss_by_position[t])
                 ? fmt::format("{},{:.9g},{:.9g}\n", t, h.loss_by_position[t], h.weight_by_position[t])
                 : fmt::format("{},,0\n", t);
    lab::write_file_atomic(lab::join_path(out_dir, "loss_by_position.csv"), csv);

    nlohmann::json j{{"checkpoint", r.checkpoint},
                     {"step", r.step},
                     {"task", c.task},
                     {"encoding", nlohmann::json(r.model->active_encoding())},
                     {"seq_len", len},
                     {"heldout_rows", n_rows},
                     {"heldout_loss", h.loss},
                     {"eval_seed", eval_seed},
                     {"problems", greedy.total}};
    if (greedy.total > 0) {
      j["accuracy_greedy"] = greedy.value();
      j["accuracy_sampled"] = sampled.value();
      j["sample_temperature"] = temperature;
    }
    lab::write_file_atomic(lab::join_path(out_dir, "eval.json"), j.dump(2) + "\n");

    if (json) {
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    std::printf("checkpoint %s (step %lld), task %s, encoding %s\n", r.checkpoint.c_str(),
                static_cast<long long>(r.step), c.task.c_str(), std::string(nn::encoding_kind_name(r.model->active_encoding().kind)).c_str());
    std::printf("held-out loss %.4f over %d rows of %d tokens\n", h.loss, n_rows, len);
    if (greedy.total > 0) {
      std::printf("exact match: %d/%d greedy (%.1f%%), %d/%d sampled at temperature %g (%.1f%%)\n", greedy.correct,
                  greedy.total, 100 * greedy.value(), sampled.correct, sampled.total, temperature,
                  100 * sampled.value());
      for (int i = 0; i < std::min(show, greedy.total); ++i) {
        const train::ProblemResult& p = greedy.results[static_cast<size_t>(i)];
        std::printf("  %s %s%s   (expected %s)\n", p.correct ? "ok " : "BAD", p.prompt.c_str(), p.generated.c_str(),
                    p.answer.c_str());
      }
    }
    std::printf("wrote %s and %s\n", lab::join_path(out_dir, "loss_by_position.csv").c_str(),
                lab::join_path(out_dir, "eval.json").c_str());
  }
};

const CommandRegistrar kRegister([](CLI::App& root) {
  auto cmd = std::make_shared<EvalCommand>();
  CLI::App* sub = root.add_subcommand("eval", "evaluate a checkpoint: held-out loss, loss by position, exact match");
  sub->add_option("checkpoint,--checkpoint", cmd->checkpoint, "checkpoint file or run directory")->required();
  sub->add_option("--rows", cmd->rows, "held-out rows (default: the run's eval_batches x batch_size)")->transform(integer_in(0, 1 << 20));
  sub->add_option("--batch-size", cmd->batch_size, "rows per forward pass (default: the run's)")->transform(integer_in(0, 1 << 20));
  sub->add_option("--seq-len", cmd->seq_len, "held-out sequence length (default: the training length)")->transform(integer_in(0, kMaxSequenceLength));
  sub->add_option("--problems", cmd->problems, "exact-match problems (0 = none)")->transform(integer_in(0, 1 << 20));
  cmd->seed_opt = sub->add_option("--seed", cmd->seed_value, "held-out / problem seed (default: the run's eval_seed)")->transform(unsigned_up_to(UINT64_MAX));
  sub->add_option("--temperature", cmd->temperature, "sampling temperature of the sampled accuracy")->transform(finite_in(0, 100));
  sub->add_option("--out", cmd->out, "where to write loss_by_position.csv and eval.json (default: <run>/eval)");
  sub->add_option("--show", cmd->show, "print this many problems with the model's answers")->transform(integer_in(0, 1 << 20));
  sub->add_option("--threads", cmd->threads, "torch threads (0 = all cores)")->transform(integer_in(0, kMaxThreads));
  sub->add_flag("--json", cmd->json, "print the results as JSON");
  cmd->overrides.add_to(*sub);
  sub->callback([cmd] { cmd->run(); });
});

}  // namespace
}  // namespace rotary::cli
