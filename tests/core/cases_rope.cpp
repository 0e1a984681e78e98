// The "rope" op cases: rope_apply (Highway SIMD + OpenMP) against rope_apply_reference (float64) across layouts,
// rotary fractions, odd pair counts, storage dtypes, strides, positions (to 2^24 and the int64 limits),
// directions, GQA/MQA/no k, in and out of place, attention factors, every scaling type and the threaded path.
// Rotated elements are within the RopeElement tolerance; pass-through features equal the reference exactly;
// padding, other batch rows and (out of place) the input are untouched.
#include "cases_rope.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>

#include "rotary/rope_spec.h"

namespace rotary::test {

std::vector<double> default_inv_freq(int pairs, double base) {
  std::vector<double> inv(static_cast<size_t>(pairs));
  for (int i = 0; i < pairs; ++i) inv[size_t(i)] = std::pow(base, -2.0 * i / (2.0 * pairs));
  return inv;
}

RopeFreqs rope_test_freqs(int D, int r, RopeLayout layout, double attention_factor) {
  RopeFreqs f;
  f.head_dim = D;
  f.rotary_dim = r;
  f.layout = layout;
  f.inv_freq = default_inv_freq(r / 2);
  f.attention_factor = attention_factor;
  return f;
}

namespace {

// Where a [tokens, heads, D] view sits in its buffer.
struct Geometry {
  int64_t offset = 0, heads = 1, token_stride = 0, head_stride = 0;
};
enum class Strides { Packed, PaddedHeads, TokenGap, SbhdView, HeadMajor };
const char* strides_name(Strides s) {
  switch (s) {
    case Strides::Packed: return "packed";
    case Strides::PaddedHeads: return "padded_heads";
    case Strides::TokenGap: return "token_gap";
    case Strides::SbhdView: return "sbhd_view";
    case Strides::HeadMajor: return "head_major";
  }
  return "?";
}
Geometry make_geometry(Strides kind, int64_t heads, int D, int64_t tokens) {
  switch (kind) {
    case Strides::Packed: return {0, heads, heads * D, D};                  // [T, H, D]
    case Strides::PaddedHeads: return {0, heads, heads * (D + 5), D + 5};  // [T, H, D + 5][..., :D]
    case Strides::TokenGap: return {0, heads, heads * D + 13, D};          // [T, H*D + 13]
    case Strides::SbhdView: return {heads * D, heads, 3 * heads * D, D};   // [S, B=3, H, D][:, 1]
    case Strides::HeadMajor: return {0, heads, D, tokens * D};             // [1, H, S, D].transpose(1, 2)
  }
  return {};
}
int64_t buffer_elements(const Geometry& g, int64_t tokens, int D) {
  return g.offset + (tokens - 1) * g.token_stride + (g.heads - 1) * g.head_stride + D;
}
HeadsView view_of(GuardedBuffer& b, const Geometry& g) {
  return {static_cast<char*>(b.data()) + g.offset * int64_t(dtype_size(b.dtype())), g.heads, g.token_stride,
          g.head_stride};
}

struct RopeCaseSpec {
  std::string label;  // what the case is for, when it is not the sweep
  DType dtype = DType::F32;
  RopeLayout layout = RopeLayout::HalfSplit;
  int D = 64, r = 64;
  int64_t tokens = 5, q_heads = 4, k_heads = 2;  // k_heads 0: no k
  Strides strides = Strides::Packed;
  RopeDirection direction = RopeDirection::Forward;
  bool in_place = true;
  double attention_factor = 1.0;
  uint64_t seed = 1;
  std::optional<RopeFreqs> freqs;                 // when set, replaces D, r, layout, attention_factor
  std::optional<std::vector<int64_t>> positions;  // when set, [tokens] positions (else random up to 1e6)
  bool poison = false;                            // in the non-finite mode
};

class RopeCase : public OpCase {
 public:
  explicit RopeCase(RopeCaseSpec c) : c_(std::move(c)) {
    if (c_.freqs) c_.D = c_.freqs->head_dim, c_.r = c_.freqs->rotary_dim, c_.layout = c_.freqs->layout;
  }
  std::string op() const override { return "rope"; }
  std::string name() const override {
    static const char* dirs[] = {"forward", "inverse", "transpose"};
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s %s %s D%d r%d T%lld hq%lld hk%lld %s %s %s a%g", c_.label.c_str(),
                  dtype_name(c_.dtype), c_.layout == RopeLayout::Interleaved ? "interleaved" : "half_split", c_.D,
                  c_.r, (long long)c_.tokens, (long long)c_.q_heads, (long long)c_.k_heads, strides_name(c_.strides),
                  dirs[int(c_.direction)], c_.in_place ? "in_place" : "out_of_place", attention_factor());
    return identifier(buf);
  }

  void setup() override {
    std::mt19937_64 rng(c_.seed);
    pos_.assign(size_t(c_.tokens), 0);
    std::uniform_int_distribution<int64_t> u(0, 1000000);
    for (auto& p : pos_) p = u(rng);
    pos_[0] = 0;
    if (c_.positions) pos_ = *c_.positions;
    f_ = c_.freqs ? *c_.freqs : rope_test_freqs(c_.D, c_.r, c_.layout, c_.attention_factor);
    q_ = make_view("q", c_.q_heads, c_.seed * 7 + 1);
    if (c_.k_heads > 0) k_ = make_view("k", c_.k_heads, c_.seed * 7 + 2);
  }
  void release() override { q_.reset(), k_.reset(); }

  void run_reference() override { run(&View::ref, rope_apply_reference); }
  void run_fast() override { run(&View::fast, rope_apply); }

  std::vector<Output> outputs() const override {
    std::vector<Output> out;
    const double s = c_.direction == RopeDirection::Inverse ? 1.0 / f_.attention_factor : f_.attention_factor;
    const Tolerance rotated = tolerance(Quantity::RopeElement, {.dtype = c_.dtype, .scale = s * 1.0});  // |x| < 1
    for (const View* v : views()) {
      Output rot{v->name, {}, {}, rotated}, pass{v->name + "_passthrough", {}, {}, {Metric::Abs, 0, 0}};
      const HeadsView fast = view_of(*v->fast, v->out_g), ref = view_of(*v->ref, v->out_g);
      const std::vector<double> got = v->fast->gather(fast, c_.tokens, c_.D), want = v->ref->gather(ref, c_.tokens, c_.D);
      for (size_t i = 0; i < got.size(); ++i) {
        Output& o = int(i % size_t(c_.D)) < c_.r ? rot : pass;
        o.got.push_back(got[i]), o.want.push_back(want[i]);
      }
      out.push_back(std::move(rot));
      if (c_.r < c_.D) out.push_back(std::move(pass));
    }
    return out;
  }

  std::string memory_violations() const override {
    for (const View* v : views()) {
      if (std::string s = v->fast->violations(); !s.empty()) return s;
      if (!c_.in_place)  // out of place, the input is read only
        if (std::string s = v->in->violations(); !s.empty()) return s;
    }
    return "";
  }

  // One element at a time: rotated features at both ends of the pair range, pass-through features, both tokens
  // (position 12345 and 2^24), q and k.
  std::vector<PoisonSite> poison_sites(NonFinite) const override {
    if (!c_.poison) return {};
    std::vector<PoisonSite> sites;
    for (int d : {0, 3, c_.r / 2 - 1, c_.r / 2, c_.r - 1, c_.r, c_.D - 1}) sites.push_back({"q", 0, 0, d});
    for (int d : {17, 60}) sites.push_back({"q", 1, 0, d});
    if (c_.k_heads > 0) sites.push_back({"k", 1, c_.k_heads - 1, 5});
    return sites;
  }
  void poison(const PoisonSite& s, double value) override {
    View& v = s.input == "q" ? *q_ : *k_;
    for (WatchedBuffer* b : c_.in_place ? std::vector<WatchedBuffer*>{v.fast.get(), v.ref.get()}
                                        : std::vector<WatchedBuffer*>{v.in.get()}) {
      const Geometry& g = c_.in_place ? v.out_g : v.in_g;
      b->set(g.offset + s.token * g.token_stride + s.head * g.head_stride + s.feature, value);
      b->snapshot();
    }
  }
  // A non-finite feature reaches itself and, when rotated, its rotation partner; nothing else.
  std::optional<std::vector<char>> expected_nonfinite(const PoisonSite& s, NonFinite,
                                                      const std::string& output) const override {
    const View& v = output.starts_with("q") ? *q_ : *k_;
    const bool passthrough = output.ends_with("_passthrough");
    const int width = passthrough ? c_.D - c_.r : c_.r;
    std::vector<char> m(size_t(c_.tokens * v.heads * width), 0);
    if (!output.starts_with(s.input)) return m;
    auto mark = [&](int d) { m[size_t((s.token * v.heads + s.head) * width + d)] = 1; };
    if (s.feature >= c_.r) {
      if (passthrough) mark(s.feature - c_.r);
    } else if (!passthrough) {
      const int i = c_.layout == RopeLayout::Interleaved ? s.feature / 2 : s.feature % (c_.r / 2);
      const RopePair pair = rope_pair(c_.layout, c_.r, i);
      mark(pair.a), mark(pair.b);
    }
    return m;
  }

  PerfCost cost() const override {
    const double elements = double(c_.tokens * (c_.q_heads + c_.k_heads) * c_.D);
    // Read and write every element; 6 flops per rotated pair (4 multiplies, 2 adds).
    return {2 * elements * double(dtype_size(c_.dtype)), double(c_.tokens * (c_.q_heads + c_.k_heads)) * c_.r / 2 * 6};
  }

 private:
  // Buffers of one view (q or k): the input, and what the fast and reference kernels write into.
  struct View {
    std::string name;
    int64_t heads = 0;
    Geometry in_g, out_g;
    std::unique_ptr<WatchedBuffer> in, fast, ref;
  };

  double attention_factor() const { return c_.freqs ? c_.freqs->attention_factor : c_.attention_factor; }

  std::unique_ptr<View> make_view(const std::string& name, int64_t heads, uint64_t seed) const {
    auto v = std::make_unique<View>();
    v->name = name;
    v->heads = heads;
    v->in_g = make_geometry(c_.strides, heads, c_.D, c_.tokens);
    // Out of place writes to a differently strided view (padded in -> packed out, packed in -> gapped out).
    v->out_g = c_.in_place ? v->in_g
                           : make_geometry(c_.strides == Strides::Packed ? Strides::TokenGap : Strides::Packed, heads,
                                           c_.D, c_.tokens);
    v->in = std::make_unique<WatchedBuffer>(name + "_in", c_.dtype, buffer_elements(v->in_g, c_.tokens, c_.D));
    fill_uniform(*v->in, seed);
    v->in->snapshot();
    const int64_t n_out = buffer_elements(v->out_g, c_.tokens, c_.D);
    v->fast = std::make_unique<WatchedBuffer>(name + "_out", c_.dtype, n_out);
    v->ref = std::make_unique<WatchedBuffer>(name + "_out_reference", c_.dtype, n_out);
    if (c_.in_place) {
      std::memcpy(v->fast->data(), v->in->data(), size_t(n_out) * dtype_size(c_.dtype));
    } else {
      fill_uniform(*v->fast, seed + 1000);  // stale output contents: padding must stay as it was
    }
    std::memcpy(v->ref->data(), v->fast->data(), size_t(n_out) * dtype_size(c_.dtype));
    for (WatchedBuffer* b : {v->fast.get(), v->ref.get()}) {
      b->allow_writes(view_of(*b, v->out_g), c_.tokens, c_.D);
      b->snapshot();
    }
    return v;
  }

  std::vector<const View*> views() const {
    std::vector<const View*> v{q_.get()};
    if (k_) v.push_back(k_.get());
    return v;
  }

  void run(std::unique_ptr<WatchedBuffer> View::*out, void (*apply)(const RopeParams&)) {
    RopeParams p;
    p.freqs = &f_;
    p.tokens = c_.tokens;
    p.positions = pos_.data();
    p.dtype = c_.dtype;
    p.direction = c_.direction;
    auto bind = [&](View& v, HeadsView& in, HeadsView& o) {
      WatchedBuffer& b = *(v.*out);
      b.restore();  // in place: start from the input again
      o = view_of(b, v.out_g);
      in = c_.in_place ? o : view_of(*v.in, v.in_g);
    };
    bind(*q_, p.q_in, p.q_out);
    if (k_) bind(*k_, p.k_in, p.k_out);
    apply(p);
  }

  RopeCaseSpec c_;
  RopeFreqs f_;
  std::vector<int64_t> pos_;
  std::unique_ptr<View> q_, k_;
};

struct Shape {
  int D, r;
  int64_t k_heads;
};

}  // namespace

OpCases rope_cases() {
  OpCases cases;
  auto add = [&](RopeCaseSpec c) { cases.push_back(std::make_unique<RopeCase>(std::move(c))); };

  // The sweep: full rotation (64 pairs), half (16 pairs), 3 pairs (shorter than any vector), 35 pairs (vectors
  // + a tail); k heads: MHA, GQA, MQA, none; every stride kind, direction, in/out of place, a = 1 and 1.17.
  const Shape shapes[] = {{128, 128, 4}, {64, 32, 2}, {20, 6, 1}, {96, 70, 0}};
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F64})
    for (RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved}) {
      uint64_t seed = 1;
      for (const Shape& shape : shapes)
        for (Strides strides :
             {Strides::Packed, Strides::PaddedHeads, Strides::TokenGap, Strides::SbhdView, Strides::HeadMajor})
          for (RopeDirection dir : {RopeDirection::Forward, RopeDirection::Inverse, RopeDirection::Transpose})
            for (bool in_place : {true, false})
              for (double a : {1.0, 1.17}) {
                RopeCaseSpec c;
                c.dtype = dtype, c.layout = layout, c.D = shape.D, c.r = shape.r, c.k_heads = shape.k_heads;
                c.strides = strides, c.direction = dir, c.in_place = in_place, c.attention_factor = a;
                c.seed = seed++;
                add(c);
              }
    }

  // Large enough to pass the OpenMP threshold (tokens * heads * D >= 2 * 32768 elements).
  {
    RopeCaseSpec c;
    c.label = "threads";
    c.D = 128, c.r = 128, c.tokens = 300, c.q_heads = 4, c.k_heads = 1;
    c.strides = Strides::PaddedHeads, c.in_place = false;
    add(c);
    c.dtype = DType::BF16, c.layout = RopeLayout::Interleaved, c.in_place = true;
    add(c);
  }

  // Every scaling type, through RopeSpec::freqs: the kernel only sees inv_freq and the attention factor, but the
  // frequencies differ in range (long wavelengths, per-pair factors) and yarn/longrope bring attention factors != 1.
  uint64_t seed = 100;
  for (RopeScaling scaling : {RopeScaling::None, RopeScaling::Linear, RopeScaling::NtkFixed, RopeScaling::NtkMixed,
                              RopeScaling::Dynamic, RopeScaling::Yarn, RopeScaling::Llama3, RopeScaling::LongRope,
                              RopeScaling::Explicit}) {
    RopeSpec spec;
    spec.head_dim = 96;
    spec.rotary_dim = 64;
    spec.layout = seed % 2 ? RopeLayout::Interleaved : RopeLayout::HalfSplit;
    spec.scaling = scaling;
    spec.factor = 8.0;
    spec.max_position_embeddings = 32768;
    spec.original_max_position_embeddings = 4096;
    for (int j = 0; j < 32; ++j) {
      spec.short_factor.push_back(1.0 + 0.05 * j);
      spec.long_factor.push_back(1.0 + 0.5 * j);
      spec.freq_factors.push_back(j < 16 ? 1.0 : 4.0);
    }
    const RopeFreqs f = spec.freqs(65536);  // beyond max_position_embeddings: dynamic and longrope's long forms
    for (DType dtype : {DType::F32, DType::BF16})
      for (RopeDirection dir : {RopeDirection::Forward, RopeDirection::Inverse}) {
        RopeCaseSpec c;
        c.label = "scaling_" + std::string(scaling_name(scaling));
        c.freqs = f, c.dtype = dtype, c.direction = dir, c.strides = Strides::PaddedHeads;
        c.in_place = dir == RopeDirection::Forward;
        c.seed = seed++;
        add(c);
      }
  }

  // Positions around 2^24; 2e8 and 3e8 either side of the end of the fast angle reduction (|angle| <= 2e8 with
  // inv_freq[0] = 1); beyond it positions up to the int64 limits take the exact libm path. F64 storage resolves
  // errors ~1e-16, so an inexact reduction that fp32 would hide shows up there; every target, since with FMA the
  // reduction stays exact further out than without (SSE4 and below).
  const int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  const std::vector<int64_t> far = {(1 << 24) - 1, 1 << 24,   (1 << 24) + 1, 199999999,        200000001,
                                    300000000,     600000001, 700000000,     700000001,        int64_t(1) << 31,
                                    int64_t(1) << 40, int64_t(1) << 53, kMax, kMin, -5};
  for (RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved}) {
    for (DType dtype : {DType::F64, DType::F32}) {
      RopeCaseSpec c;
      c.label = "far_positions";
      c.dtype = dtype, c.layout = layout, c.tokens = int64_t(far.size()), c.k_heads = 0, c.positions = far;
      c.q_heads = dtype == DType::F32 ? 1 : 4;
      add(c);
    }
    // Position one million alone (f32): the naive fp32-angle kernel misses this bound (test_rope_kernels.cpp).
    RopeCaseSpec c;
    c.label = "position_1e6";
    c.D = 128, c.r = 128, c.layout = layout, c.tokens = 1, c.q_heads = 1, c.k_heads = 0;
    c.positions = std::vector<int64_t>{1000000}, c.seed = 7;
    add(c);
  }

  // Non-finite inputs: rotated and pass-through features, positions 12345 and 2^24, every dtype (bf16 rounding
  // has no NaN branch; see RoundToBf16Bits).
  for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::F64})
    for (RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved}) {
      RopeCaseSpec c;
      c.label = "nonfinite";
      c.dtype = dtype, c.layout = layout, c.D = 96, c.r = 70, c.tokens = 2, c.q_heads = 1, c.k_heads = 1;
      c.positions = std::vector<int64_t>{12345, 1 << 24}, c.seed = 11, c.poison = true;
      add(c);
    }
  return cases;
}

}  // namespace rotary::test
