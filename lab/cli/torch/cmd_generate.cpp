// rotary generate: sample from a trained model through the KV-cache decoder.
#include <cstdio>

#include "cli/command.h"
#include "cli/torch/load_model.h"
#include "train/evaluate.h"
#include "train/trainer.h"

namespace rotary::cli {
namespace {

struct GenerateCommand {
  std::string checkpoint, prompt;
  int max_new = 200;
  double temperature = 0.0;
  uint64_t seed = 0;
  bool no_stop = false, only_new = false;
  int threads = 0;
  OverrideFlags overrides;

  void run() {
    train::use_threads(threads);
    LoadedRun r = load_run(checkpoint);
    overrides.apply(r);
    std::vector<int32_t> ids32 = r.task->vocab().encode(prompt);  // rotary::Error names an unknown character
    check(!ids32.empty(), "--prompt", "\"\"", "at least one token");
    std::vector<int64_t> ids(ids32.begin(), ids32.end());
    const int64_t stop = no_stop ? -1 : train::stop_token(*r.task);
    std::vector<int64_t> out = r.model->generate(ids, max_new, temperature, stop, seed);
    const std::string text = r.task->vocab().decode(std::vector<int32_t>(out.begin(), out.end()));
    std::printf("%s%s\n", only_new ? "" : prompt.c_str(), text.c_str());
  }
};

const CommandRegistrar kRegister([](CLI::App& root) {
  auto cmd = std::make_shared<GenerateCommand>();
  CLI::App* sub = root.add_subcommand("generate", "sample from a trained model (KV-cache decoder)");
  sub->add_option("checkpoint,--checkpoint", cmd->checkpoint, "checkpoint file or run directory")->required();
  sub->add_option("--prompt", cmd->prompt, "text to continue (in the task's vocabulary)")->required();
  sub->add_option("--max-new", cmd->max_new, "tokens to generate at most")->transform(integer_in(1, kMaxSequenceLength));
  sub->add_option("--temperature", cmd->temperature, "0 = greedy")->transform(finite_in(0, 100));
  sub->add_option("--seed", cmd->seed, "sampling seed")->transform(unsigned_up_to(UINT64_MAX));
  sub->add_flag("--no-stop", cmd->no_stop, "do not stop at the task's stop token");
  sub->add_flag("--only-new", cmd->only_new, "print only the generated text, not the prompt");
  sub->add_option("--threads", cmd->threads, "torch threads (0 = all cores)")->transform(integer_in(0, kMaxThreads));
  cmd->overrides.add_to(*sub);
  sub->callback([cmd] { cmd->run(); });
});

}  // namespace
}  // namespace rotary::cli
