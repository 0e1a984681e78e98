// `rotary bench attention`: the fused attention kernels (RoPE, ReRoPE, Leaky ReRoPE; forward and backward)
// beside the seed's materialised ReRoPE composition and an sgemm of the same FLOP count, fp32, causal, batch 1.
//
// Default shapes: N in {1024, 4096} tokens, Hq = 8 heads, D = 64, MHA (Hkv = 8) plus a GQA case (Hkv = 2);
// ReRoPE / Leaky window w = N/4, Leaky k = 16. Methods per N:
//   sgemm          H products C[N,N] = A[N,D] B[N,D]^T (OpenBLAS): 2 N^2 H D FLOPs, the causal attention count
//   sgemm_square   one square sgemm M x M x M with about the same FLOPs (M^3 = N^2 H D): the compute-bound
//                  ceiling (the N x N x D shape above spends much of its time writing the N^2 result)
//   rope/rerope/leaky       attention_forward (fused), MHA
//   materialised   the seed's ReRoPE: rotate q, k (rope_apply) and R(w) q, then per head two N x N score
//                  matrices (sgemm), select by i - j < w, causal softmax (scalar expf), P V (sgemm)
//   rope_bwd/rerope_bwd     attention_backward (fused), MHA
//   rope_gqa/rope_gqa_bwd   forward and backward with Hkv = 2
// The methods run round-robin, one call each per round, so drift on a shared machine hits them alike; medians
// over rounds are reported. GFLOP/s: forward 4 N^2 H D / 2 (causal), backward 2.5x that (five matrix products
// to the forward's two, as FlashAttention-2 counts). Scratch: the bytes the fused kernels allocate
// (attention_*_scratch_bytes, the size of their one allocation) and the buffers the composition allocates.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/statistics.h"
#include "cli/command.h"
#include "common/machine.h"
#include "rotary/attention.h"
#include "rotary/error.h"
#include "rotary/rope.h"
#include "rotary/rope_spec.h"

namespace rotary::cli {
namespace {

struct BenchAttentionArgs {
  std::vector<int64_t> sizes{1024, 4096};
  int64_t hq = 8, hkv_gqa = 2;
  int dim = 64;
  double leaky_k = 16;
  int rounds = 5;
  int threads = 0;
  bool json = false;
};

struct Method {
  std::string name;
  double flops = 0;
  int64_t scratch_bytes = 0;
  std::function<void()> step;
  std::vector<double> seconds;
  double median() const { return lab::median(seconds); }
  double min() const { return *std::min_element(seconds.begin(), seconds.end()); }
};

std::vector<float> uniform(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(n);
  for (float& e : x) e = u(rng);
  return x;
}

// The seed's ReRoPE: both N x N score matrices per head, materialised. q, k, v, o: [N, H, D] contiguous.
class Materialised {
 public:
  Materialised(int64_t N, int64_t H, int D, int64_t w, const RopeFreqs& f)
      : N_(N), H_(H), D_(D), w_(w), f_(f), qr_(size_t(N * H * D)), kr_(qr_.size()), qw_(qr_.size()),
        s1_(size_t(N * N)), s2_(size_t(N * N)), pos_(size_t(N)), posw_(size_t(N), w) {
    for (int64_t t = 0; t < N; ++t) pos_[size_t(t)] = t;
  }
  int64_t bytes() const {
    return int64_t(sizeof(float) * (qr_.size() + kr_.size() + qw_.size() + s1_.size() + s2_.size()) +
                   sizeof(int64_t) * (pos_.size() + posw_.size()));
  }
  void run(const float* q, const float* k, const float* v, float* o, int threads) {
    const int64_t N = N_, H = H_, D = D_, ld = H * D;
    const HeadsView qv{const_cast<float*>(q), H, ld, D}, kv{const_cast<float*>(k), H, ld, D};
    RopeParams rp;
    rp.tokens = N;
    rp.positions = pos_.data();
    rp.q_in = qv, rp.q_out = {qr_.data(), H, ld, D};
    rp.k_in = kv, rp.k_out = {kr_.data(), H, ld, D};
    rope_apply(f_, rp);  // R(i) q_i, R(j) k_j
    RopeParams rw;
    rw.tokens = N;
    rw.positions = posw_.data();
    rw.q_in = qv, rw.q_out = {qw_.data(), H, ld, D};
    rope_apply(f_, rw);  // R(w) q_i; keys beyond the window stay un-rotated
    const float scale = 1.0f / std::sqrt(float(D));
    for (int64_t h = 0; h < H; ++h) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(N), int(N), int(D), scale, qr_.data() + h * D, int(ld),
                  kr_.data() + h * D, int(ld), 0.0f, s1_.data(), int(N));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(N), int(N), int(D), scale, qw_.data() + h * D, int(ld),
                  k + h * D, int(ld), 0.0f, s2_.data(), int(N));
#pragma omp parallel for schedule(dynamic, 16) num_threads(threads)
      for (int64_t i = 0; i < N; ++i) {
        float* s = s1_.data() + i * N;
        const float* s2 = s2_.data() + i * N;
        float m = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          s[j] = i - j < w_ ? s[j] : s2[j];
          m = std::max(m, s[j]);
        }
        float l = 0;
        for (int64_t j = 0; j <= i; ++j) l += (s[j] = std::exp(s[j] - m));
        const float inv = 1.0f / l;
        for (int64_t j = 0; j <= i; ++j) s[j] *= inv;
        for (int64_t j = i + 1; j < N; ++j) s[j] = 0;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(N), int(D), int(N), 1.0f, s1_.data(), int(N),
                  v + h * D, int(ld), 0.0f, o + h * D, int(ld));
    }
  }

 private:
  int64_t N_, H_;
  int D_;
  int64_t w_;
  const RopeFreqs& f_;
  std::vector<float> qr_, kr_, qw_, s1_, s2_;
  std::vector<int64_t> pos_, posw_;
};

struct SizeResult {
  int64_t N = 0;
  std::vector<Method> methods;
  double rel_rms_materialised = 0;
  const Method& get(const std::string& name) const {
    for (const Method& m : methods)
      if (m.name == name) return m;
    throw Error("no method " + name);
  }
  // by_min: from the fastest round instead of the median (less sensitive to other load on a shared machine).
  double gflops(const std::string& name, bool by_min = false) const {
    return get(name).flops / (by_min ? get(name).min() : get(name).median()) * 1e-9;
  }
  double ratio(const std::string& a, const std::string& b, bool by_min = false) const {
    return by_min ? get(a).min() / get(b).min() : get(a).median() / get(b).median();
  }
};

SizeResult bench_size(const BenchAttentionArgs& a, int64_t N, int threads) {
  const int64_t H = a.hq, G = a.hkv_gqa;
  const int D = a.dim;
  const int64_t w = std::max<int64_t>(1, N / 4);
  RopeSpec spec;
  spec.head_dim = D;
  const RopeFreqs freqs = spec.freqs();
  const size_t nq = size_t(N * H * D), ng = size_t(N * G * D);
  std::vector<float> q = uniform(nq, 1), k = uniform(nq, 2), v = uniform(nq, 3), dout = uniform(nq, 4);
  std::vector<float> kg = uniform(ng, 5), vg = uniform(ng, 6);
  std::vector<float> o(nq), o_ref(nq), dq(nq), dk(nq), dv(nq), og(nq), dkg(ng), dvg(ng);
  std::vector<float> lse(size_t(N * H)), lseg(lse.size());

  auto params = [&](PositionMode mode, bool gqa) {
    AttentionParams p;
    p.tokens = N;
    p.head_dim = D;
    p.q = {q.data(), H, H * D, D};
    const int64_t hk = gqa ? G : H;
    p.k = {gqa ? kg.data() : k.data(), hk, hk * D, D};
    p.v = {gqa ? vg.data() : v.data(), hk, hk * D, D};
    p.o = {gqa ? og.data() : o.data(), H, H * D, D};
    p.lse = gqa ? lseg.data() : lse.data();
    p.causal = true;
    p.pos.mode = mode;
    p.pos.freqs = &freqs;
    p.pos.window = w;
    p.pos.leaky_k = a.leaky_k;
    return p;
  };
  auto grad = [&](PositionMode mode, bool gqa) {
    AttentionGradParams g;
    g.fwd = params(mode, gqa);
    g.dout = {dout.data(), H, H * D, D};
    g.dq = {dq.data(), H, H * D, D};
    const int64_t hk = gqa ? G : H;
    g.dk = {gqa ? dkg.data() : dk.data(), hk, hk * D, D};
    g.dv = {gqa ? dvg.data() : dv.data(), hk, hk * D, D};
    return g;
  };
  const AttentionParams rope = params(PositionMode::Rope, false), rerope = params(PositionMode::Rerope, false),
                        leaky = params(PositionMode::LeakyRerope, false), rope_g = params(PositionMode::Rope, true);
  const AttentionGradParams rope_b = grad(PositionMode::Rope, false), rerope_b = grad(PositionMode::Rerope, false),
                            rope_gb = grad(PositionMode::Rope, true);
  // The backward needs o and lse of its forward.
  attention_forward(rope_gb.fwd);

  const double fwd_flops = 4.0 * double(N) * double(N) * double(H) * D / 2;
  std::vector<float> c(size_t(N * N));
  const int M = int(std::lround(std::cbrt(double(N) * double(N) * double(H) * D)));
  std::vector<float> sa = uniform(size_t(M) * size_t(M), 7), sb = uniform(size_t(M) * size_t(M), 8),
                     sc(size_t(M) * size_t(M));
  Materialised mat(N, H, D, w, freqs);

  SizeResult r;
  r.N = N;
  auto add = [&](std::string name, double flops, int64_t bytes, std::function<void()> fn) {
    r.methods.push_back({std::move(name), flops, bytes, std::move(fn), {}});
  };
  add("sgemm", fwd_flops, int64_t(c.size() * sizeof(float)), [&] {
    for (int64_t h = 0; h < H; ++h)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(N), int(N), D, 1.0f, q.data() + h * D, int(H * D),
                  k.data() + h * D, int(H * D), 0.0f, c.data(), int(N));
  });
  add("sgemm_square", 2.0 * M * double(M) * M, int64_t(3 * sa.size() * sizeof(float)), [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, M, M, 1.0f, sa.data(), M, sb.data(), M, 0.0f, sc.data(),
                M);
  });
  add("rope", fwd_flops, attention_forward_scratch_bytes(rope, threads), [&] { attention_forward(rope); });
  add("rerope", fwd_flops, attention_forward_scratch_bytes(rerope, threads), [&] { attention_forward(rerope); });
  add("leaky", fwd_flops, attention_forward_scratch_bytes(leaky, threads), [&] { attention_forward(leaky); });
  add("materialised", fwd_flops, mat.bytes(), [&] { mat.run(q.data(), k.data(), v.data(), o_ref.data(), threads); });
  add("rope_bwd", 2.5 * fwd_flops, attention_backward_scratch_bytes(rope_b, threads), [&] {
    attention_backward(rope_b);
  });
  add("rerope_bwd", 2.5 * fwd_flops, attention_backward_scratch_bytes(rerope_b, threads), [&] {
    attention_backward(rerope_b);
  });
  add("rope_gqa", fwd_flops, attention_forward_scratch_bytes(rope_g, threads), [&] { attention_forward(rope_g); });
  add("rope_gqa_bwd", 2.5 * fwd_flops, attention_backward_scratch_bytes(rope_gb, threads), [&] {
    attention_backward(rope_gb);
  });

  // The composition and the fused ReRoPE compute the same thing: report how far apart they are.
  attention_forward(rerope);
  mat.run(q.data(), k.data(), v.data(), o_ref.data(), threads);
  double num = 0, den = 0;
  for (size_t i = 0; i < nq; ++i)
    num += double(o[i] - o_ref[i]) * (o[i] - o_ref[i]), den += double(o_ref[i]) * o_ref[i];
  r.rel_rms_materialised = std::sqrt(num / den);

  using clock = std::chrono::steady_clock;
  for (int round = 0; round < a.rounds; ++round)
    for (Method& m : r.methods) {
      // The backward reads the o and lse of its own forward; the MHA forwards rewrite them with their mode.
      if (m.name == "rope_bwd") attention_forward(rope);
      if (m.name == "rerope_bwd") attention_forward(rerope);
      const auto t0 = clock::now();
      m.step();
      m.seconds.push_back(std::chrono::duration<double>(clock::now() - t0).count());
    }
  return r;
}

void run_bench_attention(const BenchAttentionArgs& a) {
  check(!a.sizes.empty(), "--sizes", "empty", "one or more token counts");
  for (int64_t n : a.sizes) check(n >= 16, "--sizes", n, ">= 16");
  check(a.hq >= 1 && a.hkv_gqa >= 1 && a.hq % a.hkv_gqa == 0, "--hkv-gqa", a.hkv_gqa, "a divisor of --hq");
  check(a.dim >= 16 && a.dim <= 256, "--dim", a.dim, "16..256");
  check(a.rounds >= 1, "--rounds", a.rounds, ">= 1");
  check(a.threads >= 0, "--threads", a.threads, ">= 0 (0: OpenMP default)");
  const int threads = a.threads > 0 ? a.threads : omp_get_max_threads();
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);

  std::vector<SizeResult> results;
  for (int64_t n : a.sizes) {
    results.push_back(bench_size(a, n, threads));
    // Warm-up rounds are not separate: the first round's page faults show in min vs median.
  }
  auto ratios = [](const SizeResult& r, bool by_min) {
    return std::vector<std::pair<std::string, double>>{
        {"rope_gflops_over_sgemm", r.gflops("rope", by_min) / r.gflops("sgemm", by_min)},
        {"rope_gflops_over_sgemm_square", r.gflops("rope", by_min) / r.gflops("sgemm_square", by_min)},
        {"rerope_over_rope_time", r.ratio("rerope", "rope", by_min)},
        {"leaky_over_rope_time", r.ratio("leaky", "rope", by_min)},
        {"rope_bwd_over_fwd_time", r.ratio("rope_bwd", "rope", by_min)},
        {"rerope_bwd_over_fwd_time", r.ratio("rerope_bwd", "rerope", by_min)},
        {"rope_gqa_bwd_over_fwd_time", r.ratio("rope_gqa_bwd", "rope_gqa", by_min)},
        {"materialised_over_rerope_time", r.ratio("materialised", "rerope", by_min)},
    };
  };
  if (a.json) {
    nlohmann::json j;
    j["cpu"] = lab::cpu_description();
    j["threads"] = threads;
    j["hq"] = a.hq, j["hkv_gqa"] = a.hkv_gqa, j["head_dim"] = a.dim, j["leaky_k"] = a.leaky_k;
    j["rounds"] = a.rounds, j["dtype"] = "f32", j["causal"] = true, j["batch"] = 1;
    for (const SizeResult& r : results) {
      nlohmann::json s;
      s["tokens"] = r.N, s["window"] = std::max<int64_t>(1, r.N / 4);
      s["materialised_vs_rerope_rel_rms"] = r.rel_rms_materialised;
      for (const Method& m : r.methods)
        s["methods"].push_back({{"name", m.name}, {"median_ms", m.median() * 1e3}, {"min_ms", m.min() * 1e3},
                                {"gflops", m.flops / m.median() * 1e-9}, {"scratch_bytes", m.scratch_bytes}});
      for (const auto& [k, v] : ratios(r, false)) s["ratios_median"][k] = v;
      for (const auto& [k, v] : ratios(r, true)) s["ratios_min"][k] = v;
      j["sizes"].push_back(s);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("attention, f32, causal, batch 1: Hq %lld, D %d (GQA case Hkv %lld); w = N/4, leaky k %g\n",
              (long long)a.hq, a.dim, (long long)a.hkv_gqa, a.leaky_k);
  std::printf("cpu: %s, threads %d, %d rounds (median)\n", lab::cpu_description().c_str(), threads, a.rounds);
  for (const SizeResult& r : results) {
    std::printf("\nN = %lld\n%-14s %11s %11s %9s %12s\n", (long long)r.N, "method", "median ms", "min ms", "GFLOP/s",
                "scratch MB");
    for (const Method& m : r.methods)
      std::printf("%-14s %11.2f %11.2f %9.1f %12.1f\n", m.name.c_str(), m.median() * 1e3, m.min() * 1e3,
                  m.flops / m.median() * 1e-9, double(m.scratch_bytes) / 1e6);
    const auto rs = ratios(r, false), rm = ratios(r, true);
    const char* goals[] = {"goal >= 0.5", "goal >= 0.5", "goal <= 1.15", "goal <= 1.2", "goal <= 3", "goal <= 3",
                           "goal <= 3", ""};
    std::printf("%-30s %8s %8s\n", "ratio", "median", "min");
    for (size_t i = 0; i < rs.size(); ++i)
      std::printf("%-30s %8.3f %8.3f  %s\n", rs[i].first.c_str(), rs[i].second, rm[i].second, goals[i]);
    std::printf("materialised vs fused rerope output: relative rms difference %.2e\n", r.rel_rms_materialised);
  }
}

const CommandRegistrar kRegisterBenchAttention([](CLI::App& root) {
  auto args = std::make_shared<BenchAttentionArgs>();
  CLI::App& bench = subcommand_group(root, "bench", "benchmarks");
  CLI::App* cmd = bench.add_subcommand(
      "attention", "fused f32 causal attention (RoPE, ReRoPE, Leaky ReRoPE; forward, backward, GQA) beside the "
                   "seed's materialised two-matrix ReRoPE and an sgemm of the same FLOP count");
  cmd->add_option("--sizes", args->sizes, "token counts N (default 1024 4096)")->transform(integer_in(1, 1 << 24));
  cmd->add_option("--hq", args->hq, "query heads (default 8)")->transform(integer_in(1, 4096));
  cmd->add_option("--hkv-gqa", args->hkv_gqa, "kv heads of the GQA case (default 2)")->transform(integer_in(1, 4096));
  cmd->add_option("--dim", args->dim, "head dim (default 64)")->transform(integer_in(1, 4096));
  cmd->add_option("--leaky-k", args->leaky_k, "Leaky ReRoPE k (default 16)")->transform(finite_in(1, 1e9));
  cmd->add_option("--rounds", args->rounds, "timed rounds, one call of every method each (default 5)")->transform(integer_in(1, 100000));
  cmd->add_option("--threads", args->threads, "threads for every method, OpenBLAS included (0: OpenMP default)")->transform(integer_in(0, kMaxThreads));
  cmd->add_flag("--json", args->json, "print machine-readable results");
  cmd->callback([args] { run_bench_attention(*args); });
});

}  // namespace
}  // namespace rotary::cli
