// rotary perplexity: seed 004's measurement on a real checkpoint - loss on the last L tokens of windows of
// growing length, per inference-time method (experiments/perplexity.h).
#include <algorithm>
#include <cstdio>
#include <fmt/format.h>
#include <string>

#include "cli/run_outcome.h"
#include "cli/command.h"
#include "cli/command_line.h"
#include "cli/checkpoint_flags.h"
#include "common/exit_status.h"
#include "experiments/perplexity.h"

namespace rotary::cli {
namespace {

// "4k" = 4096, "16K" = 16384, "1000" = 1000: lengths as people write them.
std::vector<int64_t> parse_lengths(const std::string& text) {
  std::vector<int64_t> out;
  for (std::string item : parse_name_list(text, "--lengths")) {
    int64_t scale = 1;
    if (!item.empty() && (item.back() == 'k' || item.back() == 'K')) {
      scale = 1024;
      item.pop_back();
    }
    out.push_back(parse_integer(item, "--lengths", 1, kMaxAbsPosition / 1024) * scale);
  }
  return out;
}

struct PerplexityCommand {
  experiments::PerplexitySpec spec;
  CLI::App* app = nullptr;
  std::string lengths, methods, logn = "off";
  CheckpointMemoryFlags memory_flags;
  bool no_progress = false;

  void run() {
    // Scoring runs each window in one pass that stores no KV rows, and q8 is a way of storing them (it applies when
    // decoding: generate, bench checkpoint): every cell would be labelled q8 and equal f32's.
    check(spec.run.kv_dtype != "q8", "--kv-dtype", spec.run.kv_dtype,
          "f32, bf16, f16 for perplexity (its one-pass scoring stores no KV rows; q8 applies to the rows a decoding "
          "cache stores: generate, bench checkpoint)");
    memory_flags.check_given_together(spec.memory);
    if (app->get_option("--lengths")->count()) spec.lengths = parse_lengths(lengths);
    if (app->get_option("--methods")->count()) spec.methods = parse_name_list(methods, "--methods");
    // A method's setting given without the method is refused, not silently unused.
    auto runs = [&](const char* method) {
      return std::find(spec.methods.begin(), spec.methods.end(), method) != spec.methods.end();
    };
    check_given_only_with(app->get_option("--leaky-k"), runs("leaky_rerope"),
                          "with --methods including leaky_rerope (its k)");
    check_given_only_with(app->get_option("--dynamic-factor"), runs("dynamic"),
                          "with --methods including dynamic (its factor)");
    check(logn == "off" || logn == "on" || logn == "both", "--logn", logn, "off, on, both");
    spec.logn = logn == "both" ? std::vector<bool>{false, true} : std::vector<bool>{logn == "on"};
    spec.command_line = quoted_command_line();
    experiments::PerplexityResult r = experiments::run_perplexity(spec, !no_progress);
    exit_if_interrupted(r.run, "perplexity");
    std::printf("%s", r.table.c_str());
    if (!r.plot_problem.empty()) std::printf("note: %s\n", r.plot_problem.c_str());
    std::printf("report: %s, %s (%.0f s)\n", r.report_md.c_str(), r.csv.c_str(), r.seconds);
    if (!r.non_finite.empty()) {
      // As a training run whose loss stops being finite: the table is kept (NaN where it is), the status says so.
      std::string cells;
      for (size_t i = 0; i < r.non_finite.size() && i < 5; ++i) cells += (i ? ", " : "") + r.non_finite[i];
      if (r.non_finite.size() > 5) cells += fmt::format(", ... ({} in all)", r.non_finite.size());
      std::fprintf(stderr, "rotary perplexity: the loss is not finite in %s (the model's weights or the method's "
                   "settings overflow)\n", cells.c_str());
      throw CLI::RuntimeError(lab::kExitNonFiniteLoss);
    }
  }
};

const CommandRegistrar kRegister([](CLI::App& root) {
  auto cmd = std::make_shared<PerplexityCommand>();
  CLI::App* sub = root.add_subcommand(
      "perplexity",
      "seed 004 on a Hugging Face checkpoint: loss on the last L tokens of longer and longer windows, per method "
      "(native rope, pi, ntk, dynamic, yarn, rerope, leaky_rerope, +/- log-n)");
  cmd->app = sub;
  auto& s = cmd->spec;
  auto take_last = [](CLI::Option* o) { return o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast); };
  sub->add_option("model,--model", s.model_dir, "a Hugging Face model directory (config.json, safetensors, tokenizer)")
      ->required();
  take_last(sub->add_option("--text", s.text_file, "text to score, tokenized with the checkpoint's tokenizer"));
  take_last(sub->add_option("--tokens", s.tokens_file, "or: a file of whitespace-separated token ids"));
  take_last(sub->add_option("--lengths", cmd->lengths, "window lengths, e.g. 4k,8k,16k (default L,2L,4L)"));
  take_last(sub->add_option("--methods", cmd->methods,
                            "comma-separated: native, rope, pi, ntk, ntk_mixed, dynamic, yarn, rerope, leaky_rerope "
                            "(default native,ntk,yarn,rerope)"));
  take_last(sub->add_option("--logn", cmd->logn, "off | on | both: log-n query scaling (default off)"));
  take_last(sub->add_option("--train-len", s.train_len, "L: the trained context (default: from config.json)"))
      ->transform(integer_in(0, kMaxAbsPosition));
  take_last(sub->add_option("--window", s.window, "rerope / leaky_rerope window (default L/2)"))
      ->transform(integer_in(0, kMaxAbsPosition));
  take_last(sub->add_option("--leaky-k", s.leaky_k, "leaky_rerope k (default 16)"))->transform(finite_in(1, 1e9));
  take_last(sub->add_option("--dynamic-factor", s.dynamic_factor, "dynamic NTK factor (default 1)"))
      ->transform(finite_in(1, 1e9));
  take_last(sub->add_option("--windows", s.windows, "windows per length (default 1)"))->transform(integer_in(1, 1 << 16));
  take_last(sub->add_option("--head-chunk", s.head_chunk, "positions per LM-head chunk (default 512)"))
      ->transform(integer_in(1, 1 << 20));
  take_last(sub->add_option("--threads", s.threads, "threads (0 = all cores)"))->transform(integer_in(0, kMaxThreads));
  add_checkpoint_run_flags(*sub, s.run);
  cmd->memory_flags = add_checkpoint_memory_flags(*sub, s.memory);
  take_last(sub->add_option("--out", s.out_dir, "output directory (default runs/perplexity)"));
  sub->add_flag("--no-progress", cmd->no_progress, "no progress on stderr");
  sub->footer(
      "Every (method, length) cell is written to <out>/cells as it finishes; a rerun with the same model and text "
      "reuses them. With --memory every method also runs through the memory and through its window alone. Output: "
      "report.md, results.csv, loss_vs_length.png, loss_vs_position.png. See docs/checkpoints.md, docs/memory.md.");
  sub->callback([cmd] { cmd->run(); });
});

}  // namespace
}  // namespace rotary::cli
