// lab/cli/torch/train_flags.h: the flags that set TrainConfig fields, shared by `rotary train` and
// `rotary compare`. A flag overrides the TOML file (--config), which overrides the built-in defaults: every
// flag remembers whether it was given and sets its one field only then.
#pragma once

#include <CLI/CLI.hpp>

#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "cli/options.h"
#include "common/files.h"
#include "rotary/error.h"
#include "train/config.h"

namespace rotary::cli {

class TrainFlags {
 public:
  void add_to(CLI::App& app) {
    app.add_option("--config", config_file, "TOML file with the run's settings (flags override it)")
        ->check(CLI::ExistingFile);
    using C = train::TrainConfig;
    auto& o = app;
    add<std::string>(o, "--task", "task: addition, substring_index, substring_search, kv_retrieval, text",
                     [](C& c, const std::string& v) { c.task = v; });
    add<int>(o, "--max-digits", integer_in(1, 18), "addition: up to this many digits", [](C& c, int v) { c.task_options.max_digits = v; });
    add<int>(o, "--min-string", integer_in(1, kMaxSequenceLength), "substring_index: shortest string", [](C& c, int v) { c.task_options.min_string = v; });
    add<int>(o, "--max-string", integer_in(1, kMaxSequenceLength), "substring_index: longest string", [](C& c, int v) { c.task_options.max_string = v; });
    add<int>(o, "--search-substring", integer_in(1, kMaxSequenceLength), "substring_search: copied substring length",
             [](C& c, int v) { c.task_options.search_substring = v; });
    add<int>(o, "--search-eval-len", integer_in(1, kMaxSequenceLength), "substring_search: context before an eval problem's '>'",
             [](C& c, int v) { c.task_options.search_eval_len = v; });
    add<int>(o, "--kv-pairs", integer_in(1, 1 << 16), "kv_retrieval: pairs per object", [](C& c, int v) { c.task_options.kv_pairs = v; });
    add<int>(o, "--text-vocab", integer_in(2, 1 << 20), "text: sentencepiece vocabulary size", [](C& c, int v) { c.task_options.text_vocab = v; });
    add<std::string>(o, "--cache-dir", "text: corpus and tokenizer cache",
                     [](C& c, const std::string& v) { c.task_options.cache_dir = v; });

    add<int>(o, "--d-model", integer_in(1, 1 << 16), "model width", [](C& c, int v) { c.model.d_model = v; });
    add<int>(o, "--n-layers", integer_in(1, 1024), "transformer blocks", [](C& c, int v) { c.model.n_layers = v; });
    add<int>(o, "--n-heads", integer_in(1, 4096), "attention heads", [](C& c, int v) { c.model.n_heads = v; });
    add<int>(o, "--n-kv-heads", integer_in(0, 4096), "key/value heads (0 = n-heads)", [](C& c, int v) { c.model.n_kv_heads = v; });
    add<int>(o, "--d-ff", integer_in(0, 1 << 20), "MLP width (0 = 4 * d-model)", [](C& c, int v) { c.model.d_ff = v; });
    add<std::string>(o, "--norm", "pre | post (LayerNorm placement)", [](C& c, const std::string& v) {
      check(v == "pre" || v == "post", "--norm", v, "pre, post");
      c.model.pre_norm = v == "pre";
    });
    add<double>(o, "--dropout", finite_in(0, 1), "dropout rate", [](C& c, double v) { c.model.dropout = v; });
    add<bool>(o, "--tie-embeddings", "share input embedding and LM head (true/false)",
              [](C& c, bool v) { c.model.tie_embeddings = v; });
    add<int>(o, "--max-seq-len", integer_in(1, kMaxSequenceLength), "learned positions: table size", [](C& c, int v) { c.model.max_seq_len = v; });
    add<std::string>(o, "--attention", "softmax | linear", [](C& c, const std::string& v) { c.model.attention = v; });
    add<bool>(o, "--fused", "rotary fused ops (true) or plain torch ops (false)", [](C& c, bool v) { c.model.fused = v; });
    add<std::string>(o, "--encoding", "none, learned, sinusoidal, alibi, rope, roper, rerope, leaky_rerope",
                     [](C& c, const std::string& v) { c.model.encoding.kind = nn::parse_encoding_kind(v, "--encoding"); });
    add<std::string>(o, "--rope-layout", "half_split | interleaved",
                     [](C& c, const std::string& v) { c.model.encoding.rope.layout = parse_layout(v); });
    add<double>(o, "--rotary-fraction", finite_in(0, 1), "fraction of each head that rotates",
                [](C& c, double v) { c.model.encoding.rotary_fraction = v; });
    add<double>(o, "--rope-base", finite(), "RoPE base (theta)", [](C& c, double v) { c.model.encoding.rope.base = v; });
    add<std::string>(o, "--rope-scaling", "none, linear, ntk, ntk_mixed, dynamic, yarn, llama3, ...",
                     [](C& c, const std::string& v) { c.model.encoding.rope.scaling = parse_scaling(v); });
    add<double>(o, "--rope-factor", finite(), "context-extension factor of the scaling",
                [](C& c, double v) { c.model.encoding.rope.factor = v; });
    add<int64_t>(o, "--rope-original-max", integer_in(0, int64_t{1} << 53), "pre-extension context (yarn, llama3, longrope)",
                 [](C& c, int64_t v) { c.model.encoding.rope.original_max_position_embeddings = v; });
    add<int64_t>(o, "--window", integer_in(0, int64_t{1} << 53), "rerope / leaky_rerope window", [](C& c, int64_t v) { c.model.encoding.window = v; });
    add<double>(o, "--leaky-k", finite(), "leaky_rerope: slope 1/k beyond the window",
                [](C& c, double v) { c.model.encoding.leaky_k = v; });
    add<int64_t>(o, "--logn", integer_in(0, int64_t{1} << 53), "log-n query scaling relative to this training length (0 = off)",
                 [](C& c, int64_t v) { c.model.encoding.logn_train_len = v; });

    add<int>(o, "--seq-len", integer_in(2, kMaxSequenceLength), "training sequence length", [](C& c, int v) { c.seq_len = v; });
    add<int>(o, "--batch-size", integer_in(1, 1 << 20), "global batch (rows per step, over all processes)", [](C& c, int v) { c.batch_size = v; });
    add<int64_t>(o, "--steps", integer_in(1, int64_t{1} << 40), "optimizer steps", [](C& c, int64_t v) { c.steps = v; });
    add<uint64_t>(o, "--seed", unsigned_up_to(UINT64_MAX), "parameters, data order, dropout", [](C& c, uint64_t v) { c.seed = v; });
    add<double>(o, "--lr", finite(), "AdamW peak learning rate", [](C& c, double v) { c.optim.lr = v; });
    add<double>(o, "--beta1", finite_in(0, 1), "AdamW beta1", [](C& c, double v) { c.optim.beta1 = v; });
    add<double>(o, "--beta2", finite_in(0, 1), "AdamW beta2", [](C& c, double v) { c.optim.beta2 = v; });
    add<double>(o, "--adam-eps", finite(), "AdamW epsilon", [](C& c, double v) { c.optim.eps = v; });
    add<double>(o, "--weight-decay", finite(), "AdamW decoupled weight decay (matrices only)",
                [](C& c, double v) { c.optim.weight_decay = v; });
    add<int64_t>(o, "--warmup", integer_in(0, int64_t{1} << 40), "linear warm-up steps", [](C& c, int64_t v) { c.optim.warmup_steps = v; });
    add<double>(o, "--min-lr-ratio", finite_in(0, 1), "cosine floor as a fraction of --lr", [](C& c, double v) { c.optim.min_lr_ratio = v; });
    add<double>(o, "--grad-clip", finite(), "max global gradient norm (0 = off)", [](C& c, double v) { c.optim.grad_clip = v; });
    add<int64_t>(o, "--eval-interval", integer_in(0, int64_t{1} << 40), "evaluate every N steps (0 = at the end only)",
                 [](C& c, int64_t v) { c.eval_interval = v; });
    add<int>(o, "--eval-batches", integer_in(0, 1 << 20), "held-out rows = this x batch size", [](C& c, int v) { c.eval_batches = v; });
    add<int>(o, "--eval-problems", integer_in(0, 1 << 20), "exact-match problems per evaluation", [](C& c, int v) { c.eval_problems = v; });
    add<uint64_t>(o, "--eval-seed", unsigned_up_to(UINT64_MAX), "seed of held-out rows and problems", [](C& c, uint64_t v) { c.eval_seed = v; });
    add<int64_t>(o, "--checkpoint-interval", integer_in(0, int64_t{1} << 40), "checkpoint every N steps (0 = at each evaluation)",
                 [](C& c, int64_t v) { c.checkpoint_interval = v; });
    add<std::string>(o, "--out", "output directory", [](C& c, const std::string& v) { c.out_dir = v; });
    add<int>(o, "--threads", integer_in(0, kMaxThreads), "torch threads per process (0 = cores / processes)", [](C& c, int v) { c.threads = v; });
  }

  bool any_given() const {
    for (const Setter& s : setters_)
      if (s.option->count() > 0) return true;
    return !config_file.empty();
  }

  // base <- the TOML file (if given) <- the flags that were given.
  train::TrainConfig resolve(train::TrainConfig base) const {
    if (!config_file.empty()) {
      nlohmann::json file = train::toml_to_json(lab::read_file(config_file), config_file);
      try {
        train::from_json(file, base);
      } catch (const Error& e) {
        throw Error(std::string(e.what()) + " (in " + config_file + ")");
      }
    }
    for (const Setter& s : setters_)
      if (s.option->count() > 0) s.apply(base);
    return base;
  }

  std::string config_file;

 private:
  struct Setter {
    CLI::Option* option;
    std::function<void(train::TrainConfig&)> apply;
  };

  // Numbers: the validator (options.h) states the allowed range in --help and refuses anything outside it.
  template <class T, class F>
  void add(CLI::App& app, const std::string& name, const CLI::Validator& range, const std::string& help, F set) {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>);
    add<T>(app, name, help, set)->transform(range);
  }

  template <class T, class F>
  CLI::Option* add(CLI::App& app, const std::string& name, const std::string& help, F set) {
    auto value = std::make_shared<T>();
    // A flag given twice takes its last value, so a script can append an override to a shared flag list.
    CLI::Option* opt = app.add_option(name, *value, help)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    setters_.push_back({opt, [value, set](train::TrainConfig& c) { set(c, *value); }});
    return opt;
  }

  std::vector<Setter> setters_;
};

// The command line of this process, for reports and for re-executing it as data-parallel workers.
inline std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

inline std::string quoted_command_line() {
  std::string s;
  for (const std::string& a : own_command_line()) {
    const bool plain = !a.empty() && a.find_first_of(" \t\"'$\\`*?;&|<>()") == std::string::npos;
    s += (s.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  return s;
}

}  // namespace rotary::cli
