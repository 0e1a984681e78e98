// `rotary bench train`: training throughput (tokens/s) of the lab transformer with the rotary fused ops
// (ModelConfig.fused = true) against the same model built from plain torch ops (fused = false).
//
// Both models have the same shape and seed, see the same batch of random tokens and take full training steps:
// forward, cross-entropy, backward, AdamW step. Thread count is the same for both (torch and OpenMP). After
// --warmup steps each, the methods take turns in --trials trials of --steps steps (round robin, so a slow stretch
// of a shared machine hits both alike); the median trial gives tokens/s. The first-step losses of the two models
// are printed as a check that they compute the same function.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/statistics.h"
#include "cli/command.h"
#include "rotary/error.h"
#include "rotary_nn/model.h"
#include "train/trainer.h"

namespace rotary::cli {
namespace {

using lab::median;

struct BenchTrainArgs {
  int seq_len = 512, d_model = 256, n_layers = 4, n_heads = 8, batch = 4, vocab = 256;
  int warmup = 2, steps = 3, trials = 3, threads = 0;
  std::string encoding = "rope";
  std::string against;  // another encoding, fused too: the whole-model cost of `encoding` over it (seed 002)
  bool json = false;
};

struct Method {
  std::string name;
  bool fused;
  nn::EncodingKind encoding;
  nn::Transformer model{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
  double first_loss = 0;
  std::vector<double> trial_tokens_per_s;
};

double train_step(Method& m, const torch::Tensor& inputs, const torch::Tensor& targets) {
  m.optimizer->zero_grad();
  torch::Tensor logits = m.model->forward(inputs);  // [B, S, V]
  torch::Tensor loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(2)}), targets.reshape({-1}));
  loss.backward();
  m.optimizer->step();
  return loss.item<double>();
}

void run(const BenchTrainArgs& a) {
  const int threads = train::use_threads(a.threads);
  nn::ModelConfig cfg;
  cfg.vocab_size = a.vocab;
  cfg.d_model = a.d_model;
  cfg.n_layers = a.n_layers;
  cfg.n_heads = a.n_heads;
  cfg.max_seq_len = a.seq_len;
  const nn::EncodingKind encoding = nn::parse_encoding_kind(a.encoding, "--encoding");

  torch::manual_seed(1234);
  torch::Tensor tokens = torch::randint(0, a.vocab, {a.batch, a.seq_len + 1}, torch::kInt64);  // [B, S+1]
  torch::Tensor inputs = tokens.slice(1, 0, a.seq_len).contiguous();
  torch::Tensor targets = tokens.slice(1, 1, a.seq_len + 1).contiguous();

  std::vector<Method> methods(2);
  methods[0].name = "fused (rotary ops)";
  methods[0].fused = true;
  methods[0].encoding = encoding;
  methods[1].name = "plain torch ops";
  methods[1].fused = false;
  methods[1].encoding = encoding;
  if (!a.against.empty()) {
    Method other;
    other.name = "fused, " + a.against;
    other.fused = true;
    other.encoding = nn::parse_encoding_kind(a.against, "--against");
    check(other.encoding != encoding, "--against", a.against, "an encoding other than --encoding " + a.encoding);
    methods.push_back(std::move(other));
  }
  for (Method& m : methods) {
    cfg.fused = m.fused;
    cfg.encoding = nn::EncodingConfig{};
    cfg.encoding.kind = m.encoding;
    torch::manual_seed(0);  // same parameters for both
    m.model = nn::Transformer(cfg);
    m.model->train();
    m.optimizer = std::make_unique<torch::optim::AdamW>(m.model->parameters(), torch::optim::AdamWOptions(1e-4));
    m.first_loss = train_step(m, inputs, targets);
    for (int i = 1; i < a.warmup; ++i) train_step(m, inputs, targets);
  }
  const double tokens_per_trial = static_cast<double>(a.batch) * a.seq_len * a.steps;
  for (int t = 0; t < a.trials; ++t) {
    for (Method& m : methods) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < a.steps; ++i) train_step(m, inputs, targets);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      m.trial_tokens_per_s.push_back(tokens_per_trial / s);
    }
  }
  const double fused = median(methods[0].trial_tokens_per_s), plain = median(methods[1].trial_tokens_per_s);
  // The whole-model cost of the encoding over --against: how much longer a step takes, in percent.
  const double overhead =
      methods.size() > 2 ? 100.0 * (median(methods[2].trial_tokens_per_s) / fused - 1.0) : std::nan("");

  if (a.json) {
    nlohmann::json j{{"seq_len", a.seq_len},   {"d_model", a.d_model}, {"n_layers", a.n_layers},
                     {"n_heads", a.n_heads},   {"batch", a.batch},     {"vocab", a.vocab},
                     {"encoding", a.encoding}, {"threads", threads},   {"warmup", a.warmup},
                     {"steps", a.steps},       {"trials", a.trials},   {"ratio", fused / plain}};
    if (!a.against.empty()) j["against"] = a.against, j["overhead_percent_vs_against"] = overhead;
    for (const Method& m : methods)
      j["methods"].push_back({{"name", m.name},
                              {"fused", m.fused},
                              {"tokens_per_s_median", median(m.trial_tokens_per_s)},
                              {"tokens_per_s_trials", m.trial_tokens_per_s},
                              {"first_step_loss", m.first_loss}});
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("training step (forward + backward + AdamW), %s, seq %d, d_model %d, %d layers, %d heads, batch %d, "
              "%d threads\n",
              a.encoding.c_str(), a.seq_len, a.d_model, a.n_layers, a.n_heads, a.batch, threads);
  std::printf("%-20s %14s %16s\n", "method", "tokens/s", "first-step loss");
  for (const Method& m : methods)
    std::printf("%-20s %14.0f %16.6f\n", m.name.c_str(), median(m.trial_tokens_per_s), m.first_loss);
  std::printf("fused / plain: %.2fx (median of %d trials of %d steps)\n", fused / plain, a.trials, a.steps);
  if (!a.against.empty())
    std::printf("%s over %s, both fused: %+.1f%% time per step (seed 002: 1-3%% for rotary over learned)\n",
                a.encoding.c_str(), a.against.c_str(), overhead);
}

const CommandRegistrar kRegister([](CLI::App& root) {
  auto args = std::make_shared<BenchTrainArgs>();
  CLI::App& bench = subcommand_group(root, "bench", "benchmarks");
  CLI::App* sub = bench.add_subcommand("train", "training tokens/s: fused rotary ops vs plain torch ops");
  sub->add_option("--seq-len", args->seq_len, "sequence length")->transform(integer_in(2, 1 << 16));
  sub->add_option("--d-model", args->d_model, "model width")->transform(integer_in(8, 1 << 14));
  sub->add_option("--n-layers", args->n_layers, "blocks")->transform(integer_in(1, 256));
  sub->add_option("--n-heads", args->n_heads, "heads")->transform(integer_in(1, 256));
  sub->add_option("--batch", args->batch, "rows per step")->transform(integer_in(1, 4096));
  sub->add_option("--encoding", args->encoding, "position encoding of both models");
  sub->add_option("--against", args->against,
                  "a third model, fused, with this encoding (e.g. learned): the whole-model cost of --encoding over it");
  sub->add_option("--warmup", args->warmup, "untimed steps per method")->transform(integer_in(1, 1000));
  sub->add_option("--steps", args->steps, "steps per trial")->transform(integer_in(1, 100000));
  sub->add_option("--trials", args->trials, "trials per method (median reported)")->transform(integer_in(1, 1000));
  sub->add_option("--threads", args->threads, "torch / OpenMP threads (0 = all cores)")->transform(integer_in(0, kMaxThreads));
  sub->add_flag("--json", args->json, "print JSON");
  sub->callback([args] { run(*args); });
});

}  // namespace
}  // namespace rotary::cli
