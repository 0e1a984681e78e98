// `rotary bench rope`: bandwidth of the fast rotation kernel beside its ceiling and the usual alternatives.
//
// For a prefill shape (4096 tokens x 32 heads x 128) and a decode shape (1 x 32 x 128), f32 and bf16, both pair
// layouts, q only, in place:
//   rope_apply - the fast kernel (Highway SIMD, OpenMP over tokens);
//   memcpy     - a copy of the same bytes (same threads): the bandwidth ceiling;
//   inplace_rw - every 32-bit word read and written back in place (x ^= 0, same threads): the ceiling of the
//                in-place access pattern itself, which on some machines beats memcpy (no second buffer);
//   naive      - a scalar loop computing an fp32 angle and cosf/sinf for every element (same threads);
//   torch      - q * cos + rotate_half(q) * sin with precomputed tables (when built with libtorch; same threads).
// Bytes count what the rotation must move: the tensor read once and written once (2 x its size), for every method.
// Each method is warmed up, then timed in `--trials` trials of `--reps` calls; the trials of the methods of one
// case take turns (round robin), so a slow stretch of a shared machine hits all of them alike. The median
// per-call time (--stat median) or the fastest trial (--stat min) drives GB/s and the ratios; --json has both.
// On a shared machine the wall clock includes time the threads were descheduled, so the header prints the load
// average, and --stat min with short trials (--min-trial-ms) is the less disturbed number.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/rope_torch_baseline.h"
#include "cli/command.h"
#include "common/machine.h"
#include "rotary/dtype.h"
#include "rotary/error.h"
#include "rotary/rope.h"
#include "rotary/rope_spec.h"

namespace rotary::cli {
namespace {

struct BenchRopeArgs {
  int threads = 0;         // 0: OpenMP's default
  int reps = 0;            // calls per trial; 0: enough for ~min_trial_ms
  int trials = 11;
  double min_trial_ms = 20;
  std::string stat = "median";
  bool json = false;
  bool no_torch = false;
};

struct Shape {
  const char* name;
  int64_t tokens, heads, dim;
};

struct Timing {
  double median_s = 0, min_s = 0;
  int reps = 0;
};

struct Method {
  std::string name;
  std::function<void()> fn;
  Timing t;
};

// Warms up each method and picks its reps, then times the trials round robin; per-call seconds.
void time_methods(std::vector<Method>& methods, const BenchRopeArgs& a) {
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
  for (Method& m : methods) {
    const auto t0 = clock::now();
    int warm = 0;
    while (warm < 3 || seconds(clock::now() - t0) < 0.02) {
      m.fn();
      ++warm;
    }
    const double per_call = seconds(clock::now() - t0) / warm;
    m.t.reps = a.reps > 0 ? a.reps : std::max(1, int(a.min_trial_ms * 1e-3 / per_call));
  }
  std::vector<std::vector<double>> trials(methods.size());
  for (int k = 0; k < a.trials; ++k) {
    for (size_t i = 0; i < methods.size(); ++i) {
      const auto s = clock::now();
      for (int r = 0; r < methods[i].t.reps; ++r) methods[i].fn();
      trials[i].push_back(seconds(clock::now() - s) / methods[i].t.reps);
    }
  }
  for (size_t i = 0; i < methods.size(); ++i) {
    std::sort(trials[i].begin(), trials[i].end());
    methods[i].t.median_s = trials[i][trials[i].size() / 2];
    methods[i].t.min_s = trials[i].front();
  }
}

// The naive kernel: per element an fp32 angle and cosf/sinf, in place, half-split or interleaved pairs.
// Runs body(lo, hi) over [0, n) on `threads` threads in contiguous blocks, or directly when threads <= 1 (an
// OpenMP region costs even with if(false), which would tax the decode shape of every baseline).
template <class Body>
void split_range(int64_t n, int threads, Body body) {
  if (threads <= 1) {
    body(int64_t(0), n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t k = omp_get_num_threads(), id = omp_get_thread_num();
    body(n * id / k, n * (id + 1) / k);
  }
}

template <class Load, class Store>
void naive_rotate(void* data, const Shape& s, const int64_t* pos, const std::vector<float>& inv, bool interleaved,
                  int threads, Load load, Store store) {
  const int64_t half = s.dim / 2;
  split_range(s.tokens, s.tokens > 1 ? threads : 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t base = (t * s.heads + h) * s.dim;
        for (int64_t i = 0; i < half; ++i) {
          const float angle = float(pos[t]) * inv[size_t(i)];
          const float c = std::cos(angle), sn = std::sin(angle);
          const int64_t ia = base + (interleaved ? 2 * i : i), ib = base + (interleaved ? 2 * i + 1 : i + half);
          const float x1 = load(data, ia), x2 = load(data, ib);
          store(data, ia, x1 * c - x2 * sn);
          store(data, ib, x1 * sn + x2 * c);
        }
      }
    }
  });
}

// Reads and writes back every 32-bit word of x (xor with a zero the compiler cannot see), split across threads.
volatile uint32_t g_zero = 0;
void inplace_rw(void* x, size_t bytes, int threads) {
  uint32_t* w = static_cast<uint32_t*>(x);
  const uint32_t z = g_zero;
  split_range(int64_t(bytes / 4), bytes >= (size_t(1) << 20) ? threads : 1, [w, z](int64_t lo, int64_t hi) {
    // Local copies: stores to p[i] could alias a captured uint32_t, which would stop vectorization.
    uint32_t* const p = w;
    const uint32_t zero = z;
    for (int64_t i = lo; i < hi; ++i) p[i] ^= zero;
  });
}

// memcpy of `bytes` split across threads (one call when the copy is small, as the kernel does for one token).
void parallel_memcpy(void* dst, const void* src, size_t bytes, int threads) {
  const int64_t lines = int64_t((bytes + 63) / 64);  // split on cache lines
  split_range(lines, bytes >= (size_t(1) << 20) ? threads : 1, [&](int64_t lo, int64_t hi) {
    const size_t b0 = size_t(lo) * 64, b1 = std::min(bytes, size_t(hi) * 64);
    std::memcpy(static_cast<char*>(dst) + b0, static_cast<const char*>(src) + b0, b1 - b0);
  });
}

struct Row {
  std::string shape, dtype, layout, method;
  int64_t tokens, heads, dim;
  double bytes;  // read + written
  Timing t;
  bool use_min = false;
  double seconds() const { return use_min ? t.min_s : t.median_s; }
  double gbps() const { return bytes / seconds() * 1e-9; }
};

void run_bench_rope(const BenchRopeArgs& a) {
  check(a.threads >= 0, "--threads", a.threads, ">= 0 (0: OpenMP default)");
  check(a.reps >= 0, "--reps", a.reps, ">= 0 (0: automatic)");
  check(a.trials >= 1, "--trials", a.trials, ">= 1");
  check(a.stat == "median" || a.stat == "min", "--stat", a.stat, "median, min");
  check(a.min_trial_ms > 0, "--min-trial-ms", a.min_trial_ms, "> 0");
  const int threads = a.threads > 0 ? a.threads : omp_get_max_threads();
  omp_set_num_threads(threads);  // rope_apply uses omp_get_max_threads()
#ifdef ROTARY_HAVE_TORCH
  const bool torch = !a.no_torch;
#else
  const bool torch = false;
#endif

  const Shape shapes[] = {{"prefill", 4096, 32, 128}, {"decode", 1, 32, 128}};
  std::vector<Row> rows;
  for (const Shape& s : shapes) {
    std::vector<int64_t> pos(size_t(s.tokens));
    for (int64_t t = 0; t < s.tokens; ++t) pos[size_t(t)] = s.tokens == 1 ? 4096 : t;  // decode: token 4097
    for (DType dtype : {DType::F32, DType::BF16}) {
      for (RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved}) {
        RopeSpec spec;
        spec.head_dim = int(s.dim);
        spec.layout = layout;
        const RopeFreqs f = spec.freqs();
        const int64_t n = s.tokens * s.heads * s.dim;
        const size_t bytes = size_t(n) * dtype_size(dtype);
        // 64-byte aligned buffers, touched before timing (first-touch page faults are not part of any method).
        auto alloc = [&] {
          std::unique_ptr<char, decltype(&std::free)> b(
              static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)), &std::free);
          std::mt19937 rng(1);
          std::uniform_real_distribution<float> u(-1, 1);
          for (int64_t i = 0; i < n; ++i) store_from_double(b.get(), dtype, i, u(rng));
          return b;
        };
        auto x = alloc(), src = alloc(), dst = alloc();
        std::vector<Method> methods;
        auto add = [&](const char* method, std::function<void()> fn) { methods.push_back({method, std::move(fn), {}}); };

        RopeParams p;
        p.tokens = s.tokens;
        p.positions = pos.data();
        p.dtype = dtype;
        p.q_in = {x.get(), s.heads, s.heads * s.dim, s.dim};
        p.q_out = p.q_in;
        add("rope_apply", [&] { rope_apply(f, p); });
        add("memcpy", [&] { parallel_memcpy(dst.get(), src.get(), bytes, s.tokens > 1 ? threads : 1); });
        add("inplace_rw", [&] { inplace_rw(dst.get(), bytes, s.tokens > 1 ? threads : 1); });
        std::vector<float> inv_f(f.inv_freq.begin(), f.inv_freq.end());
        const bool il = layout == RopeLayout::Interleaved;
        if (dtype == DType::F32) {
          add("naive", [&] {
            naive_rotate(
                x.get(), s, pos.data(), inv_f, il, threads,
                [](void* d, int64_t i) { return static_cast<float*>(d)[i]; },
                [](void* d, int64_t i, float v) { static_cast<float*>(d)[i] = v; });
          });
        } else {
          add("naive", [&] {
            naive_rotate(
                x.get(), s, pos.data(), inv_f, il, threads,
                [](void* d, int64_t i) { return bf16_to_float(static_cast<uint16_t*>(d)[i]); },
                [](void* d, int64_t i, float v) { static_cast<uint16_t*>(d)[i] = float_to_bf16(v); });
          });
        }
        if (torch) {
          bench::TorchRopeCase tc;
          tc.tokens = s.tokens;
          tc.heads = s.heads;
          tc.dim = s.dim;
          tc.positions = pos.data();
          tc.bf16 = dtype == DType::BF16;
          tc.interleaved = il;
          tc.threads = threads;
          add("torch", bench::make_torch_rope(tc));
        }
        time_methods(methods, a);
        for (const Method& m : methods)
          rows.push_back({s.name, dtype_name(dtype), std::string(layout_name(layout)), m.name, s.tokens, s.heads,
                          s.dim, 2.0 * double(bytes), m.t, a.stat == "min"});
      }
    }
  }

  // Ratios of each rope_apply row against the baselines measured next to it.
  auto find = [&](const Row& r, const char* method) -> const Row* {
    for (const Row& o : rows)
      if (o.shape == r.shape && o.dtype == r.dtype && o.layout == r.layout && o.method == method) return &o;
    return nullptr;
  };
  const std::string target = rope_simd_target(), cpu = lab::cpu_description();
  const unsigned nproc = std::thread::hardware_concurrency();

  if (a.json) {
    nlohmann::json j;
    j["machine"] = {{"cpu", cpu},       {"nproc", nproc}, {"threads", threads}, {"simd_target", target},
                    {"torch", torch},   {"load_average", lab::load_average()}};
    j["stat"] = a.stat;
    j["bytes"] = "read + written (2 x tensor size), q only, in place";
    for (const Row& r : rows) {
      nlohmann::json e = {{"shape", r.shape}, {"tokens", r.tokens}, {"heads", r.heads},   {"dim", r.dim},
                          {"dtype", r.dtype}, {"layout", r.layout}, {"method", r.method}, {"bytes", r.bytes},
                          {"median_s", r.t.median_s}, {"min_s", r.t.min_s}, {"reps", r.t.reps},
                          {"gb_per_s", r.gbps()}};
      if (r.method == "rope_apply") {
        for (const char* m : {"memcpy", "inplace_rw", "naive", "torch"})
          if (const Row* o = find(r, m)) e["speedup_vs_" + std::string(m)] = o->seconds() / r.seconds();
      }
      j["results"].push_back(e);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }

  std::printf("rotary bench rope: q only, in place; bytes = read + written; %s of %d trials\n", a.stat.c_str(),
              a.trials);
  std::printf("cpu: %s | nproc %u | threads %d | highway target %s | torch %s | load average %s\n\n", cpu.c_str(),
              nproc, threads, target.c_str(), torch ? "yes" : "no (not built or --no-torch)", lab::load_average().c_str());
  std::printf("%-8s %-5s %-12s %-11s %11s %9s %8s %8s   %s\n", "shape", "dtype", "layout", "method", "time_us",
              "GB/s", "%memcpy", "%rw", "rope_apply speedup");
  for (const Row& r : rows) {
    const Row* mc = find(r, "memcpy");
    const Row* rw = find(r, "inplace_rw");
    std::string speedup;
    if (r.method == "rope_apply") {
      for (const char* m : {"naive", "torch"})
        if (const Row* o = find(r, m)) {
          char buf[64];
          std::snprintf(buf, sizeof buf, "%.1fx vs %s  ", o->seconds() / r.seconds(), m);
          speedup += buf;
        }
    }
    std::printf("%-8s %-5s %-12s %-11s %11.2f %9.2f %7.0f%% %7.0f%%   %s\n", r.shape.c_str(), r.dtype.c_str(),
                r.layout.c_str(), r.method.c_str(), r.seconds() * 1e6, r.gbps(),
                mc ? 100.0 * mc->seconds() / r.seconds() : 0.0, rw ? 100.0 * rw->seconds() / r.seconds() : 0.0,
                speedup.c_str());
  }
}

// ---- `rotary bench rope-cost`: seed 002's runtime claim --------------------------------------------------------
//
// Seed 002 (EleutherAI) measured, for q and k of [2048, 16, 12, 64] (seq, batch, heads, head dim), rotary applied
// naively in PyTorch at 4-5x the cost of an additive position embedding (5.3 ms against 2.1 ms), 2-2.5x with
// TorchScript fusion. Here, in one run, the same threads, q and k both, in that shape:
//   rope_apply     - our kernel, in place (the positions of [seq, batch] rows: row t is at position t / batch);
//   additive       - x += pe[position] into q and k, in place, a plain loop the compiler vectorizes: the floor of
//                    any position encoding that touches q and k (read once, written once);
//   torch_rotary   - the seed's composition q * cos + rotate_half(q) * sin (and for k), cos/sin [seq, 1, 1, dim];
//   torch_additive - q + pe, k + pe with pe [seq, 1, 1, dim], as PyTorch code writes it (allocating).
struct RopeCostArgs {
  BenchRopeArgs timing;
  int64_t seq = 2048, batch = 16, heads = 12, dim = 64;
  std::string dtype = "f32";
};

void run_bench_rope_cost(const RopeCostArgs& a) {
  const BenchRopeArgs& t = a.timing;
  check(t.stat == "median" || t.stat == "min", "--stat", t.stat, "median, min");
  const DType dtype = parse_dtype(a.dtype);
  check(dtype == DType::F32 || dtype == DType::BF16, "--dtype", a.dtype, "f32, bf16");
  check(a.dim % 2 == 0, "--dim", a.dim, "an even number");
  const int threads = t.threads > 0 ? t.threads : omp_get_max_threads();
  omp_set_num_threads(threads);
#ifdef ROTARY_HAVE_TORCH
  const bool torch = !t.no_torch;
#else
  const bool torch = false;
#endif
  const int64_t tokens = a.seq * a.batch, n = tokens * a.heads * a.dim;
  const size_t bytes = size_t(n) * dtype_size(dtype);
  std::vector<int64_t> pos(static_cast<size_t>(tokens));
  for (int64_t r = 0; r < tokens; ++r) pos[size_t(r)] = r / a.batch;
  RopeSpec spec;
  spec.head_dim = int(a.dim);
  const RopeFreqs f = spec.freqs();
  auto alloc = [&](int64_t count, uint32_t seed) {
    std::unique_ptr<char, decltype(&std::free)> b(
        static_cast<char*>(std::aligned_alloc(64, (size_t(count) * dtype_size(dtype) + 63) / 64 * 64)), &std::free);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    for (int64_t i = 0; i < count; ++i) store_from_double(b.get(), dtype, i, u(rng));
    return b;
  };
  auto q = alloc(n, 1), k = alloc(n, 2), pe = alloc(a.seq * a.dim, 3);

  std::vector<Method> methods;
  RopeParams p;
  p.tokens = tokens;
  p.positions = pos.data();
  p.dtype = dtype;
  p.q_in = {q.get(), a.heads, a.heads * a.dim, a.dim};
  p.q_out = p.q_in;
  p.k_in = {k.get(), a.heads, a.heads * a.dim, a.dim};
  p.k_out = p.k_in;
  methods.push_back({"rope_apply", [&] { rope_apply(f, p); }, {}});
  auto add_pe = [&](auto* x, const auto* table, auto load, auto store) {
    split_range(tokens, threads, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const auto* e = table + (r / a.batch) * a.dim;
        for (int64_t h = 0; h < a.heads; ++h) {
          auto* row = x + (r * a.heads + h) * a.dim;
          for (int64_t d = 0; d < a.dim; ++d) store(row + d, load(row + d) + load(e + d));
        }
      }
    });
  };
  if (dtype == DType::F32) {
    auto ld = [](const float* v) { return *v; };
    auto st = [](float* v, float x) { *v = x; };
    methods.push_back({"additive", [&] {
                         add_pe(reinterpret_cast<float*>(q.get()), reinterpret_cast<const float*>(pe.get()), ld, st);
                         add_pe(reinterpret_cast<float*>(k.get()), reinterpret_cast<const float*>(pe.get()), ld, st);
                       }, {}});
  } else {
    auto ld = [](const uint16_t* v) { return bf16_to_float(*v); };
    auto st = [](uint16_t* v, float x) { *v = float_to_bf16(x); };
    methods.push_back({"additive", [&] {
                         add_pe(reinterpret_cast<uint16_t*>(q.get()), reinterpret_cast<const uint16_t*>(pe.get()), ld, st);
                         add_pe(reinterpret_cast<uint16_t*>(k.get()), reinterpret_cast<const uint16_t*>(pe.get()), ld, st);
                       }, {}});
  }
  if (torch) {
    const bench::TorchQkCase tc{a.seq, a.batch, a.heads, a.dim, dtype == DType::BF16, threads};
    methods.push_back({"torch_rotary", bench::make_torch_rotary_qk(tc), {}});
    methods.push_back({"torch_additive", bench::make_torch_additive_qk(tc), {}});
  }
  time_methods(methods, t);

  auto seconds = [&](const std::string& name) {
    for (const Method& m : methods)
      if (m.name == name) return t.stat == "min" ? m.t.min_s : m.t.median_s;
    return 0.0;
  };
  const double moved = 4.0 * double(bytes);  // q and k, each read once and written once
  const std::string cpu = lab::cpu_description(), target = rope_simd_target();
  if (t.json) {
    nlohmann::json j;
    j["machine"] = {{"cpu", cpu}, {"threads", threads}, {"simd_target", target}, {"torch", torch},
                    {"load_average", lab::load_average()}};
    j["shape"] = {{"seq", a.seq}, {"batch", a.batch}, {"heads", a.heads}, {"dim", a.dim}, {"dtype", a.dtype}};
    j["stat"] = t.stat;
    for (const Method& m : methods)
      j["results"].push_back({{"method", m.name}, {"median_s", m.t.median_s}, {"min_s", m.t.min_s},
                              {"reps", m.t.reps}, {"gb_per_s", moved / seconds(m.name) * 1e-9}});
    j["rope_apply_over_additive"] = seconds("rope_apply") / seconds("additive");
    if (torch) {
      j["rope_apply_over_torch_additive"] = seconds("rope_apply") / seconds("torch_additive");
      j["torch_rotary_over_torch_additive"] = seconds("torch_rotary") / seconds("torch_additive");
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("rotary bench rope-cost: q and k of [%lld, %lld, %lld, %lld] %s (seed 002's shape); %s of %d trials\n",
              (long long)a.seq, (long long)a.batch, (long long)a.heads, (long long)a.dim, a.dtype.c_str(),
              t.stat.c_str(), t.trials);
  std::printf("cpu: %s | threads %d | highway target %s | torch %s | load average %s\n\n", cpu.c_str(), threads,
              target.c_str(), torch ? "yes" : "no", lab::load_average().c_str());
  std::printf("%-15s %10s %8s %14s\n", "method", "time_ms", "GB/s", "x additive");
  for (const Method& m : methods)
    std::printf("%-15s %10.3f %8.2f %14.2f\n", m.name.c_str(), seconds(m.name) * 1e3, moved / seconds(m.name) * 1e-9,
                seconds(m.name) / seconds("additive"));
  std::printf("\nrope_apply / additive = %.2f (goal <= 1.2)\n", seconds("rope_apply") / seconds("additive"));
  if (torch)
    std::printf("rope_apply / torch_additive = %.2f; torch_rotary / torch_additive = %.2f (seed 002: 4-5x on a GPU)\n",
                seconds("rope_apply") / seconds("torch_additive"), seconds("torch_rotary") / seconds("torch_additive"));
}

// The timing flags both rope benchmarks take.
void add_timing_flags(CLI::App& cmd, BenchRopeArgs& a) {
  cmd.add_option("--threads", a.threads, "threads for every method (0: OpenMP default)")->transform(integer_in(0, kMaxThreads));
  cmd.add_option("--reps", a.reps, "calls per trial (0: enough for --min-trial-ms)")->transform(integer_in(0, 1 << 30));
  cmd.add_option("--trials", a.trials, "timed trials per method (taking turns)")->transform(integer_in(1, 100000));
  cmd.add_option("--min-trial-ms", a.min_trial_ms, "target length of one trial when --reps is 0")->transform(finite_in(0, 1e6));
  cmd.add_option("--stat", a.stat, "median or min of the trials for GB/s and ratios");
  cmd.add_flag("--json", a.json, "print machine-readable results");
  cmd.add_flag("--no-torch", a.no_torch, "skip the torch methods");
}

const CommandRegistrar kRegisterBenchRopeCost([](CLI::App& root) {
  auto args = std::make_shared<RopeCostArgs>();
  CLI::App& bench = subcommand_group(root, "bench", "benchmarks");
  CLI::App* cmd = bench.add_subcommand(
      "rope-cost", "seed 002's runtime claim: rotating q and k of [2048, 16, 12, 64] against adding a position "
                   "embedding to them (ours and PyTorch's)");
  cmd->add_option("--seq", args->seq, "sequence length")->transform(integer_in(1, kMaxSequenceLength));
  cmd->add_option("--batch", args->batch, "batch")->transform(integer_in(1, 1 << 16));
  cmd->add_option("--heads", args->heads, "heads")->transform(integer_in(1, 4096));
  cmd->add_option("--dim", args->dim, "head dimension (even)")->transform(integer_in(2, 1024));
  cmd->add_option("--dtype", args->dtype, "f32 or bf16");
  add_timing_flags(*cmd, args->timing);
  cmd->callback([args] { run_bench_rope_cost(*args); });
});

const CommandRegistrar kRegisterBenchRope([](CLI::App& root) {
  auto args = std::make_shared<BenchRopeArgs>();
  CLI::App& bench = subcommand_group(root, "bench", "benchmarks");
  CLI::App* cmd = bench.add_subcommand(
      "rope", "GB/s of rope_apply (f32, bf16; both layouts; prefill 4096x32x128 and decode 1x32x128) beside memcpy, "
              "a naive scalar kernel and the torch composition");
  add_timing_flags(*cmd, *args);
  cmd->callback([args] { run_bench_rope(*args); });
});

}  // namespace
}  // namespace rotary::cli
