// `rotary bench checkpoint`: prefill and decode speed of a Llama-family model on the CPU - a Hugging Face
// checkpoint, or random weights in the shape of one (default: Qwen2.5-0.5B, 494M parameters).
//
// --engine engine (the default): the torch-free engine (rotary_engine/model.h) with the weights in place in their
// stored format or --weights (random weights: bf16 by default, as the checkpoints are published), the KV cache in
// --kv-dtype; prefill and decode tokens/s, the weight bytes a decode step reads per second against a read-bandwidth
// probe of the same run (lab::read_bandwidth), and the process's peak resident set.
// --engine torch: the nn model (float32 copies of the weights) with the rotary fused ops against the same model and
// weights built from plain torch ops (ModelConfig.fused = false).
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
#include <map>
#include <memory>
#include <vector>

#include <omp.h>
#include <sys/resource.h>

#include <random>

#include "common/statistics.h"
#include "cli/command.h"
#include "cli/checkpoint_flags.h"
#include "common/machine.h"
#include "rotary/error.h"
#include "rotary/linear.h"
#include "rotary_engine/model.h"
#include "rotary_nn/hf_engine.h"
#ifdef ROTARY_HAVE_TORCH  // --engine torch: the nn model, fused ops against plain torch ops
#include "rotary_nn/hf_checkpoint.h"
#include "rotary_nn/model.h"
#include "train/trainer.h"
#endif

namespace rotary::cli {
namespace {

using lab::median;

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct BenchCheckpointArgs {
  std::string model_dir;  // empty: random weights in the shape below
  int hidden = 896, layers = 24, heads = 14, kv_heads = 2, ff = 4864, vocab = 151936;  // Qwen2.5-0.5B
  int prompt = 512, decode = 16, trials = 3, threads = 0;
  int64_t prefill_chunk = engine::SessionOptions{}.prefill_chunk;  // the engine's default
  const CLI::Option* prefill_chunk_flag = nullptr;                  // given or not (refused with --engine torch)
  std::vector<const CLI::Option*> shape_flags;                      // --hidden ... --vocab: refused with --model
  experiments::CheckpointRunOptions run;  // --engine, --weights (random weights: stored bf16), --kv-dtype
  bool json = false;
};

#ifdef ROTARY_HAVE_TORCH
struct Method {
  std::string name;
  nn::Transformer model{nullptr};
  std::vector<double> prefill_tps, decode_tps;
};
#endif


#ifdef ROTARY_HAVE_TORCH  // the nn model's runs compare their read rate with it
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
#endif

// The process's peak resident set (bytes) so far.
int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;
}

// Random weights for the engine in the given shape, stored as `dtype`: every tensor uniform with the standard
// deviation 0.02 of N(0, 0.02) initialisation (norm weights 1), from a counter-based generator so that filling
// 0.5-8 B parameters is quick and needs no state per thread.
struct RandomWeights {
  std::map<std::string, std::vector<uint8_t>> bytes;
  std::map<std::string, engine::StoredTensor> tensors;
  RandomWeights(const engine::Architecture& arch, DType dtype, int threads) {
    uint64_t stream = 0;
    for (const engine::TensorSlot& slot : engine::tensor_slots(arch)) {
      int64_t n = 1;
      for (int64_t d : slot.shape) n *= d;
      std::vector<uint8_t>& b = bytes[slot.name];
      b.resize(size_t(n) * dtype_size(dtype));
      const bool ones = slot.name.ends_with("norm.weight");
      const uint64_t seed = ++stream * 0x9e3779b97f4a7c15ull;
#pragma omp parallel for schedule(static) num_threads(threads)
      for (int64_t i = 0; i < n; ++i) {
        uint64_t z = seed + uint64_t(i) * 0xbf58476d1ce4e5b9ull;  // splitmix64
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const double u = double(z >> 11) * 0x1p-53 * 2 - 1;  // [-1, 1): std 1/sqrt3
        store_from_double(b.data(), dtype, i, ones ? 1.0 : u * 0.02 * 1.7320508075688772);
      }
      tensors[slot.name] = {dtype, b.data(), slot.shape, slot.name, std::nullopt};
    }
  }
};

void run_engine(const BenchCheckpointArgs& a) {
  const int threads = a.threads > 0 ? a.threads : omp_get_max_threads();
  engine::LoadOptions load;
  load.threads = threads;
  if (!a.run.weights.empty()) load.weights = parse_weight_format(a.run.weights, "--weights");
  load.activations = a.run.activation_choice();
  std::shared_ptr<const engine::Model> model;
  engine::PositionMethod positions;
  std::string shape;
  if (!a.model_dir.empty()) {
    nn::HfEngineCheckpoint c = nn::load_hf_engine(a.model_dir, load);
    model = c.model;
    positions = nn::engine_positions(c.spec.config.resolved_encoding());
    shape = a.model_dir + " (" + c.spec.model_type + ")";
  } else {
    engine::Architecture arch;  // Qwen2-style: RMSNorm, SwiGLU, q/k/v biases, tied head
    arch.vocab_size = a.vocab, arch.d_model = a.hidden, arch.n_layers = a.layers, arch.n_heads = a.heads;
    arch.n_kv_heads = a.kv_heads, arch.head_dim = a.hidden / a.heads, arch.d_ff = a.ff;
    arch.qkv_bias = true, arch.tie_embeddings = true;
    arch.validate();
    // Stored as bf16 (as such checkpoints are published) unless --weights names another storage.
    const DType stored = load.weights == WeightFormat::F32 ? DType::F32
                         : load.weights == WeightFormat::F16 ? DType::F16 : DType::BF16;
    auto w = std::make_shared<RandomWeights>(arch, stored, threads);
    model = engine::Model::load(arch, [w](const std::string& name) { return w->tensors.at(name); }, load, w);
    positions.rope.head_dim = int(arch.head_dim), positions.rope.base = 1e6;
    shape = "random weights";
  }
  const engine::Architecture& arch = model->arch();
  check(a.prompt + a.decode <= kMaxSequenceLength, "--prompt + --decode", a.prompt + a.decode, "<= 2^20");
  engine::SessionOptions so;
  so.capacity = a.prompt + a.decode + 1, so.positions = positions;
  a.run.set_kv_cache(so);
  so.threads = threads, so.prefill_chunk = a.prefill_chunk;
  std::mt19937_64 rng(1);
  std::vector<int64_t> ids(size_t(so.capacity)), pos(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(rng() % uint64_t(arch.vocab_size)), pos[i] = int64_t(i);
  std::vector<float> hidden(size_t(a.prompt * arch.d_model)), logits(size_t(arch.vocab_size));
  std::vector<double> prefill_tps, decode_tps;
  std::vector<int64_t> greedy;
  for (int t = 0; t < a.trials; ++t) {
    engine::Session s(model, so);
    auto t0 = Clock::now();
    s.forward(ids.data(), pos.data(), a.prompt, hidden.data());
    s.logits(hidden.data() + (a.prompt - 1) * arch.d_model, 1, logits.data());
    prefill_tps.push_back(double(a.prompt) / since(t0));
    greedy.clear();
    t0 = Clock::now();
    for (int i = 0; i < a.decode; ++i) {  // greedy: each step feeds the argmax of the last
      const int64_t next = std::max_element(logits.begin(), logits.end()) - logits.begin();
      greedy.push_back(next);
      s.forward(&next, pos.data() + a.prompt + i, 1, hidden.data());
      s.logits(hidden.data(), 1, logits.data());
    }
    decode_tps.push_back(double(a.decode) / since(t0));
  }
  const int64_t rss = peak_rss_bytes();  // before the probe's own buffer
  const int64_t read = model->weight_bytes_per_token();
  const double probe = lab::read_bandwidth(std::clamp<int64_t>(read, int64_t(256) << 20, int64_t(1) << 30), threads);
  const double rate = double(read) * median(decode_tps);
  if (a.json) {
    nlohmann::json j{{"engine", "engine"}, {"shape", shape}, {"weights", weight_format_name(model->matrix_format())},
                     {"kv_dtype", a.run.kv_dtype}, {"activations", activation_format_name(model->activations())},
                     {"bf16_dot_products", linear_uses_bf16_dot()}, {"q8_products", linear_q8_products()},
                     {"cpu", lab::cpu_description()}, {"d_model", arch.d_model}, {"n_layers", arch.n_layers},
                     {"vocab", arch.vocab_size}, {"prompt", a.prompt}, {"decode", a.decode}, {"trials", a.trials},
                     {"threads", threads}, {"prefill_chunk", a.prefill_chunk},
                     {"prefill_tokens_per_s", median(prefill_tps)},
                     {"decode_tokens_per_s", median(decode_tps)}, {"prefill_trials", prefill_tps},
                     {"decode_trials", decode_tps}, {"weight_bytes_read_per_decode_token", read},
                     {"weight_read_bytes_per_s", rate}, {"read_probe_bytes_per_s", probe},
                     {"weight_read_over_probe", rate / probe}, {"peak_rss_bytes", rss}, {"greedy_tokens", greedy}};
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("cpu: %s\n", lab::cpu_description().c_str());
  std::printf("engine, %s: d_model %lld, %lld layers, %lld heads (%lld kv), d_ff %lld, vocab %lld; weights %s, "
              "kv cache %s, activations %s%s, %d threads\n",
              shape.c_str(), (long long)arch.d_model, (long long)arch.n_layers, (long long)arch.n_heads,
              (long long)arch.n_kv_heads, (long long)arch.d_ff, (long long)arch.vocab_size,
              weight_format_name(model->matrix_format()), a.run.kv_dtype.c_str(),
              activation_format_name(model->activations()),
              model->activations() == ActivationFormat::BF16
                  ? (linear_uses_bf16_dot() ? " (bf16 dot products)" : " (no bf16 dot products on this CPU)")
              : model->activations() == ActivationFormat::Q8
                  ? (std::string(" (") + linear_q8_products() + ")").c_str()
                  : "",
              threads);
  std::printf("prompt %d tokens: %.1f tok/s | decode %d tokens: %.2f tok/s (median of %d trials)\n", a.prompt,
              median(prefill_tps), a.decode, median(decode_tps), a.trials);
  std::printf("decode reads %.1f MB of weights per token: %.2f GB/s = %.0f%% of the read probe (%.2f GB/s) | peak "
              "RSS %.2f GB\n",
              double(read) / 1e6, rate / 1e9, 100 * rate / probe, probe / 1e9, double(rss) / 1e9);
}

void run(const BenchCheckpointArgs& a) {
  for (const CLI::Option* flag : a.shape_flags)
    check_given_only_with(flag, a.model_dir.empty(),
                          "without --model (it shapes the random model; a checkpoint's shape is its config.json's)");
  a.run.validate();
  if (a.run.engine == "engine") return run_engine(a);
#ifdef ROTARY_HAVE_TORCH
  check(!a.prefill_chunk_flag || a.prefill_chunk_flag->count() == 0, "--prefill-chunk", a.prefill_chunk,
        "unset with --engine torch (the nn model runs a prompt whole)");
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
    cfg.normalization = nn::NormKind::RmsNorm;
    cfg.norm_eps = 1e-6;
    cfg.mlp = nn::MlpKind::SwiGlu;
    cfg.qkv_bias = true;
    cfg.out_bias = cfg.mlp_bias = false;
    cfg.tie_embeddings = true;
    cfg.encoding.kind = nn::EncodingKind::Rope;
    cfg.encoding.rope.base = 1e6;
    torch::manual_seed(0);
    fused.model = nn::Transformer(cfg);
    shape = "random weights";
  }
  plain.model = nn::on_attention_path(fused.model, false);
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
#endif  // (without libtorch, a.run.validate() refused --engine torch)
}

const CommandRegistrar kRegister([](CLI::App& root) {
  auto args = std::make_shared<BenchCheckpointArgs>();
  CLI::App& bench = subcommand_group(root, "bench", "benchmarks");
  CLI::App* sub = bench.add_subcommand(
      "checkpoint", "prefill and decode tokens/s of a Llama-family model (a checkpoint, or random weights in "
                    "Qwen2.5-0.5B's shape) on the torch-free engine (weight-read rate vs a read probe, peak RSS), or "
                    "--engine torch: fused rotary ops vs plain torch ops");
  sub->add_option("--model", args->model_dir, "a Hugging Face model directory (default: random weights)")
      ->check(non_empty("a Hugging Face model directory (leave --model out for random weights)"));
  args->shape_flags = {
      sub->add_option("--hidden", args->hidden, "random model: hidden size")->transform(integer_in(16, 1 << 15)),
      sub->add_option("--layers", args->layers, "random model: layers")->transform(integer_in(1, 256)),
      sub->add_option("--heads", args->heads, "random model: attention heads")->transform(integer_in(1, 256)),
      sub->add_option("--kv-heads", args->kv_heads, "random model: key/value heads")->transform(integer_in(1, 256)),
      sub->add_option("--ff", args->ff, "random model: MLP width")->transform(integer_in(1, 1 << 18)),
      sub->add_option("--vocab", args->vocab, "random model: vocabulary")->transform(integer_in(2, 1 << 20))};
  sub->add_option("--prompt", args->prompt, "prompt tokens (prefill)")->transform(integer_in(1, 1 << 20));
  sub->add_option("--decode", args->decode, "generated tokens timed")->transform(integer_in(1, 1 << 16));
  sub->add_option("--trials", args->trials, "trials per method (median reported)")->transform(integer_in(1, 1000));
  sub->add_option("--threads", args->threads, "torch / OpenMP threads (0 = all cores)")->transform(integer_in(0, kMaxThreads));
  add_checkpoint_run_flags(*sub, args->run);  // random weights are stored as bf16, or as --weights says
  args->prefill_chunk_flag = sub->add_option("--prefill-chunk", args->prefill_chunk,
                  "engine: tokens per chunk of a prompt's work in each layer (memory against speed; default 512)")
      ->transform(integer_in(1, 1 << 20));
  sub->add_flag("--json", args->json, "print JSON");
  sub->callback([args] { run(*args); });
});

}  // namespace
}  // namespace rotary::cli
