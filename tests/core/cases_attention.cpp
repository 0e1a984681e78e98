// The "attention_forward" and "attention_backward" op cases: fused attention (every rotary position mode) against
// the float64 materialised reference - a table of cases (mode x head dim x GQA x causal x packed sequences x
// dtype x memory layout), guard zones and view gaps, NaN/Inf parity ("NaN reaches exactly the rows that see it"),
// gradients (kernel backward against the reference backward, and both against central differences of the
// reference forward on small float64 problems).
#include <algorithm>
#include <limits>
#include <tuple>

#include "attention_cases.h"
#include "op_harness.h"

namespace rotary::test {
namespace {

// The parts the forward and backward cases share: the problem, and the poison sites of the non-finite mode.
class AttentionCaseBase : public OpCase {
 public:
  explicit AttentionCaseBase(AttnCase c) : c_(std::move(c)) {}
  std::string name() const override { return identifier(describe(c_)); }
  void setup() override { pr_ = std::make_unique<AttnProblem>(c_); }
  void release() override { pr_.reset(), fast_ = {}, ref_ = {}; }
  void poison(const PoisonSite& s, double value) override {
    pr_->set(input(s.input), s.token, s.head, s.feature, value);
  }
  PerfCost cost() const override {
    // Scores and weighted sums: 4 D flops per (query head, key) pair a query sees; q, k, v read, o written.
    double pairs = 0;
    for (int64_t l : c_.seqlens) pairs += c_.causal ? double(l) * double(l + 1) / 2 : double(l) * double(l);
    int64_t tokens = 0;
    for (int64_t l : c_.seqlens) tokens += l;
    return {double(tokens * (2 * c_.Hq + 2 * c_.Hkv) * c_.D) * double(dtype_size(c_.dtype)),
            4.0 * c_.D * double(c_.Hq) * pairs};
  }

 protected:
  const HeadsView& input(const std::string& name) const {
    return name == "q" ? pr_->q() : name == "k" ? pr_->k() : pr_->v();
  }
  ToleranceInputs tolerance_inputs() const { return {.dtype = c_.dtype, .max_position = max_position(c_)}; }

  AttnCase c_;
  std::unique_ptr<AttnProblem> pr_;
  AttnProblem::Outputs fast_, ref_;
};

std::vector<double> table_values(const GuardedBuffer& b) {
  std::vector<double> v(static_cast<size_t>(b.size()));
  for (int64_t i = 0; i < b.size(); ++i) v[size_t(i)] = b.get(i);
  return v;
}

class AttentionForwardCase : public AttentionCaseBase {
 public:
  AttentionForwardCase(AttnCase c, std::vector<PoisonSite> nan_sites = {}, std::vector<PoisonSite> inf_sites = {})
      : AttentionCaseBase(std::move(c)), nan_sites_(std::move(nan_sites)), inf_sites_(std::move(inf_sites)) {}
  std::string op() const override { return "attention_forward"; }

  void run_reference() override {
    ref_ = pr_->outputs();
    attention_forward_reference(pr_->params(ref_));
  }
  void run_fast() override {
    fast_ = pr_->outputs();  // fresh buffers, o filled with the marker so that writes outside the view show
    attention_forward(pr_->params(fast_));
  }
  std::vector<Output> outputs() const override {
    return {{"o", pr_->gather(fast_.ov), pr_->gather(ref_.ov), tolerance(Quantity::AttentionOutput, tolerance_inputs())},
            {"lse", fast_.lse->to_double(), ref_.lse->to_double(),
             tolerance(Quantity::AttentionLse, tolerance_inputs())}};
  }
  std::string memory_violations() const override {
    if (!pr_->gaps_untouched(*fast_.o, fast_.ov)) return "write outside o";
    if (!fast_.lse->guards_intact()) return "write outside lse";
    return "";
  }

  std::vector<PoisonSite> poison_sites(NonFinite kind) const override {
    return kind == NonFinite::NaN ? nan_sites_ : inf_sites_;
  }
  // A NaN in q_i makes row i (all features, and its lse) NaN; a NaN in k_j makes every row that sees key j NaN
  // (same sequence, a query head of j's group, and i >= j when causal); a NaN in feature d of v_j makes feature d
  // of those rows NaN (RoPER: also d's rotation partner) and leaves lse finite. Nothing else. (Inf: parity with
  // the reference only - under RoPER an Inf value meets R(-pos_i) R(pos_j) = I as inf - inf, so the fused kernel
  // also turns the rotation partner of an Inf feature non-finite in row j itself, docs/attention.md.)
  std::optional<std::vector<char>> expected_nonfinite(const PoisonSite& site, NonFinite kind,
                                                      const std::string& output) const override {
    if (kind != NonFinite::NaN) return std::nullopt;
    int64_t seq_begin = 0, seq_end = 0;
    for (int64_t l : c_.seqlens) {
      seq_begin = seq_end, seq_end += l;
      if (seq_end > site.token) break;
    }
    const int rot = c_.rotary_dim ? c_.rotary_dim : c_.D;
    const int partner = site.feature >= rot ? site.feature
                        : c_.layout == RopeLayout::Interleaved
                            ? (site.feature ^ 1)
                            : (site.feature < rot / 2 ? site.feature + rot / 2 : site.feature - rot / 2);
    const int64_t group = c_.Hq / c_.Hkv;
    const char tensor = site.input[0];
    std::vector<char> o_nan, lse_nan;
    for (int64_t t = 0; t < pr_->tokens(); ++t)
      for (int64_t h = 0; h < c_.Hq; ++h) {
        const bool row = tensor == 'q' ? t == site.token && h == site.head
                                       : t >= seq_begin && t < seq_end && h / group == site.head &&
                                             (!c_.causal || t >= site.token);
        lse_nan.push_back(row && tensor != 'v');
        for (int d = 0; d < c_.D; ++d)
          o_nan.push_back(row && (tensor != 'v' || d == site.feature || (c_.roper && d == partner)));
      }
    return output == "o" ? o_nan : lse_nan;
  }

 private:
  std::vector<PoisonSite> nan_sites_, inf_sites_;
};

class AttentionBackwardCase : public AttentionCaseBase {
 public:
  AttentionBackwardCase(AttnCase c, bool finite_differences)
      : AttentionCaseBase(std::move(c)), finite_differences_(finite_differences) {}
  std::string op() const override { return "attention_backward"; }

  void run_reference() override {
    ref_ = pr_->outputs();
    attention_backward_reference(pr_->grad_params(ref_));
  }
  // The fused backward takes o and lse from the fused forward (timed together in perf mode); the reference
  // recomputes all.
  void run_fast() override {
    fast_ = pr_->outputs();
    const AttentionGradParams g = pr_->grad_params(fast_);
    attention_forward(g.fwd);
    attention_backward(g);
  }
  std::vector<Output> outputs() const override {
    const Tolerance tol = tolerance(Quantity::AttentionGradient, tolerance_inputs());
    std::vector<Output> outs = {{"dq", pr_->gather(fast_.dqv), pr_->gather(ref_.dqv), tol},
                                {"dk", pr_->gather(fast_.dkv), pr_->gather(ref_.dkv), tol},
                                {"dv", pr_->gather(fast_.dvv), pr_->gather(ref_.dvv), tol}};
    if (fast_.dt5)
      outs.push_back({"dt5_table", table_values(*fast_.dt5), table_values(*ref_.dt5),
                      tolerance(Quantity::AttentionBiasGradient, tolerance_inputs())});
    return outs;
  }
  std::string memory_violations() const override {
    if (fast_.dt5 && !fast_.dt5->guards_intact()) return "write outside dt5_table";
    if (!pr_->gaps_untouched(*fast_.dq, fast_.dqv)) return "write outside dq";
    if (!pr_->gaps_untouched(*fast_.dk, fast_.dkv)) return "write outside dk";
    if (!pr_->gaps_untouched(*fast_.dv, fast_.dvv)) return "write outside dv";
    return "";
  }

  bool finite_differences() const override { return finite_differences_; }
  // L = sum dout . o of the reference forward.
  double reference_loss() override {
    auto out = pr_->outputs();
    attention_forward_reference(pr_->params(out));
    const std::vector<double> o = pr_->gather(out.ov), dout = pr_->gather(pr_->dout());
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += dout[i] * o[i];
    return l;
  }
  std::vector<GradientInput> gradient_inputs() override {
    std::vector<GradientInput> in;
    const std::pair<const char*, const HeadsView*> grads[] = {{"dq", &fast_.dqv}, {"dk", &fast_.dkv}, {"dv", &fast_.dvv}};
    const HeadsView* ref_grads[] = {&ref_.dqv, &ref_.dkv, &ref_.dvv};
    for (int i = 0; i < 3; ++i) {
      const HeadsView* x = &input(std::string(1, "qkv"[i]));
      const int64_t D = c_.D;
      // Element e of the input in [token][head][feature] order.
      auto at = [x, D](int64_t e) { return std::tuple{e / D / x->heads, (e / D) % x->heads, int(e % D)}; };
      in.push_back({grads[i].first, [this, x, D] { return pr_->tokens() * x->heads * D; },
                    [this, x, at](int64_t e) {
                      auto [t, h, d] = at(e);
                      return pr_->get(*x, t, h, d);
                    },
                    [this, x, at](int64_t e, double v) {
                      auto [t, h, d] = at(e);
                      pr_->set(*x, t, h, d, v);
                    },
                    pr_->gather(*grads[i].second), pr_->gather(*ref_grads[i])});
    }
    if (GuardedBuffer* table = pr_->t5_table())
      in.push_back({"dt5_table", [table] { return table->size(); }, [table](int64_t e) { return table->get(e); },
                    [table](int64_t e, double v) { table->set(e, v); }, table_values(*fast_.dt5),
                    table_values(*ref_.dt5)});
    return in;
  }
  // Inputs are uniform in [-1, 1): gradients are compared at that scale at least.
  Tolerance finite_difference_tolerance() const override { return tolerance(Quantity::FiniteDifference, {.floor = 1}); }

 private:
  bool finite_differences_;
};

// The forward table: a rotating walk through the axes (coprime lengths), so every mode meets every dim, dtype
// and layout; ten more steps give every mode the head-major layout (heads outermost, a transposed [1, H, S, D]).
std::vector<AttnCase> forward_table() {
  struct ModeSpec {
    PositionMode mode;
    bool roper;
    int64_t window;
    double k;
    int64_t logn;
  };
  // Windows 12 and 40 against 64-key tiles: sequences of 130 have near, far and straddling tiles.
  const std::vector<ModeSpec> modes = {
      {PositionMode::None, false, 0, 1, 0},         {PositionMode::Rope, false, 0, 1, 0},
      {PositionMode::Rerope, false, 12, 1, 0},      {PositionMode::LeakyRerope, false, 40, 4, 0},
      {PositionMode::Rope, true, 0, 1, 0},          {PositionMode::Rerope, true, 40, 1, 0},
      {PositionMode::LeakyRerope, true, 12, 2.5, 0}, {PositionMode::Rope, false, 0, 1, 16},
      {PositionMode::Rerope, false, 40, 1, 24},     {PositionMode::LeakyRerope, true, 12, 8, 16},
  };
  const std::vector<int> dims = {16, 40, 64, 80, 96, 128, 256, 72};
  const std::vector<std::pair<int, int>> heads = {{2, 2}, {4, 1}, {4, 2}};
  const std::vector<std::vector<int64_t>> lens = {{1, 7, 33, 130}, {130}, {65, 64}, {7, 0, 1, 90}};
  const std::vector<DType> dtypes = {DType::F32, DType::F16, DType::BF16, DType::F64};
  const std::vector<MemLayout> mems = {MemLayout::Contiguous, MemLayout::Padded, MemLayout::FusedQkv};
  std::vector<AttnCase> cases;
  for (int i = 0; i < 50; ++i) {
    const ModeSpec& m = modes[size_t(i % 10)];
    AttnCase c;
    c.name = "walk" + std::to_string(i);
    c.mode = m.mode, c.roper = m.roper, c.window = m.window, c.leaky_k = m.k, c.logn_train = m.logn;
    c.D = dims[size_t(i % 8)];
    c.Hq = heads[size_t(i % 3)].first, c.Hkv = heads[size_t(i % 3)].second;
    c.seqlens = lens[size_t(i % 4)];
    c.causal = (i % 7) != 3 && (i % 7) != 5;
    c.dtype = dtypes[size_t((i / 2) % 4)];
    c.mem = i < 40 ? mems[size_t(i % 3)] : MemLayout::HeadMajor;
    if (i % 5 == 1) c.position_offset = 1000;  // explicit positions with gaps, far from 0
    if (!c.causal && i % 2 == 1) c.position_offset = 0, c.shuffle_positions = true;  // any order when not causal
    if (c.roper && c.D > 128) c.D = 96;  // the reference rotates values per (query, key) pair: keep it quick
    if (i % 6 == 2) c.rotary_dim = c.D / 2 - (c.D / 2) % 2;  // partial rotation
    if (i % 4 == 3) c.layout = RopeLayout::Interleaved;
    if (i % 9 == 4) c.attention_factor = 1.15;
    if (i % 8 == 6) c.softmax_scale = 0.3;
    cases.push_back(c);
  }
  // Score biases (ALiBi, T5) in every position mode. Sequences of 130 with explicit positions (gaps of index / 5)
  // reach distances past T5's max_distance 128, and the small tables (8 buckets to 12) reach the logarithmic and
  // the clamped buckets in every tile; non-causal T5 runs the bidirectional buckets.
  for (int i = 0; i < 12; ++i) {
    const ModeSpec& m = modes[size_t(i % 10)];
    AttnCase c;
    c.name = "bias" + std::to_string(i);
    c.mode = m.mode, c.roper = m.roper, c.window = m.window, c.leaky_k = m.k, c.logn_train = m.logn;
    c.bias = i % 3 == 0 ? ScoreBias::Alibi : ScoreBias::T5;
    if (i % 3 == 2) c.t5_buckets = 8, c.t5_max_distance = 12;
    c.D = dims[size_t((i + 3) % 8)];
    if (c.roper && c.D > 128) c.D = 96;
    c.Hq = heads[size_t(i % 3)].first, c.Hkv = heads[size_t(i % 3)].second;
    c.seqlens = lens[size_t(i % 4)];
    c.causal = i % 4 != 1;
    c.t5_bidirectional = !c.causal && i % 2 == 1;
    c.dtype = dtypes[size_t(i % 4)];
    c.mem = mems[size_t(i % 3)];
    if (i % 2 == 0) c.position_offset = 7;
    cases.push_back(c);
  }
  // Queries for the last tokens only (first_query: a prompt's chunk against the keys before it): every mode, the
  // first query inside, at and past a 64-row tile edge, one query, the window straddling the first query's tile.
  const std::vector<std::pair<int64_t, int64_t>> tails = {{130, 1},  {130, 64}, {130, 100}, {130, 129}, {200, 37},
                                                          {200, 128}, {90, 89}, {130, 65},  {70, 3},    {200, 150}};
  for (int i = 0; i < 10; ++i) {
    const ModeSpec& m = modes[size_t(i)];
    AttnCase c;
    c.name = "tail" + std::to_string(i);
    c.mode = m.mode, c.roper = m.roper, c.window = m.window, c.leaky_k = m.k, c.logn_train = m.logn;
    c.seqlens = {tails[size_t(i)].first}, c.first_query = tails[size_t(i)].second;
    c.D = dims[size_t((i + 5) % 8)];
    if (c.roper && c.D > 128) c.D = 96;
    c.Hq = heads[size_t(i % 3)].first, c.Hkv = heads[size_t(i % 3)].second;
    c.causal = i != 4;
    c.dtype = dtypes[size_t(i % 4)];
    c.mem = i < 8 ? mems[size_t(i % 3)] : MemLayout::HeadMajor;
    if (i % 3 == 1) c.position_offset = 1000;
    if (i == 6) c.bias = ScoreBias::Alibi;
    if (i == 7) c.bias = ScoreBias::T5, c.t5_buckets = 8, c.t5_max_distance = 12;
    cases.push_back(c);
  }
  return cases;
}

std::vector<AttnCase> backward_table() {
  std::vector<AttnCase> cases;
  auto add = [&](std::string name, PositionMode mode, bool roper, int64_t w, double k, int D, int Hq, int Hkv,
                 std::vector<int64_t> seqs, bool causal, DType dt, int64_t logn = 0) {
    AttnCase c;
    c.name = std::move(name);
    c.mode = mode, c.roper = roper, c.window = w, c.leaky_k = k, c.D = D, c.Hq = Hq, c.Hkv = Hkv;
    c.seqlens = std::move(seqs), c.causal = causal, c.dtype = dt, c.logn_train = logn;
    cases.push_back(c);
  };
  using PM = PositionMode;
  add("none", PM::None, false, 0, 1, 64, 2, 2, {1, 7, 70}, true, DType::F32);
  add("rope", PM::Rope, false, 0, 1, 64, 4, 2, {1, 7, 70}, true, DType::F32);
  add("rope_full_mqa", PM::Rope, false, 0, 1, 80, 4, 1, {33, 40}, false, DType::F32);
  add("rerope", PM::Rerope, false, 12, 1, 64, 2, 2, {130}, true, DType::F32);
  add("rerope_gqa_d40", PM::Rerope, false, 40, 1, 40, 4, 2, {7, 90}, true, DType::F32, 16);
  add("leaky", PM::LeakyRerope, false, 12, 4, 96, 2, 1, {100}, true, DType::F32);
  add("leaky_full", PM::LeakyRerope, false, 20, 2, 64, 2, 2, {70}, false, DType::F32);
  add("roper", PM::Rope, true, 0, 1, 64, 2, 2, {7, 70}, true, DType::F32);
  add("rerope_roper", PM::Rerope, true, 12, 1, 64, 2, 1, {100}, true, DType::F32);
  add("leaky_roper_logn", PM::LeakyRerope, true, 12, 3, 48, 2, 2, {1, 90}, true, DType::F32, 16);
  add("rope_d256", PM::Rope, false, 0, 1, 256, 2, 1, {70}, true, DType::F32);
  add("rope_bf16", PM::Rope, false, 0, 1, 64, 2, 2, {7, 70}, true, DType::BF16);
  add("rerope_f16", PM::Rerope, false, 12, 1, 64, 2, 1, {100}, true, DType::F16);
  add("leaky_roper_f64", PM::LeakyRerope, true, 12, 3, 40, 2, 2, {90}, true, DType::F64);
  // Gradients into head-major views (heads outermost, as a transposed [1, H, S, D] tensor).
  for (size_t i : {size_t(4), size_t(9)}) {
    AttnCase c = cases[i];
    c.name += "_head_major";
    c.mem = MemLayout::HeadMajor;
    cases.push_back(c);
  }
  // Score biases; T5 also returns the table's gradient.
  add("alibi_rope", PM::Rope, false, 0, 1, 64, 4, 2, {7, 130}, true, DType::F32);
  add("t5_none", PM::None, false, 0, 1, 64, 4, 2, {7, 130}, true, DType::F32);
  add("t5_rerope_roper", PM::Rerope, true, 12, 1, 64, 2, 1, {100}, true, DType::F32);
  add("t5_leaky_full", PM::LeakyRerope, false, 20, 2, 48, 2, 2, {70}, false, DType::F32);
  add("t5_rope_bf16", PM::Rope, false, 0, 1, 64, 2, 2, {7, 70}, true, DType::BF16);
  add("t5_rope_f64", PM::Rope, false, 0, 1, 40, 2, 1, {90}, true, DType::F64);
  for (size_t i = cases.size() - 6; i < cases.size(); ++i) {
    AttnCase& c = cases[i];
    c.bias = c.name.starts_with("alibi") ? ScoreBias::Alibi : ScoreBias::T5;
    if (c.name == "t5_leaky_full") c.t5_bidirectional = true, c.t5_buckets = 16, c.t5_max_distance = 30;
    if (c.name == "t5_none") c.position_offset = 3;  // gaps: distances past 128
  }
  return cases;
}

// Small float64 problems for central differences (every mode, partial rotation, both layouts, logn, RoPER).
std::vector<AttnCase> finite_difference_table() {
  std::vector<AttnCase> cases;
  auto add = [&](std::string name, PositionMode mode, bool roper, int64_t w, double k, bool causal, int64_t logn,
                 int rot, RopeLayout layout) {
    AttnCase c;
    c.name = "gradcheck_" + name;
    c.mode = mode, c.roper = roper, c.window = w, c.leaky_k = k, c.causal = causal, c.logn_train = logn;
    c.D = 16, c.rotary_dim = rot, c.layout = layout, c.Hq = 2, c.Hkv = 1, c.seqlens = {3, 8};
    c.dtype = DType::F64, c.attention_factor = 1.1;
    cases.push_back(c);
  };
  using PM = PositionMode;
  add("none", PM::None, false, 0, 1, true, 0, 0, RopeLayout::HalfSplit);
  add("rope", PM::Rope, false, 0, 1, true, 0, 0, RopeLayout::HalfSplit);
  add("rope_full_partial", PM::Rope, false, 0, 1, false, 0, 8, RopeLayout::Interleaved);
  add("rerope", PM::Rerope, false, 3, 1, true, 0, 0, RopeLayout::HalfSplit);
  add("rerope_full_logn", PM::Rerope, false, 3, 1, false, 4, 0, RopeLayout::Interleaved);
  add("leaky", PM::LeakyRerope, false, 3, 2.5, true, 0, 12, RopeLayout::HalfSplit);
  add("roper", PM::Rope, true, 0, 1, true, 0, 0, RopeLayout::HalfSplit);
  add("rerope_roper", PM::Rerope, true, 3, 1, true, 4, 0, RopeLayout::HalfSplit);
  add("leaky_roper_full", PM::LeakyRerope, true, 2, 3, false, 0, 8, RopeLayout::Interleaved);
  // Biases: T5 with 6 buckets to distance 6 (exact 0..2, logarithmic, clamped within these lengths), the table
  // among the inputs; ALiBi's fixed slopes.
  add("t5_rope", PM::Rope, false, 0, 1, true, 0, 0, RopeLayout::HalfSplit);
  add("t5_rerope_full_bidirectional", PM::Rerope, false, 3, 1, false, 0, 0, RopeLayout::HalfSplit);
  add("alibi_leaky", PM::LeakyRerope, false, 3, 2, true, 0, 0, RopeLayout::Interleaved);
  for (size_t i = cases.size() - 3; i < cases.size(); ++i) {
    AttnCase& c = cases[i];
    c.bias = c.name.find("alibi") != std::string::npos ? ScoreBias::Alibi : ScoreBias::T5;
    c.t5_buckets = 6, c.t5_max_distance = 6;
    c.t5_bidirectional = !c.causal;
  }
  return cases;
}

}  // namespace

OpCases attention_cases() {
  OpCases cases;
  for (const AttnCase& c : forward_table()) cases.push_back(std::make_unique<AttentionForwardCase>(c));

  // Non-finite inputs. Token 5 sits in the first (diagonal) key tile: rows 0..4 must not see it; token 100 is
  // past a tile edge; 140 is in the second sequence.
  const std::vector<PoisonSite> nan_sites = {
      {"q", 40, 1, 3}, {"k", 5, 1, 0}, {"k", 100, 0, 63}, {"v", 5, 1, 2}, {"v", 140, 0, 40}};
  const std::vector<PoisonSite> inf_sites = {{"q", 70, 1, 5}, {"k", 70, 1, 5}, {"v", 70, 1, 5}};
  for (const AttnCase& base : {identity_case(PositionMode::Rope, 0, 1, false),
                               identity_case(PositionMode::Rerope, 12, 1, true),
                               identity_case(PositionMode::LeakyRerope, 12, 3, false)})
    for (bool causal : {true, false}) {
      AttnCase c = base;
      c.causal = causal;
      c.name = std::string("nonfinite");
      // Inf without RoPER (see expected_nonfinite), causal as the earlier suite had it.
      cases.push_back(std::make_unique<AttentionForwardCase>(
          c, nan_sites, causal && !c.roper ? inf_sites : std::vector<PoisonSite>{}));
    }
  {
    AttnCase roper = identity_case(PositionMode::Rope, 0, 1, true);
    roper.name = "nonfinite_value_partner";
    cases.push_back(std::make_unique<AttentionForwardCase>(roper, std::vector<PoisonSite>{{"v", 5, 0, 7}}));
    AttnCase rerope = identity_case(PositionMode::Rerope, 12, 1, false);
    rerope.name = "nonfinite_inf";
    cases.push_back(std::make_unique<AttentionForwardCase>(rerope, std::vector<PoisonSite>{}, inf_sites));
  }

  for (const AttnCase& c : backward_table()) cases.push_back(std::make_unique<AttentionBackwardCase>(c, false));
  for (const AttnCase& c : finite_difference_table()) cases.push_back(std::make_unique<AttentionBackwardCase>(c, true));
  return cases;
}

}  // namespace rotary::test
