// `rotary bench linear`: the core's linear layers (rotary/linear.h) with weights in every storage format, at the
// shapes of real checkpoints. Issue 22's kernel goals:
//   decode   one token (a matrix-vector product) reads every weight once, so its measure is the weight bytes read
//            per second against a read-bandwidth probe measured in the same run (goal: >= 80% in bf16 and q8);
//            the weights of each format fill --weight-mib (default 512 MiB, far past the L3 cache), as many copies
//            of the shape as that takes, called in turn, so every call reads from memory as a model's layers do.
//   prefill  --tokens tokens at once (matrix-matrix), in GFLOP/s, beside OpenBLAS's sgemm on float32 copies of
//            the same weights (the f32 path the nn model runs today).
// A format `bf16:bf16` is bf16 weights with bf16 activations (ActivationFormat::BF16: the CPU's bf16 dot products
// where it has them, as llama.cpp's bf16 products), `q8:q8` q8 weights with q8 activations (ActivationFormat::Q8:
// the CPU's int8 dot products where it has AVX512-VNNI, as llama.cpp's Q8_0 products); the others take float32
// activations.
// Methods take turns trial by trial (a slow stretch of a shared machine hits all of them alike); medians.
#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/statistics.h"
#include "cli/command.h"
#include "common/machine.h"
#include "rotary/error.h"
#include "rotary/ggml_quants.h"
#include "rotary/linear.h"

namespace rotary::cli {
namespace {

using lab::median;

struct BenchLinearArgs {
  std::string shapes = "4864x896,896x4864,14336x4096";
  std::string formats = "f32,f16,bf16,q8,bf16:bf16,q8:q8";
  int64_t weight_mib = 512;
  int64_t tokens = 512;
  int trials = 5;
  int threads = 0;
  bool json = false;
};

struct Shape {
  int64_t rows = 0, cols = 0;
};

std::vector<Shape> parse_shapes(const std::string& text) {
  std::vector<Shape> out;
  for (const std::string& item : parse_name_list(text, "--shapes")) {
    const size_t x = item.find('x');
    if (x == std::string::npos) fail("--shapes", text, "comma-separated ROWSxCOLS (output x input features), e.g. 4864x896");
    out.push_back({parse_integer(item.substr(0, x), "--shapes rows", 1, 1 << 20),
                   parse_integer(item.substr(x + 1), "--shapes cols", 1, 1 << 20)});
  }
  return out;
}

// Copies of one [rows, cols] matrix in one format, random weights in [-1, 1), filling about `bytes`.
struct WeightSet {
  WeightFormat format;
  ActivationFormat activations = ActivationFormat::F32;
  Shape shape;
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::vector<uint16_t>> scales;  // q8: f16 bits
  WeightSet(WeightFormat f, Shape s, int64_t bytes, uint64_t seed) : format(f), shape(s) {
    const int64_t n = s.rows * s.cols;
    const int64_t per = weight_matrix_bytes(f, s.rows, s.cols);
    const int64_t copies = std::max<int64_t>(1, bytes / per);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uni(-1, 1);
    std::vector<float> w(static_cast<size_t>(n));
    for (int64_t c = 0; c < copies; ++c) {
      for (float& v : w) v = uni(rng);
      data.emplace_back(size_t(per));
      if (is_block_format(f)) {  // llama.cpp's quantizer of the format (rotary/ggml_quants.h), row by row
        for (int64_t r = 0; r < s.rows; ++r)
          ggml_quantize(ggml_type_of(f), w.data() + r * s.cols, s.cols,
                        data.back().data() + r * weight_row_bytes(f, s.cols));
      } else if (f == WeightFormat::Q8) {
        scales.emplace_back(size_t(s.rows * q8_blocks(s.cols)));
        quantize_q8(w.data(), DType::F32, s.rows, s.cols, s.cols, reinterpret_cast<int8_t*>(data.back().data()),
                    scales.back().data());
      } else {
        const DType t = f == WeightFormat::F32 ? DType::F32 : f == WeightFormat::F16 ? DType::F16 : DType::BF16;
        for (int64_t i = 0; i < n; ++i) store_from_double(data.back().data(), t, i, w[size_t(i)]);
      }
    }
  }
  int64_t bytes_per_copy() const {
    return weight_matrix_bytes(format, shape.rows, shape.cols);
  }
  WeightMatrix matrix(size_t copy) const {
    WeightMatrix m;
    m.format = format, m.data = data[copy].data(), m.rows = shape.rows, m.cols = shape.cols, m.row_stride = shape.cols;
    if (!scales.empty()) m.scales = scales[copy].data(), m.scale_stride = q8_blocks(shape.cols);
    return m;
  }
};

// The bytes a shape's run holds at once: each format's copies (as many as fill `weight_bytes`, at least one), the
// float32 matrix they are made from (then sgemm's float32 copy), and a prefill call's activations in and out.
int64_t shape_run_bytes(const Shape& s, const std::vector<std::pair<WeightFormat, ActivationFormat>>& formats,
                        int64_t weight_bytes, int64_t tokens) {
  int64_t bytes = 4 * s.rows * s.cols + 4 * tokens * (s.rows + s.cols);
  for (const auto& f : formats) {
    const int64_t per = weight_matrix_bytes(f.first, s.rows, s.cols);
    bytes += std::max<int64_t>(1, weight_bytes / per) * per;
  }
  return bytes;
}

// Refuses (naming the flag, the bytes and what is available) a run that would not fit the memory available now:
// an allocation past it would take the machine's swap or its OOM killer, not fail cleanly.
void check_fits_memory(const BenchLinearArgs& a, const std::vector<Shape>& shapes,
                       const std::vector<std::pair<WeightFormat, ActivationFormat>>& formats) {
  const int64_t available = lab::available_memory_bytes();
  if (available < 0) return;  // unknown (no /proc/meminfo)
  const std::string allowed = fmt::format("a run that fits the {:.2f} GB of memory available (MemAvailable)",
                                          double(available) / 1e9);
  const int64_t weight_bytes = a.weight_mib << 20;
  check(weight_bytes <= available, "--weight-mib",
        fmt::format("{} ({:.2f} GB of weights per format and shape, and of the read probe)", a.weight_mib,
                    double(weight_bytes) / 1e9),
        allowed);
  for (const Shape& s : shapes) {
    const int64_t need = shape_run_bytes(s, formats, weight_bytes, a.tokens);
    if (need > available)
      fail("--shapes", fmt::format("{}x{} ({:.2f} GB of weights and buffers with --formats {}, --weight-mib {}, "
                                   "--tokens {})", s.rows, s.cols, double(need) / 1e9, a.formats, a.weight_mib,
                                   a.tokens),
           allowed);
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Row {
  std::string phase, method;
  Shape shape;
  int64_t tokens = 0;
  double seconds = 0;  // median per call
  double weight_bytes = 0;
  double gb_per_s() const { return weight_bytes / seconds / 1e9; }
  double gflops() const { return 2.0 * double(tokens * shape.rows * shape.cols) / seconds / 1e9; }
};

void run_bench_linear(const BenchLinearArgs& a) {
  const std::vector<Shape> shapes = parse_shapes(a.shapes);
  // "bf16" or "bf16:bf16" (weights : activations).
  std::vector<std::pair<WeightFormat, ActivationFormat>> formats;
  for (const std::string& f : parse_name_list(a.formats, "--formats")) {
    const size_t colon = f.find(':');
    formats.emplace_back(parse_weight_format(f.substr(0, colon), "--formats"),
                         colon == std::string::npos ? ActivationFormat::F32
                                                    : parse_activation_format(f.substr(colon + 1), "--formats activations"));
    const auto [w, x] = formats.back();
    check(x == ActivationFormat::F32 || (x == ActivationFormat::BF16 && w == WeightFormat::BF16) ||
              (x == ActivationFormat::Q8 && (w == WeightFormat::Q8 || is_block_format(w))),
          "--formats", f,
          "f32, f16, bf16, q8, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, bf16:bf16, q8:q8, q4_k:q8, ... (bf16 "
          "activations need bf16 weights, q8 activations q8 or a block format)");
    if (is_block_format(w))
      for (const Shape& sh : shapes)
        check(sh.cols % weight_block_size(w) == 0, "--shapes", fmt::format("{}x{}", sh.rows, sh.cols),
              fmt::format("columns a multiple of {} with --formats {}", weight_block_size(w), f));
  }
  check_fits_memory(a, shapes, formats);
  const int threads = a.threads > 0 ? a.threads : omp_get_max_threads();
  openblas_set_num_threads(threads);
  const int64_t bytes = a.weight_mib << 20;
  const double probe = lab::read_bandwidth(bytes, threads);

  std::vector<Row> rows;
  for (const Shape& s : shapes) {
    std::vector<std::unique_ptr<WeightSet>> sets;
    for (size_t i = 0; i < formats.size(); ++i) {
      sets.push_back(std::make_unique<WeightSet>(formats[i].first, s, bytes, 7 + i));
      sets.back()->activations = formats[i].second;
    }
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<float> uni(-1, 1);
    std::vector<float> x(size_t(a.tokens * s.cols)), y(size_t(a.tokens * s.rows));
    for (float& v : x) v = uni(rng);
    // sgemm's float32 copy of the first copy of the first set's weights (the values do not change its speed).
    std::vector<float> w32(size_t(s.rows * s.cols));
    for (size_t i = 0; i < w32.size(); ++i) w32[i] = uni(rng);

    // Decode: every copy once per trial, one token each.
    std::vector<std::vector<double>> decode(sets.size());
    // Prefill: one call of --tokens tokens per trial (compute-bound: the first copy stays cached as it would).
    std::vector<std::vector<double>> prefill(sets.size() + 1);
    for (int trial = -1; trial < a.trials; ++trial) {  // trial -1 warms up (page faults, thread pools)
      for (size_t i = 0; i < sets.size(); ++i) {
        LinearParams p;
        p.tokens = 1, p.x = x.data(), p.x_stride = s.cols, p.y = y.data(), p.y_stride = s.rows, p.threads = threads;
        p.activations = sets[i]->activations;
        auto t0 = std::chrono::steady_clock::now();
        for (size_t c = 0; c < sets[i]->data.size(); ++c) {
          p.w = sets[i]->matrix(c);
          linear_forward(p);
        }
        const double per_call = seconds_since(t0) / double(sets[i]->data.size());
        p.w = sets[i]->matrix(0), p.tokens = a.tokens;
        t0 = std::chrono::steady_clock::now();
        linear_forward(p);
        const double prefill_s = seconds_since(t0);
        if (trial >= 0) decode[i].push_back(per_call), prefill[i].push_back(prefill_s);
      }
      const auto t0 = std::chrono::steady_clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(a.tokens), int(s.rows), int(s.cols), 1.0f, x.data(),
                  int(s.cols), w32.data(), int(s.cols), 0.0f, y.data(), int(s.rows));
      if (trial >= 0) prefill.back().push_back(seconds_since(t0));
    }
    for (size_t i = 0; i < sets.size(); ++i) {
      std::string name = weight_format_name(sets[i]->format);
      if (sets[i]->activations != ActivationFormat::F32) name += std::string(":") + activation_format_name(sets[i]->activations);
      rows.push_back({"decode", name, s, 1, median(decode[i]), double(sets[i]->bytes_per_copy())});
      rows.push_back({"prefill", name, s, a.tokens, median(prefill[i]), double(sets[i]->bytes_per_copy())});
    }
    rows.push_back({"prefill", "sgemm_f32", s, a.tokens, median(prefill.back()), double(s.rows * s.cols * 4)});
  }

  auto sgemm_seconds = [&](const Row& r) {
    for (const Row& o : rows)
      if (o.method == "sgemm_f32" && o.shape.rows == r.shape.rows && o.shape.cols == r.shape.cols) return o.seconds;
    return 0.0;
  };
  nlohmann::json j;
  j["cpu"] = lab::cpu_description(), j["threads"] = threads, j["read_bandwidth_bytes_per_s"] = probe;
  j["bf16_dot_products"] = linear_uses_bf16_dot(), j["q8_dot_products"] = linear_uses_q8_dot();
  j["q8_products"] = linear_q8_products();
  j["weight_mib"] = a.weight_mib, j["tokens"] = a.tokens, j["trials"] = a.trials;
  for (const Row& r : rows) {
    nlohmann::json e = {{"phase", r.phase}, {"method", r.method}, {"rows", r.shape.rows}, {"cols", r.shape.cols},
                        {"tokens", r.tokens}, {"seconds", r.seconds}, {"gflops", r.gflops()}};
    if (r.phase == "decode") e["weight_bytes_per_s"] = r.weight_bytes / r.seconds, e["over_read_probe"] = r.weight_bytes / r.seconds / probe;
    else e["over_sgemm"] = sgemm_seconds(r) / r.seconds;
    j["results"].push_back(e);
  }
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("rotary bench linear: y = x W^T, weights in their storage format, float32 activations (W:A: %s, %s)\n",
              linear_uses_bf16_dot() ? "bf16 activations on the CPU's bf16 dot products" : "bf16 activations in f32 lanes",
              (std::string("q8 activations on ") + linear_q8_products()).c_str());
  std::printf("cpu: %s | threads %d | read probe %.2f GB/s (%lld MiB) | decode weights %lld MiB per format\n\n",
              lab::cpu_description().c_str(), threads, probe / 1e9, (long long)a.weight_mib, (long long)a.weight_mib);
  std::printf("%-8s %-10s %-12s %7s %11s %9s %11s %9s\n", "phase", "weights", "shape", "tokens", "us/call", "GB/s",
              "/ probe", "GFLOP/s");
  for (const Row& r : rows) {
    const std::string shape = std::to_string(r.shape.rows) + "x" + std::to_string(r.shape.cols);
    if (r.phase == "decode")
      std::printf("%-8s %-10s %-12s %7lld %11.1f %9.2f %10.0f%% %9.1f\n", r.phase.c_str(), r.method.c_str(),
                  shape.c_str(), (long long)r.tokens, r.seconds * 1e6, r.gb_per_s(), 100 * r.gb_per_s() * 1e9 / probe,
                  r.gflops());
    else
      std::printf("%-8s %-10s %-12s %7lld %11.1f %9s %11s %9.1f  (%.2fx sgemm)\n", r.phase.c_str(), r.method.c_str(),
                  shape.c_str(), (long long)r.tokens, r.seconds * 1e6, "-", "-", r.gflops(), sgemm_seconds(r) / r.seconds);
  }
}

const CommandRegistrar kRegisterBenchLinear([](CLI::App& root) {
  auto args = std::make_shared<BenchLinearArgs>();
  CLI::App& bench = subcommand_group(root, "bench", "benchmarks");
  CLI::App* cmd = bench.add_subcommand(
      "linear", "the core's linear layers with weights in place in f32 / f16 / bf16 / q8: decode (one token) weight "
                "bytes read per second against a read-bandwidth probe, prefill GFLOP/s against OpenBLAS sgemm");
  cmd->add_option("--shapes", args->shapes,
                  "weight shapes ROWSxCOLS (output x input features), comma-separated (default 4864x896,896x4864,"
                  "14336x4096: Qwen2.5-0.5B's MLP up and down, Llama-3-8B's MLP up); a run that would not fit the memory "
                  "available (MemAvailable) is refused before it starts");
  cmd->add_option("--formats", args->formats,
                  "weight formats among f32, f16, bf16, q8, bf16:bf16 (bf16 weights, bf16 activations) and q8:q8 "
                  "(q8 weights, q8 activations); default all six");
  cmd->add_option("--weight-mib", args->weight_mib,
                  "MiB of weights per format and shape for decode, and of the read probe (default 512)")
      ->transform(integer_in(1, 1 << 16));
  cmd->add_option("--tokens", args->tokens, "tokens of a prefill call (default 512)")->transform(integer_in(1, 65536));
  cmd->add_option("--trials", args->trials, "timed trials, medians reported (default 5)")->transform(integer_in(1, 1000));
  cmd->add_option("--threads", args->threads, "threads, OpenBLAS's included (0: OpenMP default)")
      ->transform(integer_in(0, kMaxThreads));
  cmd->add_flag("--json", args->json, "print machine-readable results");
  cmd->callback([args] { run_bench_linear(*args); });
});

}  // namespace
}  // namespace rotary::cli
