// The "linear_forward" op cases: y = x W^T (+ bias) (+ y) with weights in every storage format (f32, f16, bf16,
// q8) against the float64 reference - decode (one token) and prefill (tiles of 3 tokens x 4 rows with leftovers,
// column slices, several token chunks), columns that end mid-vector and mid-q8-block, padded weight rows, activation and output
// strides, bias and accumulation (a residual), one and several threads; bf16 weights also with bf16 activations
// (rounded first; the bf16 dot-product instruction at AVX-512 targets where the CPU has it), whose columns end
// mid-vector of that kernel's 32 as well; q8 weights also with q8 activations (quantized per block first; the int8
// dot-product instruction at AVX-512 targets where the CPU has AVX512-VNNI), ending mid-block; llama.cpp's block
// formats (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k: blocks made by ggml_quantize from uniform weights, rows
// padded by whole
// blocks) with q8 activations (AVX2's byte products from AVX2 up) and f32 activations (the float path).
#include <algorithm>
#include <cmath>
#include <memory>

#include "op_harness.h"
#include "rotary/ggml_quants.h"
#include "rotary/linear.h"

namespace rotary::test {
namespace {

struct LinearCaseSpec {
  WeightFormat format = WeightFormat::F32;
  int64_t tokens = 1, rows = 8, cols = 64;
  int64_t row_pad = 0, x_pad = 0, y_pad = 0;  // extra elements per weight / activation / output row
  bool bias = false, accumulate = false;
  ActivationFormat activations = ActivationFormat::F32;
  int threads = 0;
  uint64_t seed = 1;
};

DType storage_of(WeightFormat f) {
  return f == WeightFormat::F16 ? DType::F16 : f == WeightFormat::BF16 ? DType::BF16 : DType::F32;
}

// Inputs and outputs of one run: weights (q8: quants + scales made by quantize_q8 from uniform weights), x, bias,
// y (initial contents random: accumulate adds to them, and without it every written element is replaced).
struct LinearProblem {
  LinearCaseSpec c;
  std::unique_ptr<WatchedBuffer> w, scales, x, bias, y;
  std::vector<std::vector<double>> rows_;  // block formats: each row's weights, exactly

  explicit LinearProblem(const LinearCaseSpec& spec) : c(spec) {
    const int64_t rs = c.cols + c.row_pad;
    if (is_block_format(c.format)) {
      // Each row's blocks by ggml_quantize, then the padding blocks (bytes 0x5A: never read, never written).
      GuardedBuffer source(DType::F32, c.cols);
      const int64_t stride_bytes = weight_row_bytes(c.format, rs);
      w = std::make_unique<WatchedBuffer>("w", DType::F16, (c.rows * stride_bytes + 1) / 2);
      auto* bytes = static_cast<uint8_t*>(w->data());
      std::fill(bytes, bytes + c.rows * stride_bytes, uint8_t(0x5A));
      for (int64_t r = 0; r < c.rows; ++r) {
        fill_uniform(source, c.seed * 1000 + uint64_t(r));
        ggml_quantize(ggml_type_of(c.format), static_cast<const float*>(source.data()), c.cols, bytes + r * stride_bytes);
        rows_.push_back(std::vector<double>(size_t(c.cols)));
        ggml_dequantize_reference(ggml_type_of(c.format), bytes + r * stride_bytes, c.cols, rows_.back().data());
      }
      w->snapshot();
    } else if (c.format == WeightFormat::Q8) {
      GuardedBuffer source(DType::F32, c.rows * c.cols);
      fill_uniform(source, c.seed);
      // int8 quants in a 2-byte buffer (the harness's buffers are typed by DType; guards and snapshots are bytes).
      w = std::make_unique<WatchedBuffer>("w", DType::F16, (c.rows * rs + 1) / 2);
      scales = std::make_unique<WatchedBuffer>("scales", DType::F16, c.rows * q8_blocks(c.cols));  // f16 bits
      std::vector<int8_t> q(size_t(c.rows * c.cols));
      quantize_q8(source.data(), DType::F32, c.rows, c.cols, c.cols, q.data(), static_cast<uint16_t*>(scales->data()));
      auto* quants = static_cast<int8_t*>(w->data());
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t k = 0; k < rs; ++k) quants[r * rs + k] = k < c.cols ? q[size_t(r * c.cols + k)] : int8_t(99);
      w->snapshot(), scales->snapshot();
    } else {
      w = std::make_unique<WatchedBuffer>("w", storage_of(c.format), c.rows * rs);
      fill_uniform(*w, c.seed);
      w->snapshot();
    }
    x = std::make_unique<WatchedBuffer>("x", DType::F32, c.tokens * (c.cols + c.x_pad));
    fill_uniform(*x, c.seed + 1);
    x->snapshot();
    bias = std::make_unique<WatchedBuffer>("bias", DType::F32, c.rows);
    fill_uniform(*bias, c.seed + 2);
    bias->snapshot();
    y = std::make_unique<WatchedBuffer>("y", DType::F32, c.tokens * (c.rows + c.y_pad));
    fill_uniform(*y, c.seed + 3);
    y->snapshot();
    y->allow_writes(y_view(), c.tokens, int(c.rows));
  }
  HeadsView y_view() const { return {y->data(), 1, c.rows + c.y_pad, c.rows}; }
  HeadsView x_view() const { return {x->data(), 1, c.cols + c.x_pad, c.cols}; }
  LinearParams params() {
    LinearParams p;
    p.w.format = c.format, p.w.data = w->data(), p.w.rows = c.rows, p.w.cols = c.cols;
    p.w.row_stride = c.cols + c.row_pad;
    if (scales) p.w.scales = static_cast<const uint16_t*>(scales->data()), p.w.scale_stride = q8_blocks(c.cols);
    p.bias = c.bias ? static_cast<const float*>(bias->data()) : nullptr;
    p.tokens = c.tokens;
    p.x = static_cast<const float*>(x->data()), p.x_stride = c.cols + c.x_pad;
    p.y = static_cast<float*>(y->data()), p.y_stride = c.rows + c.y_pad;
    p.accumulate = c.accumulate, p.activations = c.activations, p.threads = c.threads;
    return p;
  }
  // Weight (r, k) as stored (q8: quant x scale), exactly.
  double weight(int64_t r, int64_t k) const {
    const int64_t i = r * (c.cols + c.row_pad) + k;
    if (is_block_format(c.format)) return rows_[size_t(r)][size_t(k)];
    if (c.format != WeightFormat::Q8) return w->get(i);
    return double(static_cast<const int8_t*>(w->data())[i]) * scales->get(r * q8_blocks(c.cols) + k / kQ8Block);
  }
  // Activation (t, k) as the products take it (bf16 activations: rounded; q8: quant x scale of its block), exactly.
  double activation(int64_t t, int64_t k) const {
    const double v = x->get(t * (c.cols + c.x_pad) + k);
    if (c.activations == ActivationFormat::F32) return v;
    if (c.activations == ActivationFormat::Q8) {
      const int64_t k0 = k / kQ8Block * kQ8Block, n = std::min<int64_t>(kQ8Block, c.cols - k0);
      float block[kQ8Block];
      int8_t q[kQ8Block];
      for (int64_t i = 0; i < n; ++i) block[i] = float(x->get(t * (c.cols + c.x_pad) + k0 + i));
      const float scale = q8_quantize_block(block, n, q);
      return double(q[k - k0]) * double(scale);
    }
    uint16_t b = 0;
    store_from_double(&b, DType::BF16, 0, v);
    return load_as_double(&b, DType::BF16, 0);
  }
};

class LinearCase : public OpCase {
 public:
  explicit LinearCase(LinearCaseSpec c) : c_(c) {}
  std::string op() const override { return "linear_forward"; }
  std::string name() const override {
    std::string s = std::string(weight_format_name(c_.format)) + " T" + std::to_string(c_.tokens) + " N" +
                    std::to_string(c_.rows) + " K" + std::to_string(c_.cols);
    if (c_.activations != ActivationFormat::F32) s += std::string(" x") + activation_format_name(c_.activations);
    if (c_.row_pad) s += " wpad" + std::to_string(c_.row_pad);
    if (c_.x_pad) s += " xpad" + std::to_string(c_.x_pad);
    if (c_.y_pad) s += " ypad" + std::to_string(c_.y_pad);
    if (c_.bias) s += " bias";
    if (c_.accumulate) s += " accumulate";
    if (c_.threads) s += " threads" + std::to_string(c_.threads);
    return identifier(s);
  }
  void setup() override {
    fast_ = std::make_unique<LinearProblem>(c_);
    ref_ = std::make_unique<LinearProblem>(c_);
  }
  void release() override { fast_.reset(), ref_.reset(); }
  void run_reference() override {
    ref_->y->restore();
    linear_forward_reference(ref_->params());
  }
  void run_fast() override {
    fast_->y->restore();
    linear_forward(fast_->params());
  }

  // Each output divided by its condition scale |bias| + |y before| + sum_k |w x| (of the reference's inputs), so
  // that one bound in units of u holds whatever the cancellation (Quantity::LinearOutput).
  std::vector<Output> outputs() const override {
    const std::vector<double> got = fast_->y->gather(fast_->y_view(), c_.tokens, int(c_.rows));
    const std::vector<double> want = ref_->y->gather(ref_->y_view(), c_.tokens, int(c_.rows));
    Output o{"y", {}, {}, tolerance(Quantity::LinearOutput, {.longest_sequence = c_.cols})};
    const LinearProblem& p = *ref_;
    const LinearProblem before(c_);  // y's initial contents (deterministic), which accumulate adds to
    for (int64_t t = 0; t < c_.tokens; ++t)
      for (int64_t r = 0; r < c_.rows; ++r) {
        double scale = c_.bias ? std::fabs(p.bias->get(r)) : 0.0;
        if (c_.accumulate) scale += std::fabs(before.y->get(t * (c_.rows + c_.y_pad) + r));
        for (int64_t k = 0; k < c_.cols; ++k)
          scale += std::fabs(p.weight(r, k) * p.activation(t, k));
        scale = std::max(scale, 1e-300);
        const size_t i = size_t(t * c_.rows + r);
        o.got.push_back(got[i] / scale);
        o.want.push_back(want[i] / scale);
      }
    return {o};
  }
  std::string memory_violations() const override {
    for (const WatchedBuffer* b : {fast_->w.get(), fast_->scales.get(), fast_->x.get(), fast_->bias.get(), fast_->y.get()})
      if (b)
        if (std::string v = b->violations(); !v.empty()) return v;
    return "";
  }

  // One activation element (every output of its token turns non-finite) and, for float formats, one weight
  // (every token's output of its row).
  std::vector<PoisonSite> poison_sites(NonFinite) const override {
    std::vector<PoisonSite> s{{"x", c_.tokens - 1, 0, int(c_.cols / 2)}};
    if (c_.format != WeightFormat::Q8 && !is_block_format(c_.format))
      s.push_back({"w", 0, 0, int(c_.cols - 1)});  // row 0 via `token`
    return s;
  }
  void poison(const PoisonSite& s, double value) override {
    for (LinearProblem* p : {fast_.get(), ref_.get()}) {
      if (s.input == "x") p->x->set(s.token * (c_.cols + c_.x_pad) + s.feature, value), p->x->snapshot();
      else p->w->set(s.token * (c_.cols + c_.row_pad) + s.feature, value), p->w->snapshot();
    }
  }
  std::optional<std::vector<char>> expected_nonfinite(const PoisonSite& s, NonFinite, const std::string&) const override {
    std::vector<char> bad(size_t(c_.tokens * c_.rows), 0);
    for (int64_t t = 0; t < c_.tokens; ++t)
      for (int64_t r = 0; r < c_.rows; ++r)
        bad[size_t(t * c_.rows + r)] = s.input == "x" ? t == s.token : r == s.token;
    return bad;
  }

  PerfCost cost() const override {
    const double weights = double(c_.rows) * double(weight_row_bytes(c_.format, c_.cols));
    return {weights + 4.0 * double(c_.tokens * (c_.cols + 2 * c_.rows)), 2.0 * double(c_.tokens * c_.rows * c_.cols)};
  }

 private:
  LinearCaseSpec c_;
  std::unique_ptr<LinearProblem> fast_, ref_;
};

}  // namespace

OpCases linear_cases() {
  std::vector<LinearCaseSpec> specs;
  uint64_t seed = 1;
  for (WeightFormat f : {WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16, WeightFormat::Q8}) {
    auto add = [&](LinearCaseSpec c) {
      c.format = f, c.seed = seed++;
      specs.push_back(c);
    };
    add({.tokens = 1, .rows = 67, .cols = 96, .bias = true});                  // decode: 16 tiles + 3 rows
    add({.tokens = 1, .rows = 5, .cols = 37, .row_pad = 3});                   // mid-vector, mid-block ends
    add({.tokens = 1, .rows = 1, .cols = 1});                                  // one weight
    add({.tokens = 9, .rows = 70, .cols = 200, .row_pad = 8, .x_pad = 5, .y_pad = 3, .bias = true,
         .accumulate = true});                                                 // prefill: 2 token tiles + 1
    add({.tokens = 130, .rows = 19, .cols = 1100, .threads = 3});             // 3 token chunks, 3 threads
    add({.tokens = 7, .rows = 13, .cols = 33, .accumulate = true, .threads = 1});
    add({.tokens = 3, .rows = 2, .cols = 1, .y_pad = 1, .bias = true});
    // Rows past kLongRowBytes (16 KB, core/src/linear_kernel.h), which decode reads 4 at a time: 2 tiles + 1 row,
    // ending mid-vector and mid-block; then a token tile and one token left over.
    const int64_t long_cols = 16 * 1024 / weight_element_size(f) + 37;
    add({.tokens = 1, .rows = 9, .cols = long_cols, .bias = true});
    add({.tokens = 5, .rows = 9, .cols = long_cols, .threads = 2});
    if (f == WeightFormat::BF16) {  // bf16 activations: the dot-product kernel's tiles, tails and shared rounding
      constexpr ActivationFormat b = ActivationFormat::BF16;
      add({.tokens = 1, .rows = 67, .cols = 96, .bias = true, .activations = b});
      add({.tokens = 1, .rows = 5, .cols = 37, .row_pad = 3, .activations = b});
      add({.tokens = 1, .rows = 1, .cols = 1, .activations = b});
      add({.tokens = 9, .rows = 70, .cols = 200, .row_pad = 8, .x_pad = 5, .y_pad = 3, .bias = true,
           .accumulate = true, .activations = b});
      add({.tokens = 130, .rows = 19, .cols = 1100, .activations = b, .threads = 3});
      add({.tokens = 7, .rows = 13, .cols = 63, .accumulate = true, .activations = b, .threads = 1});
      add({.tokens = 5, .rows = 9, .cols = 32, .x_pad = 1, .activations = b});
      add({.tokens = 1, .rows = 9, .cols = long_cols, .activations = b});
    }
    if (f == WeightFormat::Q8) {  // q8 activations: the int8 dot-product kernel's tiles, short last blocks, sharing
      constexpr ActivationFormat q = ActivationFormat::Q8;
      add({.tokens = 1, .rows = 67, .cols = 96, .bias = true, .activations = q});
      add({.tokens = 1, .rows = 5, .cols = 37, .row_pad = 3, .activations = q});
      add({.tokens = 1, .rows = 1, .cols = 1, .activations = q});
      add({.tokens = 9, .rows = 70, .cols = 200, .row_pad = 8, .x_pad = 5, .y_pad = 3, .bias = true,
           .accumulate = true, .activations = q});
      add({.tokens = 130, .rows = 19, .cols = 1100, .activations = q, .threads = 3});
      add({.tokens = 7, .rows = 13, .cols = 63, .accumulate = true, .activations = q, .threads = 1});
      add({.tokens = 5, .rows = 9, .cols = 32, .x_pad = 1, .activations = q});
      add({.tokens = 1, .rows = 9, .cols = long_cols, .bias = true, .activations = q});
      add({.tokens = 5, .rows = 9, .cols = long_cols, .activations = q, .threads = 2});
    }
  }
  // llama.cpp's block formats: q8 activations (the byte-product kernel's small batches row by row, 1-2 tokens a row in
  // Tile, 3-8 in LaneTile's lane sets; prefill in panels of 8 rows: 70 and 19 rows end mid-panel, 1024 / b + 1
  // blocks span two panel slices) and f32 activations (the float path); rows padded by whole blocks.
  for (WeightFormat f : {WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q5_0,
                         WeightFormat::Q5_1, WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K}) {
    const int64_t b = weight_block_size(f);
    for (ActivationFormat a : {ActivationFormat::Q8, ActivationFormat::F32}) {
      auto add = [&](LinearCaseSpec c) {
        c.format = f, c.activations = a, c.seed = seed++;
        specs.push_back(c);
      };
      add({.tokens = 1, .rows = 67, .cols = 3 * b, .bias = true});
      add({.tokens = 1, .rows = 1, .cols = b});
      add({.tokens = 9, .rows = 70, .cols = 2 * b, .row_pad = b, .x_pad = 5, .y_pad = 3, .bias = true, .accumulate = true});
      add({.tokens = 7, .rows = 13, .cols = b, .accumulate = true, .threads = 1});
      add({.tokens = 130, .rows = 19, .cols = (1024 / b + 1) * b, .threads = 3});
      add({.tokens = 3, .rows = 6, .cols = 4 * b, .x_pad = 1, .threads = 2});
      // Rows of whole groups of 8 units and a last group of 3 (decode's and small batches' tiles), as a model's are:
      // one token (Tile), one lane set of 4 tokens, two sets with the second partly zeros and two whole (LaneTile).
      add({.tokens = 1, .rows = 5, .cols = 19 * b});
      add({.tokens = 4, .rows = 3, .cols = 17 * b, .threads = 2});
      add({.tokens = 6, .rows = 5, .cols = 19 * b, .x_pad = 3, .accumulate = true, .threads = 2});
      add({.tokens = 8, .rows = 3, .cols = 17 * b, .bias = true});
    }
  }
  OpCases out;
  for (const LinearCaseSpec& s : specs) out.push_back(std::make_unique<LinearCase>(s));
  return out;
}

}  // namespace rotary::test
