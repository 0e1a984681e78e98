// The "linear_attention_forward" and "linear_attention_backward" op cases: the running-state forward/backward
// against the float64 materialised reference (causal and not, odd and zero lengths, packed batches, positions,
// partial rotation, both layouts, strided views, every storage dtype); both backward passes against central
// differences of the float64 reference on small problems.
#include "cases_linear_attention.h"

#include <algorithm>
#include <tuple>

namespace rotary::test {
namespace {

class LinearAttentionCase : public OpCase {
 public:
  LinearAttentionCase(LinearCaseSpec c, bool backward) : c_(std::move(c)), backward_(backward) {}
  std::string op() const override { return backward_ ? "linear_attention_backward" : "linear_attention_forward"; }
  std::string name() const override {
    std::string s = std::string(dtype_name(c_.dtype)) + (c_.causal ? " causal" : " full") +
                    (c_.rotate ? " rope" : " plain") + (c_.layout == RopeLayout::Interleaved ? " interleaved" : " half") +
                    " D" + std::to_string(c_.D) + " r" + std::to_string(c_.rotary_dim) + " Dv" + std::to_string(c_.Dv) +
                    " H" + std::to_string(c_.H) + " lengths";
    for (int64_t l : c_.lengths) s.append(" ").append(std::to_string(l));
    if (c_.finite_differences) s.insert(0, "gradcheck ");
    if (c_.feature_map == FeatureMap::Identity) s += " identity";
    if (c_.positions) s += " positions";
    s.append(" pad").append(std::to_string(c_.pad)).append(" a").append(std::to_string(c_.attention_factor));
    return identifier(s);
  }
  void setup() override {
    fast_ = std::make_unique<LinearProblem>(c_);
    ref_ = std::make_unique<LinearProblem>(c_);
  }
  void release() override { fast_.reset(), ref_.reset(); }
  void run_reference() override { run(*ref_, linear_attention_forward_reference, linear_attention_backward_reference); }
  void run_fast() override { run(*fast_, linear_attention_forward, linear_attention_backward); }

  std::vector<Output> outputs() const override {
    int64_t longest = 1;
    for (int64_t l : c_.lengths) longest = std::max(longest, l);
    const Tolerance tol = tolerance(Quantity::LinearAttention, {.dtype = c_.dtype, .longest_sequence = longest});
    auto out = [&](const char* name, std::unique_ptr<WatchedBuffer> LinearProblem::*b, int row) {
      return Output{name, fast_->gather(*((*fast_).*b), row), ref_->gather(*((*ref_).*b), row), tol};
    };
    if (!backward_) return {out("o", &LinearProblem::o, c_.Dv)};
    return {out("dq", &LinearProblem::dq, c_.D), out("dk", &LinearProblem::dk, c_.D), out("dv", &LinearProblem::dv, c_.Dv)};
  }
  std::string memory_violations() const override {
    for (const WatchedBuffer* b : {fast_->q.get(), fast_->k.get(), fast_->v.get(), fast_->dout.get(), fast_->o.get(),
                                   fast_->dq.get(), fast_->dk.get(), fast_->dv.get()})
      if (std::string v = b->violations(); !v.empty()) return v;
    return "";
  }

  // One element of q, k and v at a time, in the forward of the unpadded rotating cases (parity only).
  std::vector<PoisonSite> poison_sites(NonFinite) const override {
    if (backward_ || !c_.rotate || c_.pad != 0) return {};
    const int64_t last = c_.lengths.back() - 1;
    return {{"q", last / 2, 0, 1}, {"k", 0, c_.H - 1, c_.D - 1}, {"v", last, 1, 0}};
  }
  void poison(const PoisonSite& s, double value) override {
    for (LinearProblem* p : {fast_.get(), ref_.get()}) {
      WatchedBuffer& b = s.input == "q" ? *p->q : s.input == "k" ? *p->k : *p->v;
      const HeadsView v = p->view(b, s.input == "v" ? c_.Dv : c_.D);
      b.set(s.token * v.token_stride + s.head * v.head_stride + s.feature, value);
      b.snapshot();
    }
  }

  bool finite_differences() const override { return c_.finite_differences; }
  // L = sum dout . o of the reference forward (on the reference problem, whose inputs the mode perturbs).
  double reference_loss() override {
    linear_attention_forward_reference(ref_->params());
    const std::vector<double> o = ref_->gather(*ref_->o, c_.Dv), dout = ref_->gather(*ref_->dout, c_.Dv);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * dout[i];
    return s;
  }
  std::vector<GradientInput> gradient_inputs() override {
    std::vector<GradientInput> in;
    for (auto [x, g, row, name] : {std::tuple{&LinearProblem::q, &LinearProblem::dq, c_.D, "dq"},
                                   std::tuple{&LinearProblem::k, &LinearProblem::dk, c_.D, "dk"},
                                   std::tuple{&LinearProblem::v, &LinearProblem::dv, c_.Dv, "dv"}}) {
      WatchedBuffer* input = ((*ref_).*x).get();
      const HeadsView view = ref_->view(*input, row);
      const int64_t tokens = ref_->tokens, H = c_.H;
      // Element e in [token][head][feature] order of the view.
      auto index = [view, row, H](int64_t e) {
        return (e / row / H) * view.token_stride + ((e / row) % H) * view.head_stride + e % row;
      };
      in.push_back({name, [tokens, H, row] { return tokens * H * row; },
                    [input, index](int64_t e) { return input->get(index(e)); },
                    [input, index](int64_t e, double v) { input->set(index(e), v); },
                    fast_->gather(*((*fast_).*g), row), ref_->gather(*((*ref_).*g), row)});
    }
    return in;
  }
  // Linear attention's gradients are compared at their own largest entry (no floor): they are O(1) here.
  Tolerance finite_difference_tolerance() const override { return tolerance(Quantity::FiniteDifference, {.floor = 0}); }

  PerfCost cost() const override {
    int64_t tokens = 0;
    for (int64_t l : c_.lengths) tokens += l;
    // Running state D x Dv per (sequence, head): ~4 D Dv flops per token and head each way.
    const double io = double(tokens * c_.H * (2 * c_.D + 2 * c_.Dv)) * double(dtype_size(c_.dtype));
    const double flops = 4.0 * double(tokens * c_.H) * c_.D * c_.Dv;
    return backward_ ? PerfCost{2 * io, 3 * flops} : PerfCost{io, flops};
  }

 private:
  void run(LinearProblem& p, void (*forward)(const LinearAttentionParams&),
           void (*backward)(const LinearAttentionGradParams&)) {
    for (WatchedBuffer* b : {p.o.get(), p.dq.get(), p.dk.get(), p.dv.get()}) b->restore();
    if (backward_) backward(p.grad_params());
    else forward(p.params());
  }

  LinearCaseSpec c_;
  bool backward_;
  std::unique_ptr<LinearProblem> fast_, ref_;
};

}  // namespace

OpCases linear_attention_cases() {
  std::vector<LinearCaseSpec> specs;
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16})
    for (bool causal : {true, false}) {
      LinearCaseSpec c;
      c.dtype = t, c.causal = causal, c.seed = specs.size() + 1;
      specs.push_back(c);
      c.layout = RopeLayout::Interleaved, c.D = 10, c.rotary_dim = 6, c.Dv = 7, c.H = 3;
      c.lengths = {1, 0, 17, 64, 5}, c.positions = true, c.pad = 3, c.attention_factor = 1.3, c.seed += 100;
      specs.push_back(c);
      c.rotate = false, c.lengths = {9}, c.seed += 100;
      specs.push_back(c);
      // The caller's features (a Performer's): no rotation, as there, and with it (the op allows both).
      c.feature_map = FeatureMap::Identity, c.lengths = {1, 0, 33, 6}, c.D = 44, c.Dv = 16, c.seed += 100;
      specs.push_back(c);
      c.rotate = true, c.rotary_dim = 40, c.seed += 100;
      specs.push_back(c);
    }
  // Central differences: small float64 problems, both masks.
  for (bool causal : {true, false}) {
    LinearCaseSpec c;
    c.dtype = DType::F64, c.causal = causal, c.D = 6, c.rotary_dim = 4, c.Dv = 5, c.H = 2, c.lengths = {4, 7};
    c.positions = true, c.attention_factor = 1.2, c.layout = RopeLayout::Interleaved, c.finite_differences = true;
    specs.push_back(c);
    c.feature_map = FeatureMap::Identity, c.rotate = false;
    specs.push_back(c);
  }
  OpCases cases;
  for (const LinearCaseSpec& c : specs) {
    if (!c.finite_differences) cases.push_back(std::make_unique<LinearAttentionCase>(c, false));
    cases.push_back(std::make_unique<LinearAttentionCase>(c, true));
  }
  return cases;
}

}  // namespace rotary::test
