// `rotary bench checkpoint`: prefill and decode speed of a Llama-family model on the CPU - a Hugging Face
// checkpoint, or random weights in the shape of one (default: Qwen2.5-0.5B, 494M parameters) - with the rotary
// fused ops against the same model and weights built from plain torch ops (ModelConfig.fused = false).
//
// Prefill: the hidden states of a --prompt-token prompt and the LM head of its last position (what generation
// needs). Decode: generate() with greedy sampling; a decode token's time is (time for 1 + --decode new tokens -
// time for 1 new token) / --decode, so the prefill is not counted. A decode step reads every weight once (the
// head included; the embedding table once more where it is not tied), so its weight-read rate
// (bytes / decode time) is compared with memcpy's copy rate on buffers as large as those weights (256 MiB to
// 1 GiB: beyond the caches), measured in the same run. Methods take turns trial by trial (round robin) and the medians are reported.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "rotary/error.h"
#include "rotary_nn/hf_checkpoint.h"
#include "rotary_nn/model.h"
#include "train/trainer.h"

namespace rotary::cli {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct BenchCheckpointArgs {
  std::string model_dir;  // empty: random weights in the shape below
  int hidden = 896, layers = 24, heads = 14, kv_heads = 2, ff = 4864, vocab = 151936;  // Qwen2.5-0.5B
  int prompt = 512, decode = 16, trials = 3, threads = 0;
  bool json = false;
};

struct Method {
  std::string name;
  nn::Transformer model{nullptr};
  std::vector<double> prefill_tps, decode_tps;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// memcpy's rate (bytes copied per second) on two buffers of `bytes`, the best of a few copies.
double memcpy_rate(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 0;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::max(best, double(bytes) / since(t0));
  }
  if (b[bytes / 2] != 1) std::abort();  // keeps the copy observable
  return best;
}

void run(const BenchCheckpointArgs& a) {
  const int threads = train::use_threads(a.threads);
  nn::ModelConfig cfg;
  std::string shape;
  Method fused{"fused (rotary ops)", nullptr, {}, {}}, plain{"plain torch ops", nullptr, {}, {}};
  if (!a.model_dir.empty()) {
    nn::HfCheckpoint c = nn::load_hf_checkpoint(a.model_dir);
    cfg = c.spec.config;
    fused.model = c.model;
    shape = a.model_dir + " (" + c.spec.model_type + ")";
  } else {
    // Qwen2-style by default: RMSNorm, SwiGLU, q/k/v biases, tied head; the weights N(0, 0.02).
    cfg.vocab_size = a.vocab;
    cfg.d_model = a.hidden;
    cfg.n_layers = a.layers;
    cfg.n_heads = a.heads;
    cfg.n_kv_heads = a.kv_heads;
    cfg.d_ff = a.ff;
    cfg.normalization = "rmsnorm";
    cfg.norm_eps = 1e-6;
    cfg.mlp = "swiglu";
    cfg.qkv_bias = true;
    cfg.out_bias = cfg.mlp_bias = false;
    cfg.tie_embeddings = true;
    cfg.encoding.kind = nn::EncodingKind::Rope;
    cfg.encoding.rope.base = 1e6;
    torch::manual_seed(0);
    fused.model = nn::Transformer(cfg);
    shape = "random weights";
  }
  nn::ModelConfig plain_cfg = cfg;
  plain_cfg.fused = false;
  plain.model = nn::Transformer(plain_cfg);
  {
    torch::NoGradGuard no_grad;
    auto dst = plain.model->named_parameters();
    for (const auto& p : fused.model->named_parameters()) dst[p.key()].copy_(p.value());
  }
  for (Method* m : {&fused, &plain}) m->model->eval();

  int64_t params = 0, read_per_token = 0;
  for (const auto& p : fused.model->named_parameters()) {
    params += p.value().numel();
    // The embedding table is read once per token only through the tied head; untied, one row (not counted).
    if (p.key() != "tok_emb.weight" || cfg.tie_embeddings) read_per_token += p.value().numel() * 4;
  }
  check(a.prompt + a.decode <= kMaxSequenceLength, "--prompt + --decode", a.prompt + a.decode, "<= 2^20");
  if (cfg.sliding_window > 0)
    check(a.prompt + a.decode <= cfg.sliding_window, "--prompt + --decode", a.prompt + a.decode,
          "<= the checkpoint's sliding_window = " + std::to_string(cfg.sliding_window));

  torch::manual_seed(1);
  const torch::Tensor prompt = torch::randint(0, cfg.vocab_size, {1, a.prompt}, torch::kLong);
  std::vector<int64_t> prompt_ids(prompt.data_ptr<int64_t>(), prompt.data_ptr<int64_t>() + a.prompt);
  auto prefill = [&](Method& m) {
    torch::NoGradGuard no_grad;
    const auto t0 = Clock::now();
    const torch::Tensor h = m.model->hidden_states(prompt);
    const torch::Tensor logits = m.model->project(h.select(1, a.prompt - 1));
    (void)logits.argmax().item<int64_t>();
    return double(a.prompt) / since(t0);
  };
  auto decode = [&](Method& m) {
    auto t0 = Clock::now();
    m.model->generate(prompt_ids, 1, 0.0, -1, 0);
    const double one = since(t0);
    t0 = Clock::now();
    m.model->generate(prompt_ids, 1 + a.decode, 0.0, -1, 0);
    return double(a.decode) / std::max(1e-9, since(t0) - one);
  };
  // Same greedy continuation from both: they compute the same function.
  const std::vector<int64_t> out_fused = fused.model->generate(prompt_ids, 4, 0.0, -1, 0);
  const std::vector<int64_t> out_plain = plain.model->generate(prompt_ids, 4, 0.0, -1, 0);
  const bool same_tokens = out_fused == out_plain;
  for (int t = 0; t < a.trials; ++t)
    for (Method* m : {&fused, &plain}) {
      m->prefill_tps.push_back(prefill(*m));
      m->decode_tps.push_back(decode(*m));
    }
  // Buffers as large as the weights read per token (at least 256 MiB, beyond any cache; at most 1 GiB).
  const size_t copy_bytes = std::clamp<size_t>(size_t(read_per_token), size_t(256) << 20, size_t(1) << 30);
  const double copy_rate = memcpy_rate(copy_bytes);

  auto read_rate = [&](const Method& m) { return double(read_per_token) * median(m.decode_tps); };
  if (a.json) {
    nlohmann::json j{{"shape", shape},
                     {"d_model", cfg.d_model},
                     {"n_layers", cfg.n_layers},
                     {"n_heads", cfg.n_heads},
                     {"n_kv_heads", cfg.kv_heads()},
                     {"d_ff", cfg.ff_dim()},
                     {"vocab", cfg.vocab_size},
                     {"parameters", params},
                     {"weight_bytes_read_per_decode_token", read_per_token},
                     {"prompt", a.prompt},
                     {"decode", a.decode},
                     {"trials", a.trials},
                     {"threads", threads},
                     {"memcpy_bytes_per_s", copy_rate},
                     {"memcpy_buffer_bytes", copy_bytes},
                     {"same_greedy_tokens", same_tokens},
                     {"prefill_fused_over_plain", median(fused.prefill_tps) / median(plain.prefill_tps)},
                     {"decode_fused_over_plain", median(fused.decode_tps) / median(plain.decode_tps)}};
    for (const Method* m : {&fused, &plain})
      j["methods"].push_back({{"name", m->name},
                              {"prefill_tokens_per_s", median(m->prefill_tps)},
                              {"decode_tokens_per_s", median(m->decode_tps)},
                              {"prefill_trials", m->prefill_tps},
                              {"decode_trials", m->decode_tps},
                              {"weight_read_bytes_per_s", read_rate(*m)},
                              {"weight_read_over_memcpy", read_rate(*m) / copy_rate}});
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%s: d_model %d, %d layers, %d heads (%d kv), d_ff %d, vocab %d: %.1fM parameters (float32), "
              "%d threads\n",
              shape.c_str(), cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.kv_heads(), cfg.ff_dim(), cfg.vocab_size,
              double(params) / 1e6, threads);
  std::printf("prompt %d tokens, decode %d tokens, median of %d trials; greedy tokens equal: %s\n", a.prompt,
              a.decode, a.trials, same_tokens ? "yes" : "NO");
  std::printf("%-20s %16s %16s %22s\n", "method", "prefill tok/s", "decode tok/s", "weights read / memcpy");
  for (const Method* m : {&fused, &plain})
    std::printf("%-20s %16.1f %16.2f %15.2f GB/s %4.0f%%\n", m->name.c_str(), median(m->prefill_tps),
                median(m->decode_tps), read_rate(*m) / 1e9, 100 * read_rate(*m) / copy_rate);
  std::printf("memcpy: %.2f GB/s copied (%zu MiB buffers). fused / plain: prefill %.2fx, decode %.2fx\n",
              copy_rate / 1e9, copy_bytes >> 20, median(fused.prefill_tps) / median(plain.prefill_tps),
              median(fused.decode_tps) / median(plain.decode_tps));
}

const CommandRegistrar kRegister([](CLI::App& root) {
  auto args = std::make_shared<BenchCheckpointArgs>();
  CLI::App& bench = subcommand_group(root, "bench", "benchmarks");
  CLI::App* sub = bench.add_subcommand(
      "checkpoint", "prefill and decode tokens/s of a Llama-family model (a checkpoint, or random weights in "
                    "Qwen2.5-0.5B's shape): fused rotary ops vs plain torch ops, weight-read rate vs memcpy");
  sub->add_option("--model", args->model_dir, "a Hugging Face model directory (default: random weights)");
  sub->add_option("--hidden", args->hidden, "random model: hidden size")->transform(integer_in(16, 1 << 15));
  sub->add_option("--layers", args->layers, "random model: layers")->transform(integer_in(1, 256));
  sub->add_option("--heads", args->heads, "random model: attention heads")->transform(integer_in(1, 256));
  sub->add_option("--kv-heads", args->kv_heads, "random model: key/value heads")->transform(integer_in(1, 256));
  sub->add_option("--ff", args->ff, "random model: MLP width")->transform(integer_in(1, 1 << 18));
  sub->add_option("--vocab", args->vocab, "random model: vocabulary")->transform(integer_in(2, 1 << 20));
  sub->add_option("--prompt", args->prompt, "prompt tokens (prefill)")->transform(integer_in(1, 1 << 20));
  sub->add_option("--decode", args->decode, "generated tokens timed")->transform(integer_in(1, 1 << 16));
  sub->add_option("--trials", args->trials, "trials per method (median reported)")->transform(integer_in(1, 1000));
  sub->add_option("--threads", args->threads, "torch / OpenMP threads (0 = all cores)")->transform(integer_in(0, kMaxThreads));
  sub->add_flag("--json", args->json, "print JSON");
  sub->callback([args] { run(*args); });
});

}  // namespace
}  // namespace rotary::cli
