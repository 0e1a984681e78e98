// rotary memory: seed 001's experiment - a passkey (or key-value) model trained at L answers prompts of 8L, 64L,
// 512L through a retrieval memory under each position policy, beside the full-context baselines where they fit.
#include <cstdio>

#include "cli/run_outcome.h"
#include "cli/command.h"
#include "cli/torch/train_flags.h"
#include "common/exit_status.h"
#include "experiments/memory_experiment.h"

namespace rotary::cli {
namespace {

struct MemoryCommand {
  TrainFlags flags;
  CLI::App* app = nullptr;
  std::string checkpoint, lengths, policies, top_k, baselines, indexes, memory_dtype;
  int full_max = 0, problems = 0, index_problems = 0;
  int64_t memory_window = 0;
  bool no_progress = false;

  bool given(const std::string& name) const { return app->get_option(name)->count() > 0; }

  experiments::MemorySpec resolve() const {
    experiments::MemorySpec spec = experiments::default_memory_spec();
    spec.run = flags.resolve(spec.run);
    // The default model is ReRoPE with w = 128: --encoding rope (without --window) drops the window it does not use.
    if (!nn::is_windowed(spec.run.model.encoding.kind) && !given("--window")) spec.run.model.encoding.window = 0;
    spec.threads = spec.run.threads;
    spec.eval_seed = spec.run.eval_seed;
    if (given("--out")) spec.out_dir = spec.run.out_dir;
    if (!checkpoint.empty()) spec.checkpoint = checkpoint;
    if (given("--lengths")) {
      spec.multiples.clear();
      for (int64_t m : parse_integer_list(lengths, "--lengths", 1, 4096)) spec.multiples.push_back(int(m));
    }
    if (given("--policies"))
      spec.policies = policies == "off" ? std::vector<std::string>{} : parse_name_list(policies, "--policies");
    if (given("--top-k")) {
      spec.top_k.clear();
      for (int64_t k : parse_integer_list(top_k, "--top-k", 1, 65536)) spec.top_k.push_back(int(k));
    }
    if (given("--baselines"))
      spec.baselines = baselines == "off" ? std::vector<std::string>{} : parse_name_list(baselines, "--baselines");
    if (given("--full-max")) spec.full_max_multiple = full_max;
    if (given("--memory-window")) spec.window = memory_window;
    if (given("--memory-dtype")) {
      spec.memory_dtype = parse_dtype(memory_dtype);
      check(spec.memory_dtype != DType::F64, "--memory-dtype", memory_dtype, "f32, bf16 or f16");
    }
    if (given("--problems")) spec.problems = problems;
    if (given("--indexes"))
      spec.indexes = indexes == "off" ? std::vector<std::string>{} : parse_name_list(indexes, "--indexes");
    if (given("--index-problems")) spec.index_problems = index_problems;
    spec.command_line = quoted_command_line();
    return spec;
  }

  void run() {
    const experiments::MemorySpec spec = resolve();
    experiments::MemoryResult r = experiments::run_memory(spec, !no_progress);
    exit_if_interrupted(r.run, "memory");
    std::printf("%s\n", r.report_md.c_str());
    std::printf("report: %s/report.md (%.0f s)\n", spec.out_dir.c_str(), r.seconds);
  }
};

const CommandRegistrar kRegister([](CLI::App& root) {
  auto cmd = std::make_shared<MemoryCommand>();
  CLI::App* sub = root.add_subcommand(
      "memory",
      "seed 001's experiment: a passkey (or kv_retrieval, or text) model trained at L answers prompts of 8L, 64L, "
      "512L through a retrieval memory (policies exact, rerope, none, unlimiformer; top-k), beside full-context "
      "baselines (default ~16 min)");
  cmd->app = sub;
  auto take_last = [](CLI::Option* o) { return o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast); };
  take_last(sub->add_option("--checkpoint", cmd->checkpoint,
                            "use this passkey, kv_retrieval or text model (RoPE, ReRoPE) instead of training one"));
  take_last(sub->add_option("--lengths", cmd->lengths, "prompt lengths as multiples of L (default 1,8,64,512)"));
  take_last(sub->add_option("--policies", cmd->policies,
                            "memory policies, comma-separated: exact, rerope, none, unlimiformer, or off (default all)"));
  take_last(sub->add_option("--top-k", cmd->top_k, "memory keys retrieved per head, comma-separated (default 8)"));
  take_last(sub->add_option("--baselines", cmd->baselines,
                            "full-context decoding without a memory, comma-separated: trained (the model's own "
                            "encoding) and, for a RoPE model, rope, pi, ntk, ntk_mixed, dynamic, yarn, rerope, "
                            "leaky_rerope; or off (default trained)"));
  take_last(sub->add_option("--full-max", cmd->full_max, "baselines up to L x this (default 8; 0: none)"))
      ->transform(integer_in(0, 4096));
  take_last(sub->add_option("--memory-window", cmd->memory_window,
                            "tokens per layer kept exact, W (default L/2); also the rerope baseline's window"))
      ->transform(integer_in(1, kMaxSequenceLength));
  take_last(sub->add_option("--memory-dtype", cmd->memory_dtype,
                            "the memories' keys and values: f32, bf16 or f16 (half the bytes; default f32)"));
  take_last(sub->add_option("--problems", cmd->problems, "prompts per cell (default 10)"))->transform(integer_in(1, 100000));
  take_last(sub->add_option("--indexes", cmd->indexes,
                            "indexes whose recall, work and speed are measured on the model's own memory, "
                            "comma-separated: FAISS flat, hnsw, ivf; the core's page search over pages of "
                            "consecutive tokens (pages) or of alike keys (kdtree), certified exact, or reading P "
                            "pages of 32 rows per query (pages16, kdtree16); the query-routed graph learnt from "
                            "the prompt's queries, search width 128 or W (graph, graph256); or off (default "
                            "flat,ivf,kdtree)"));
  take_last(sub->add_option("--index-problems", cmd->index_problems,
                            "prompts per length searched through each index (default 3)"))
      ->transform(integer_in(1, 100000));
  sub->add_flag("--no-progress", cmd->no_progress, "no progress on stderr");
  cmd->flags.add_to(*sub);
  sub->footer(
      "The training flags set the model (--steps, --seq-len = L, --d-model, ...; default --task passkey "
      "--encoding rerope --window 128 at L = 256; --task kv_retrieval tests objects of as many pairs as fill each "
      "length; a text model is scored on 32 tokens after windows of its training text); --threads the torch "
      "threads. Output in --out (default runs/memory): report.md with the tables and PNGs, results.csv, cells/; a "
      "rerun reuses the trained model and every scored cell. See docs/memory.md.");
  sub->callback([cmd] { cmd->run(); });
});

}  // namespace
}  // namespace rotary::cli
