// core/src/linear.cpp: linear_forward's validation and dispatch (kernels: linear_hwy.cpp), the format names, and
// q8 quantization at load.
#include "rotary/linear.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "block_weights.h"
#include "linear_kernel.h"
#include "rotary/error.h"
#include "storage.h"
#include "validate.h"

namespace rotary {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return "f32";
    case WeightFormat::F16: return "f16";
    case WeightFormat::BF16: return "bf16";
    case WeightFormat::Q8: return "q8";
    case WeightFormat::Q8_0: return "q8_0";
    case WeightFormat::Q4_0: return "q4_0";
    case WeightFormat::Q4_K: return "q4_k";
    case WeightFormat::Q5_K: return "q5_k";
    case WeightFormat::Q6_K: return "q6_k";
    case WeightFormat::Q4_1: return "q4_1";
    case WeightFormat::Q5_0: return "q5_0";
    case WeightFormat::Q5_1: return "q5_1";
  }
  return "?";
}

namespace {
// (listed by family, not in the enum's order: rotary/linear.h says why Q4_1 ... Q5_1 come last there)
constexpr WeightFormat kWeightFormats[] = {WeightFormat::F32,  WeightFormat::F16,  WeightFormat::BF16,
                                           WeightFormat::Q8,   WeightFormat::Q8_0, WeightFormat::Q4_0,
                                           WeightFormat::Q4_1, WeightFormat::Q5_0, WeightFormat::Q5_1,
                                           WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K};
constexpr const char* kWeightFormatList = "f32, f16, bf16, q8, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k";
}  // namespace

WeightFormat parse_weight_format(std::string_view name, std::string_view field) {
  for (WeightFormat f : kWeightFormats)
    if (name == weight_format_name(f)) return f;
  fail(field, "\"" + std::string(name) + "\"", kWeightFormatList);
}

WeightFormat weight_format_of(DType t) {
  switch (t) {
    case DType::F32: return WeightFormat::F32;
    case DType::F16: return WeightFormat::F16;
    case DType::BF16: return WeightFormat::BF16;
    case DType::F64: break;
  }
  fail("weight dtype", dtype_name(t), "f32, f16, bf16 (convert f64 weights at load)");
}

const char* activation_format_name(ActivationFormat f) {
  switch (f) {
    case ActivationFormat::F32: return "f32";
    case ActivationFormat::BF16: return "bf16";
    case ActivationFormat::Q8: return "q8";
  }
  return "?";
}

ActivationFormat parse_activation_format(std::string_view name, std::string_view field) {
  for (ActivationFormat f : {ActivationFormat::F32, ActivationFormat::BF16, ActivationFormat::Q8})
    if (name == activation_format_name(f)) return f;
  fail(field, "\"" + std::string(name) + "\"", "f32, bf16, q8");
}

float q8_quantize_block(const float* v, int64_t n, int8_t* quants) {
  check(n >= 1 && n <= kQ8Block, "n", n, "in [1, " + std::to_string(kQ8Block) + "] (one block)");
  if (v == nullptr) fail("v", "null", "a non-null pointer");
  if (quants == nullptr) fail("quants", "null", "a non-null pointer");
  float amax = 0;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    nan |= std::isnan(v[i]);
    amax = std::max(amax, std::fabs(v[i]));
  }
  const float scale = nan ? std::numeric_limits<float>::quiet_NaN() : amax / 127.0f;
  for (int64_t i = 0; i < n; ++i) {
    int8_t q = 0;
    if (std::isinf(v[i])) q = v[i] > 0 ? 127 : -127;
    else if (scale > 0 && std::isfinite(scale))
      q = int8_t(std::clamp(linear_detail::round_away(v[i] / scale), -127, 127));
    quants[i] = q;  // a NaN scale: every quant 0 (the block's products are NaN through the scale)
  }
  return scale;
}

namespace {

// [begin, end) bytes of a strided [n, row] array of `elem`-byte elements; n >= 1.
struct Span {
  uintptr_t begin, end;
};
Span span_of(const void* p, int64_t n, int64_t stride, int64_t row, int64_t elem) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(p);
  return {b, b + uintptr_t(((n - 1) * stride + row) * elem)};
}
bool overlap(Span a, Span b) { return a.begin < b.end && b.begin < a.end; }
// The bytes a weight matrix's elements or blocks take (rows >= 1; row_stride checked).
Span weight_span(const WeightMatrix& w) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(w.data);
  return {b, b + uintptr_t(weight_row_bytes(w.format, (w.rows - 1) * w.row_stride + w.cols))};
}

// n rows of `row` elements `stride` apart must fit in int64 element counts.
void check_extent(int64_t n, int64_t stride, int64_t row, std::string_view field) {
  int64_t m = 0, e = 0;
  if (__builtin_mul_overflow(n - 1, stride, &m) || __builtin_add_overflow(m, row, &e) || e > (int64_t(1) << 56))
    fail(field, to_text(stride), "a stride whose [" + std::to_string(n) + ", " + std::to_string(row) +
                                     "] extent fits in 2^56 elements");
}

}  // namespace

void linear_detail::validate(const LinearParams& p) {
  const WeightMatrix& w = p.w;
  if (w.format > kLastWeightFormat) fail("w.format", std::to_string(int(w.format)), kWeightFormatList);
  check(w.rows >= 1, "w.rows", w.rows, ">= 1");
  check(w.cols >= 1, "w.cols", w.cols, ">= 1");
  if (w.data == nullptr) fail("w.data", "null", "a non-null pointer");
  check(w.rows == 1 || w.row_stride >= w.cols, "w.row_stride", w.row_stride,
        ">= w.cols = " + std::to_string(w.cols) + " (rows must not overlap)");
  check_extent(w.rows, w.row_stride, w.cols, "w.row_stride");
  if (is_block_format(w.format)) {
    const int64_t block = weight_block_size(w.format);
    check(w.cols % block == 0, "w.cols", w.cols,
          "a multiple of " + std::to_string(block) + " (" + weight_format_name(w.format) + " rows are whole blocks)");
    check(w.rows == 1 || w.row_stride % block == 0, "w.row_stride", w.row_stride,
          "a multiple of " + std::to_string(block) + " (" + weight_format_name(w.format) + " rows start on a block)");
  }
  if (w.format == WeightFormat::Q8) {
    if (w.scales == nullptr) fail("w.scales", "null", "a non-null pointer (q8 weights have one scale per block)");
    check(w.rows == 1 || w.scale_stride >= q8_blocks(w.cols), "w.scale_stride", w.scale_stride,
          ">= q8_blocks(w.cols) = " + std::to_string(q8_blocks(w.cols)));
    check_extent(w.rows, w.scale_stride, q8_blocks(w.cols), "w.scale_stride");
  }
  if (p.activations != ActivationFormat::F32 && p.activations != ActivationFormat::BF16 &&
      p.activations != ActivationFormat::Q8)
    fail("activations", std::to_string(int(p.activations)), "f32, bf16, q8");
  if (p.activations == ActivationFormat::BF16 && w.format != WeightFormat::BF16)
    fail("activations", "bf16 with w.format = " + std::string(weight_format_name(w.format)),
         "bf16 activations with bf16 weights only (the bf16 dot products take both in bf16), or f32 activations");
  if (p.activations == ActivationFormat::Q8 && w.format != WeightFormat::Q8 && !is_block_format(w.format))
    fail("activations", "q8 with w.format = " + std::string(weight_format_name(w.format)),
         "q8 activations with q8 or block-format weights only (the integer dot products take both as integers), "
         "or f32 activations");
  check(p.tokens >= 0, "tokens", p.tokens, ">= 0");
  detail::check_threads(p.threads);
  if (p.tokens == 0) return;
  if (p.x == nullptr) fail("x", "null", "a non-null pointer");
  if (p.y == nullptr) fail("y", "null", "a non-null pointer");
  check(p.tokens == 1 || p.x_stride >= w.cols, "x_stride", p.x_stride, ">= w.cols = " + std::to_string(w.cols));
  check(p.tokens == 1 || p.y_stride >= w.rows, "y_stride", p.y_stride,
        ">= w.rows = " + std::to_string(w.rows) + " (output rows must not overlap)");
  check_extent(p.tokens, p.x_stride, w.cols, "x_stride");
  check_extent(p.tokens, p.y_stride, w.rows, "y_stride");
  const Span y = span_of(p.y, p.tokens, p.y_stride, w.rows, 4);
  if (overlap(y, span_of(p.x, p.tokens, p.x_stride, w.cols, 4))) fail("y", "a buffer overlapping x", "a separate buffer");
  if (overlap(y, weight_span(w)))
    fail("y", "a buffer overlapping w.data", "a separate buffer");
  if (p.bias && overlap(y, span_of(p.bias, 1, 0, w.rows, 4))) fail("y", "a buffer overlapping bias", "a separate buffer");
}

void linear_forward(const LinearParams& p) { linear_forward_group(&p, 1); }

void linear_forward_group(const LinearParams* products, int count) {
  check(count >= 1, "count", count, ">= 1 product");
  if (products == nullptr) fail("products", "null", "a non-null pointer");
  const auto field = [&](int i, std::string_view name) {
    return count == 1 ? std::string(name) : "products[" + std::to_string(i) + "]." + std::string(name);
  };
  for (int i = 0; i < count; ++i) {
    try {
      linear_detail::validate(products[i]);
    } catch (const Error& e) {
      if (count == 1) throw;
      // "rotary: w.rows = 0 ..." names the field within its product: "rotary: products[1].w.rows = 0 ...".
      std::string what = e.what();
      const std::string_view prefix = "rotary: ";
      const size_t at = what.rfind(prefix, 0) == 0 ? prefix.size() : 0;
      throw Error(what.insert(at, "products[" + std::to_string(i) + "]."));
    }
    check(products[i].threads == products[0].threads, field(i, "threads"), products[i].threads,
          "products[0].threads = " + std::to_string(products[0].threads) + " (one team of threads runs the group)");
  }
  // Products run at once: none may write where another reads or writes.
  std::vector<linear_detail::Job> jobs;
  int64_t work = 0;
  for (int i = 0; i < count; ++i) {
    const LinearParams& p = products[i];
    if (p.tokens == 0) continue;
    const Span y = span_of(p.y, p.tokens, p.y_stride, p.w.rows, 4);
    for (int o = 0; o < count; ++o) {
      const LinearParams& q = products[o];
      if (o == i || q.tokens == 0) continue;
      if (overlap(y, span_of(q.x, q.tokens, q.x_stride, q.w.cols, 4)) ||
          overlap(y, span_of(q.y, q.tokens, q.y_stride, q.w.rows, 4)) ||
          overlap(y, weight_span(q.w)) ||
          (q.bias && overlap(y, span_of(q.bias, 1, 0, q.w.rows, 4))))
        fail(field(i, "y"), "a buffer overlapping products[" + std::to_string(o) + "]'s x, y, weights or bias",
             "a separate buffer (the group runs its products at once)");
    }
    linear_detail::Job j;
    j.format = p.w.format, j.w = p.w.data, j.rows = p.w.rows, j.cols = p.w.cols, j.row_stride = p.w.row_stride;
    j.scales = p.w.scales, j.scale_stride = p.w.scale_stride;
    j.bias = p.bias, j.tokens = p.tokens, j.x = p.x, j.x_stride = p.x_stride, j.y = p.y, j.y_stride = p.y_stride;
    j.accumulate = p.accumulate;
    j.activations = p.activations;  // xb / xq assigned below
    j.round_x = p.activations == ActivationFormat::BF16, j.quantize_x = p.activations == ActivationFormat::Q8;
    jobs.push_back(j);
    work += p.tokens * p.w.rows * p.w.cols;
  }
  if (jobs.empty()) return;
  static std::atomic<uint64_t> calls{0};
  const uint64_t call = ++calls;
  for (linear_detail::Job& j : jobs) j.call = call;
  // bf16 / q8 activations: each distinct x (decode's q, k and v read one) is converted once, by the first job that
  // reads it, into a buffer kept by the calling thread and grown only when a larger call needs it (a decode loop
  // allocates nothing after its first step). Each piece starts on a 64-byte boundary.
  static thread_local std::vector<uint64_t> converted;
  size_t need = 0;
  const auto piece = [&need](int64_t bytes) {
    const size_t at = need;
    need += (size_t(bytes) + 63) / 64 * 64;
    return at;
  };
  constexpr size_t kNone = ~size_t(0);
  std::vector<std::array<size_t, 6>> at(jobs.size(), {kNone, kNone, kNone, kNone, kNone, kNone});  // byte offsets of the pieces
  for (size_t i = 0; i < jobs.size(); ++i) {
    linear_detail::Job& j = jobs[i];
    if (j.activations == ActivationFormat::F32) continue;
    for (size_t e = 0; e < i && at[i][0] == kNone; ++e)
      if (jobs[e].activations == j.activations && (jobs[e].round_x || jobs[e].quantize_x) && jobs[e].x == j.x &&
          jobs[e].x_stride == j.x_stride && jobs[e].cols == j.cols && jobs[e].tokens >= j.tokens)
        at[i] = at[e], j.round_x = j.quantize_x = false;  // reads e's converted rows
    if (at[i][0] != kNone) continue;
    if (j.activations == ActivationFormat::BF16) {
      at[i][0] = piece(2 * j.tokens * j.cols);
    } else {
      const int64_t blocks = q8_blocks(j.cols);
      const int64_t stride = linear_detail::q8_activation_stride(j.cols);
      at[i] = {piece(j.tokens * stride), piece(j.tokens * stride), piece(j.tokens * stride),
               piece(j.tokens * blocks * 4), piece(j.tokens * blocks * 4), piece(j.tokens * blocks * 4)};
    }
  }
  if (need > 0 && converted.size() * 8 < need + 64) converted.resize((need + 64) / 8);
  char* base = reinterpret_cast<char*>(linear_detail::aligned_to_64(converted.data()));
  for (size_t i = 0; i < jobs.size(); ++i) {
    linear_detail::Job& j = jobs[i];
    if (j.activations == ActivationFormat::BF16) {
      j.xb = reinterpret_cast<uint16_t*>(base + at[i][0]);
    } else if (j.activations == ActivationFormat::Q8) {
      j.xq.quants = reinterpret_cast<int8_t*>(base + at[i][0]);
      j.xq.corrections = reinterpret_cast<int32_t*>(base + at[i][1]);
      j.xq.scale_pairs = reinterpret_cast<float*>(base + at[i][2]);
      j.xq.scales = reinterpret_cast<float*>(base + at[i][3]);
      j.xq.scaled_sums = reinterpret_cast<float*>(base + at[i][4]);
      j.xq.sums = reinterpret_cast<int32_t*>(base + at[i][5]);
      j.xq.blocks = q8_blocks(j.cols), j.xq.stride = linear_detail::q8_activation_stride(j.cols);
    }
  }
  // A thread costs a few microseconds to wake: small products (a GQA model's k / v projections in decode) stay on
  // fewer threads, each given at least ~64k multiply-adds.
  const int threads = products[0].threads > 0 ? products[0].threads : omp_get_max_threads();
  linear_detail::run(jobs.data(), int(jobs.size()), int(std::clamp<int64_t>(work / 65536, 1, threads)));
}

void weight_row(const WeightMatrix& w, int64_t r, float* out) {
  check(r >= 0 && r < w.rows, "row", r, "in [0, w.rows = " + std::to_string(w.rows) + ")");
  if (is_block_format(w.format)) {
    const uint8_t* row = linear_detail::block_row(w.format, w.data, w.row_stride, r);
    for (int64_t u = 0; u < w.cols / linear_detail::kUnit; ++u)
      linear_detail::unit_values(w.format, row, u, out + u * linear_detail::kUnit);
    return;
  }
  if (w.format == WeightFormat::Q8) {
    const int8_t* q = static_cast<const int8_t*>(w.data) + r * w.row_stride;
    const uint16_t* s = w.scales + r * w.scale_stride;
    for (int64_t c = 0; c < w.cols; ++c) out[c] = float(q[c]) * f16_to_float(s[c / kQ8Block]);
    return;
  }
  const DType t = w.format == WeightFormat::F32 ? DType::F32 : w.format == WeightFormat::F16 ? DType::F16 : DType::BF16;
  detail::load_row(w.data, t, r * w.row_stride, w.cols, out);
}

void quantize_q8(const void* src, DType src_dtype, int64_t rows, int64_t cols, int64_t src_row_stride, int8_t* quants,
                 uint16_t* scales, int threads) {
  detail::check_dtype(src_dtype, "src_dtype");
  check(rows >= 1, "rows", rows, ">= 1");
  check(cols >= 1, "cols", cols, ">= 1");
  if (src == nullptr) fail("src", "null", "a non-null pointer");
  if (quants == nullptr) fail("quants", "null", "a non-null pointer");
  if (scales == nullptr) fail("scales", "null", "a non-null pointer");
  check(rows == 1 || src_row_stride >= cols, "src_row_stride", src_row_stride, ">= cols = " + std::to_string(cols));
  check_extent(rows, src_row_stride, cols, "src_row_stride");
  detail::check_threads(threads);
  const int64_t blocks = q8_blocks(cols);
  const int nt = threads > 0 ? threads : omp_get_max_threads();
  // Checked before anything is written: q8 holds no NaN or infinity (one would poison its block's scale), and no
  // weight whose block's scale would overflow f16.
  int64_t bad = -1;  // the first weight refused, as r * cols + c
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> row(static_cast<size_t>(cols));
    detail::load_row(src, src_dtype, r * src_row_stride, cols, row.data());
    for (int64_t c = 0; c < cols; ++c)
      if (!(std::fabs(row[size_t(c)]) <= kQ8MaxWeight)) {
#pragma omp critical(rotary_quantize_q8)
        if (bad < 0 || r * cols + c < bad) bad = r * cols + c;
        break;
      }
  }
  if (bad >= 0) {
    const double v = load_as_double(src, src_dtype, (bad / cols) * src_row_stride + bad % cols);
    fail("weight[" + std::to_string(bad / cols) + "][" + std::to_string(bad % cols) + "]", to_text(v),
         std::isfinite(v) ? "|w| <= 127 x 65504 = " + to_text(kQ8MaxWeight) + " (q8's block scales are f16)"
                          : std::string("a finite value (q8 cannot hold NaN or infinity)"));
  }
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> row(static_cast<size_t>(cols));
    detail::load_row(src, src_dtype, r * src_row_stride, cols, row.data());
    for (int64_t b = 0; b < blocks; ++b) {  // one rounding per weight, against the stored scale
      const int64_t c0 = b * kQ8Block, n = std::min(cols - c0, int64_t(kQ8Block));
      float amax = 0;
      for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(row[size_t(c0 + i)]));
      const uint16_t h = float_to_f16(amax / 127.0f);
      const float s = f16_to_float(h);
      scales[r * blocks + b] = h;
      for (int64_t i = 0; i < n; ++i)
        quants[r * cols + c0 + i] =
            s > 0 ? int8_t(std::clamp(linear_detail::round_away(row[size_t(c0 + i)] / s), -127, 127)) : int8_t(0);
    }
  }
}

}  // namespace rotary
