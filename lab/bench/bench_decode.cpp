// `rotary bench decode`: time of one decode step over a long KV cache (fp32), per position mode, beside the
// seed's ReRoPE decode (re-rotate the whole cache every step) and a memcpy of the cache's bytes.
//
// Default shape: a Llama-3-8B-like layer, Hq = 32 query heads, Hkv = 8 kv heads (GQA 4:1), D = 128, one sequence
// with a 32768-token cache; ReRoPE window w = 4096, Leaky k = 16. Methods:
//   rope     attention_decode on a Rope cache (keys stored rotated)
//   rerope   attention_decode on a Rerope cache (un-rotated keys; <= w near keys rotated from a table)
//   leaky    attention_decode on a LeakyRerope cache (far keys from the R(pos/k) copy)
//   rerotate attention_decode_rerotate_baseline: every key re-rotated into a buffer, then plain attention
//                 (the seed's algorithm done well: one fused, threaded pass with a cos/sin table)
//   rerotate_torch the seed's own PyTorch step (lab/bench/decode_torch_baseline.h): gathered cos/sin, rotate_half,
//                 repeat_kv, matmul-softmax-matmul; when built with libtorch (--no-torch skips it)
//   rope_bf16, rope_q8, rerope_q8   the same steps on caches stored in bf16 and in q8 blocks (KvStorage::Q8:
//                 int8 with a float scale per 32, 1.125 bytes a feature): what a smaller cache buys per step
//   memcpy   a copy of the keys + values bytes of one cache (same threads): the bandwidth ceiling
// The methods run round-robin, one step each per round, so drift on a shared machine hits them alike; the
// median over rounds is reported. GB/s = the cache bytes a step must read (keys + values of every token and kv
// head, in the method's storage: f32 for all but the bf16 / q8 ones) / time, so the column compares with memcpy.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/statistics.h"
#include "cli/command.h"
#include "common/machine.h"
#include "rotary/error.h"
#include "rotary/kv_cache.h"
#include "rotary/rope_spec.h"

#ifdef ROTARY_HAVE_TORCH
#include "bench/decode_torch_baseline.h"
#endif

namespace rotary::cli {
namespace {

struct BenchDecodeArgs {
  int64_t context = 32768;
  int64_t hq = 32, hkv = 8;
  int dim = 128;
  int64_t window = 4096;
  double leaky_k = 16;
  int rounds = 41;
  int threads = 0;
  int64_t split_keys = 0;
  bool json = false;
  bool no_torch = false;
};

void parallel_memcpy(void* dst, const void* src, size_t bytes, int threads) {
#pragma omp parallel num_threads(threads)
  {
    const size_t n = size_t(omp_get_num_threads()), id = size_t(omp_get_thread_num());
    const size_t lo = bytes * id / n / 64 * 64, hi = id + 1 == n ? bytes : bytes * (id + 1) / n / 64 * 64;
    std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, hi - lo);
  }
}

struct Method {
  std::string name;
  std::function<void()> step;
  double bytes = 0;  // keys + values the step reads: 0 means the f32 cache's
  std::vector<double> seconds;
  double median() const { return lab::median(seconds); }
  double min() const { return *std::min_element(seconds.begin(), seconds.end()); }
};

void run_bench_decode(const BenchDecodeArgs& a) {
  check(a.context >= 1, "--context", a.context, ">= 1");
  check(a.hkv >= 1 && a.hq >= a.hkv && a.hq % a.hkv == 0, "--hq", a.hq, "a multiple of --hkv");
  check(a.rounds >= 1, "--rounds", a.rounds, ">= 1");
  check(a.threads >= 0, "--threads", a.threads, ">= 0 (0: OpenMP default)");
  const int threads = a.threads > 0 ? a.threads : omp_get_max_threads();
  const int64_t N = a.context, Hq = a.hq, Hkv = a.hkv;
  const int D = a.dim;

  RopeSpec spec;
  spec.head_dim = D;
  spec.base = 10000.0;
  const RopeFreqs freqs = spec.freqs();
  std::vector<float> k(size_t(N * Hkv * D)), v(k.size()), q(size_t(Hq * D)), o(q.size());
  {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1, 1);
    for (float& x : k) x = u(rng);
    for (float& x : v) x = u(rng);
    for (float& x : q) x = u(rng);
  }
  std::vector<int64_t> pos(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) pos[size_t(t)] = t;

  auto make_cache = [&](PositionMode mode, DType dtype = DType::F32, KvStorage storage = KvStorage::Dtype) {
    PositionParams pp;
    pp.mode = mode;
    pp.freqs = &freqs;
    pp.window = a.window;
    pp.leaky_k = a.leaky_k;
    KvCacheConfig config{N, Hkv, D, dtype, pp};
    config.storage = storage;
    auto c = std::make_unique<KvCache>(config);
    if (dtype == DType::BF16) {
      std::vector<uint16_t> kb(k.size()), vb(v.size());
      for (size_t i = 0; i < k.size(); ++i) kb[i] = float_to_bf16(k[i]), vb[i] = float_to_bf16(v[i]);
      c->append(N, {kb.data(), Hkv, Hkv * D, D}, {vb.data(), Hkv, Hkv * D, D}, pos.data());
    } else {
      c->append(N, {k.data(), Hkv, Hkv * D, D}, {v.data(), Hkv, Hkv * D, D}, pos.data());
    }
    return c;
  };
  auto rope = make_cache(PositionMode::Rope), rerope = make_cache(PositionMode::Rerope),
       leaky = make_cache(PositionMode::LeakyRerope);
  const size_t cache_bytes = size_t(2 * N * Hkv * rope->layout().row_stride) * sizeof(float);  // keys + values
  std::vector<char> src(cache_bytes, 1), dst(cache_bytes, 2);

  DecodeParams p;
  p.q = {q.data(), Hq, Hq * D, D};
  p.o = {o.data(), Hq, Hq * D, D};
  p.threads = threads;
  p.split_keys = a.split_keys;
  // The smaller caches: bf16 (q and o in bf16 too) and q8 blocks (q and o f32).
  auto rope_bf16 = make_cache(PositionMode::Rope, DType::BF16);
  auto rope_q8 = make_cache(PositionMode::Rope, DType::F32, KvStorage::Q8);
  auto rerope_q8 = make_cache(PositionMode::Rerope, DType::F32, KvStorage::Q8);
  std::vector<uint16_t> q_bf16(q.size()), o_bf16(o.size());
  for (size_t i = 0; i < q.size(); ++i) q_bf16[i] = float_to_bf16(q[i]);
  DecodeParams p_bf16 = p;
  p_bf16.q.data = q_bf16.data(), p_bf16.o.data = o_bf16.data();
  const double bf16_bytes = double(cache_bytes) / 2, q8_rs = double(rope_q8->layout().row_stride);
  const double q8_bytes = 2 * double(N * Hkv) * (q8_rs + q8_rs / kQ8Block * 4);  // quants and a float a block

  std::vector<float> scratch;
  std::vector<Method> methods;
  const auto add = [&](std::string name, std::function<void()> step, double bytes = 0) {
    methods.push_back(Method{std::move(name), std::move(step), bytes, {}});
  };
  add("rope", [&] { attention_decode(*rope, p); });
  add("rerope", [&] { attention_decode(*rerope, p); });
  add("leaky", [&] { attention_decode(*leaky, p); });
  add("rerotate", [&] { attention_decode_rerotate_baseline(*rerope, p, scratch); });
  add("rope_bf16", [&] { attention_decode(*rope_bf16, p_bf16); }, bf16_bytes);
  add("rope_q8", [&] { attention_decode(*rope_q8, p); }, q8_bytes);
  add("rerope_q8", [&] { attention_decode(*rerope_q8, p); }, q8_bytes);
  add("memcpy", [&] { parallel_memcpy(dst.data(), src.data(), cache_bytes, threads); });
  double rel_rms_torch = -1;  // < 0: not measured
#ifdef ROTARY_HAVE_TORCH
  std::function<void(float*)> torch_step;
  std::vector<float> o_torch(o.size());
  if (!a.no_torch) {
    bench::TorchRerotateCase tc;
    tc.context = N, tc.hq = Hq, tc.hkv = Hkv, tc.dim = D, tc.window = a.window;
    tc.k = k.data(), tc.v = v.data(), tc.q = q.data(), tc.inv_freq = freqs.inv_freq.data(), tc.threads = threads;
    torch_step = bench::make_torch_rerope_decode(tc);
    add("rerotate_torch", [&] { torch_step(o_torch.data()); });
  }
#endif

  // The re-rotating baseline and the fast ReRoPE step compute the same thing: report how far apart they are.
  std::vector<float> o_fast(o.size());
  attention_decode(*rerope, p);
  o_fast = o;
  attention_decode_rerotate_baseline(*rerope, p, scratch);
  double num = 0, den = 0;
  for (size_t i = 0; i < o.size(); ++i)
    num += double(o[i] - o_fast[i]) * (o[i] - o_fast[i]), den += double(o[i]) * o[i];
  const double rel_rms = std::sqrt(num / den);
#ifdef ROTARY_HAVE_TORCH
  if (torch_step) {
    torch_step(o_torch.data());
    num = 0;
    for (size_t i = 0; i < o.size(); ++i) num += double(o_torch[i] - o_fast[i]) * (o_torch[i] - o_fast[i]);
    rel_rms_torch = std::sqrt(num / den);
  }
#endif

  using clock = std::chrono::steady_clock;
  for (Method& m : methods) m.step();  // warm-up (scratch allocation, page faults)
  for (int r = 0; r < a.rounds; ++r)
    for (Method& m : methods) {
      const auto t0 = clock::now();
      m.step();
      m.seconds.push_back(std::chrono::duration<double>(clock::now() - t0).count());
    }
  auto med = [&](const char* name) {
    for (const Method& m : methods)
      if (m.name == name) return m.median();
    return 0.0;
  };
  auto gbps = [&](const Method& m) { return (m.bytes > 0 ? m.bytes : double(cache_bytes)) * 1e-9 / m.median(); };

  if (a.json) {
    nlohmann::json j;
    j["cpu"] = lab::cpu_description();
    j["threads"] = threads;
    j["context"] = N, j["hq"] = Hq, j["hkv"] = Hkv, j["head_dim"] = D, j["window"] = a.window;
    j["leaky_k"] = a.leaky_k, j["rounds"] = a.rounds, j["dtype"] = "f32", j["cache_bytes"] = cache_bytes;
    j["rerotate_vs_rerope_rel_rms"] = rel_rms;
    for (const Method& m : methods)
      j["methods"].push_back(
          {{"name", m.name}, {"median_ms", m.median() * 1e3}, {"min_ms", m.min() * 1e3}, {"gbps", gbps(m)}});
    j["ratio_rerope_over_rope"] = med("rerope") / med("rope");
    j["ratio_leaky_over_rope"] = med("leaky") / med("rope");
    j["ratio_rerotate_over_rerope"] = med("rerotate") / med("rerope");
    j["ratio_rope_q8_over_rope_bf16"] = med("rope_q8") / med("rope_bf16");
    j["ratio_rope_q8_over_rope"] = med("rope_q8") / med("rope");
    j["q8_cache_bytes"] = q8_bytes;
    if (rel_rms_torch >= 0) {
      j["ratio_rerotate_torch_over_rerope"] = med("rerotate_torch") / med("rerope");
      j["rerotate_torch_vs_rerope_rel_rms"] = rel_rms_torch;
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("decode step, f32, one sequence: context %lld, Hq %lld, Hkv %lld, D %d, w %lld, leaky k %g\n",
              (long long)N, (long long)Hq, (long long)Hkv, D, (long long)a.window, a.leaky_k);
  std::printf("cpu: %s, threads %d, %d rounds; cache keys+values %.1f MB\n", lab::cpu_description().c_str(), threads,
              a.rounds, double(cache_bytes) / 1e6);
  std::printf("%-15s %11s %11s %9s\n", "method", "median ms", "min ms", "GB/s");
  for (const Method& m : methods)
    std::printf("%-15s %11.3f %11.3f %9.2f\n", m.name.c_str(), m.median() * 1e3, m.min() * 1e3, gbps(m));
  std::printf("rerope / rope     %.3f  (goal <= 1.1)\n", med("rerope") / med("rope"));
  std::printf("leaky / rope      %.3f\n", med("leaky") / med("rope"));
  std::printf("rerotate / rerope %.3f  (goal >= 3)\n", med("rerotate") / med("rerope"));
  std::printf("rope / memcpy     %.3f\n", med("rope") / med("memcpy"));
  std::printf("rope_q8 / rope_bf16 %.3f  (cache %.1f MB / %.1f MB)\n", med("rope_q8") / med("rope_bf16"), q8_bytes / 1e6,
              bf16_bytes / 1e6);
  if (rel_rms_torch >= 0)
    std::printf("rerotate_torch / rerope %.3f  (goal >= 3; the seed's own code)\n", med("rerotate_torch") / med("rerope"));
  std::printf("rerotate vs rerope output: relative rms difference %.2e\n", rel_rms);
  if (rel_rms_torch >= 0) std::printf("rerotate_torch vs rerope output: relative rms difference %.2e\n", rel_rms_torch);
}

const CommandRegistrar kRegisterBenchDecode([](CLI::App& root) {
  auto args = std::make_shared<BenchDecodeArgs>();
  CLI::App& bench = subcommand_group(root, "bench", "benchmarks");
  CLI::App* cmd =
      bench.add_subcommand("decode",
                           "time of one decode step over a long f32 KV cache: RoPE, ReRoPE, Leaky ReRoPE, the seed's "
                           "re-rotate-the-cache ReRoPE step, caches in bf16 and q8, and a memcpy of the cache bytes");
  cmd->add_option("--context", args->context, "cached tokens (default 32768)")->transform(integer_in(1, int64_t{1} << 32));
  cmd->add_option("--hq", args->hq, "query heads (default 32)")->transform(integer_in(1, 4096));
  cmd->add_option("--hkv", args->hkv, "kv heads (default 8)")->transform(integer_in(1, 4096));
  cmd->add_option("--dim", args->dim, "head dim (default 128)")->transform(integer_in(1, 4096));
  cmd->add_option("--window", args->window, "ReRoPE / Leaky window w (default 4096)")->transform(integer_in(1, int64_t{1} << 32));
  cmd->add_option("--leaky-k", args->leaky_k, "Leaky ReRoPE k (default 16)")->transform(finite_in(1, 1e9));
  cmd->add_option("--rounds", args->rounds, "timed rounds, one step of every method each (default 41)")->transform(integer_in(1, 100000));
  cmd->add_option("--threads", args->threads, "threads for every method (0: OpenMP default)")->transform(integer_in(0, kMaxThreads));
  cmd->add_option("--split-keys", args->split_keys, "keys per split-K chunk (0: automatic)")->transform(integer_in(0, int64_t{1} << 32));
  cmd->add_flag("--json", args->json, "print machine-readable results");
  cmd->add_flag("--no-torch", args->no_torch, "skip the seed's PyTorch step (rerotate_torch)");
  cmd->callback([args] { run_bench_decode(*args); });
});

}  // namespace
}  // namespace rotary::cli
