// rotary::attention / rotary::attention_backward - the fused attention of the core, every position mode.
//
//   torch.ops.rotary.attention(q, k, v, positions?, cu_seqlens?, causal, softmax_scale, mode, inv_freq?,
//                              attention_factor, layout, roper, window, leaky_k, logn_train_len,
//                              bias="none", alibi_slopes=None, t5_table=None, t5_num_buckets=32,
//                              t5_max_distance=128, t5_bidirectional=False) -> (out, lse)
// bias "alibi": alibi_slopes [Hq] float64; "t5": t5_table [buckets, Hq] (any float dtype; differentiable: the
// backward returns its gradient in the table's dtype).
// The binding only validates shapes, builds rotary::AttentionParams and forwards; the autograd function saves
// q, k, v, out and lse and calls attention_backward (recomputation, no N x N storage).
#include <torch/torch.h>

#include "rotary/attention.h"
#include "rotary/error.h"
#include "rotary_torch/convert.h"
#include "rotary_torch/ops.h"

namespace rotary::torch_ops {
namespace {

// Everything the core needs besides data pointers; keeps the tensors it points into alive.
struct Prepared {
  AttentionParams p;
  RopeFreqs freqs;
  Sequences seqs;
  at::Tensor q3, k3, v3, alibi, t5;
};

// The score-bias arguments of the op, as the schema has them.
struct BiasArgs {
  c10::string_view kind = "none";
  OptTensor alibi_slopes, t5_table;
  int64_t t5_num_buckets = 32, t5_max_distance = 128;
  bool t5_bidirectional = false;
};

void prepare(Prepared& s, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& positions,
             const OptTensor& cu_seqlens, bool causal, double scale, c10::string_view mode, const OptTensor& inv_freq,
             double attention_factor, c10::string_view layout, bool roper, int64_t window, double leaky_k,
             int64_t logn_train_len, const BiasArgs& bias) {
  check_qkv(q, k, v);
  check(k.size(-1) == q.size(-1), "k.shape[-1]", k.size(-1), "head_dim of q = " + std::to_string(q.size(-1)));
  check(v.size(-1) == q.size(-1), "v.shape[-1]", v.size(-1), "head_dim of q = " + std::to_string(q.size(-1)));
  s.q3 = as_tokens_heads_dim(q, "q");
  s.k3 = as_tokens_heads_dim(k, "k");
  s.v3 = as_tokens_heads_dim(v, "v");
  AttentionParams& p = s.p;
  p.tokens = s.q3.size(0);
  p.head_dim = int(q.size(-1));
  p.dtype = core_dtype(q, "q");
  p.q = heads_view(s.q3);
  p.k = heads_view(s.k3);
  p.v = heads_view(s.v3);
  p.causal = causal;
  p.softmax_scale = scale;
  s.seqs = sequences_from(q, cu_seqlens, positions, p.tokens);
  p.batch = s.seqs.batch;
  p.cu_seqlens = s.seqs.cu_ptr();
  p.positions = s.seqs.positions_ptr();
  p.pos.mode = position_mode_from_name(std::string(mode));
  if (p.pos.mode != PositionMode::None) {
    check(inv_freq.has_value(), "inv_freq", "none", "a [rotary_dim/2] tensor when mode is not none");
    s.freqs = freqs_from(*inv_freq, attention_factor, std::string(layout), p.head_dim);
    p.pos.freqs = &s.freqs;
  }
  p.pos.roper = roper;
  p.pos.window = window;
  p.pos.leaky_k = leaky_k;
  p.pos.logn_train_len = logn_train_len;
  const int64_t Hq = s.q3.size(1);
  const std::string kind(bias.kind);
  if (kind == "none") {
    p.bias.kind = ScoreBias::None;
  } else if (kind == "alibi") {
    check(bias.alibi_slopes.has_value(), "alibi_slopes", "none", "a [Hq] float64 tensor with bias = alibi");
    const at::Tensor& a = *bias.alibi_slopes;
    check(a.scalar_type() == at::kDouble && a.dim() == 1 && a.size(0) == Hq, "alibi_slopes", a.sizes(),
          "a float64 [Hq = " + std::to_string(Hq) + "] tensor");
    s.alibi = a.contiguous();
    p.bias.kind = ScoreBias::Alibi;
    p.bias.alibi_slopes = s.alibi.data_ptr<double>();
  } else if (kind == "t5") {
    check(bias.t5_table.has_value(), "t5_table", "none", "a [t5_num_buckets, Hq] tensor with bias = t5");
    const at::Tensor& t = *bias.t5_table;
    check(t.dim() == 2 && t.size(0) == bias.t5_num_buckets && t.size(1) == Hq, "t5_table", t.sizes(),
          "[t5_num_buckets = " + std::to_string(bias.t5_num_buckets) + ", Hq = " + std::to_string(Hq) + "]");
    check(t.is_floating_point(), "t5_table.dtype", t.scalar_type(), "a floating dtype");
    s.t5 = t.to(q.scalar_type()).contiguous();
    p.bias.kind = ScoreBias::T5;
    p.bias.t5_table = s.t5.data_ptr();
    p.bias.t5_num_buckets = int(bias.t5_num_buckets);
    p.bias.t5_max_distance = int(bias.t5_max_distance);
    p.bias.t5_bidirectional = bias.t5_bidirectional;
  } else {
    fail("bias", kind, "none, alibi, t5");
  }
}

at::ScalarType lse_type(const at::Tensor& q) { return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

std::tuple<at::Tensor, at::Tensor> attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const OptTensor& positions, const OptTensor& cu_seqlens, bool causal,
                                                 double scale, c10::string_view mode, const OptTensor& inv_freq,
                                                 double attention_factor, c10::string_view layout, bool roper,
                                                 int64_t window, double leaky_k, int64_t logn_train_len,
                                                 c10::string_view bias, const OptTensor& alibi_slopes,
                                                 const OptTensor& t5_table, int64_t t5_num_buckets,
                                                 int64_t t5_max_distance, bool t5_bidirectional) {
  Prepared s;
  prepare(s, q, k, v, positions, cu_seqlens, causal, scale, mode, inv_freq, attention_factor, layout, roper, window,
          leaky_k, logn_train_len,
          {bias, alibi_slopes, t5_table, t5_num_buckets, t5_max_distance, t5_bidirectional});
  at::Tensor out = at::empty_like(s.q3, at::MemoryFormat::Contiguous);
  at::Tensor lse = at::empty({s.p.tokens, s.q3.size(1)}, q.options().dtype(lse_type(q)));
  s.p.o = heads_view(out);
  s.p.lse = lse.data_ptr();
  attention_forward(s.p);
  return {out.view(q.sizes()), lse};
}

// -> (dq, dk, dv, dt5_table): the last is the T5 table's gradient in the table's dtype, empty [0] otherwise.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const OptTensor& positions, const OptTensor& cu_seqlens, bool causal, double scale,
    c10::string_view mode, const OptTensor& inv_freq, double attention_factor, c10::string_view layout, bool roper,
    int64_t window, double leaky_k, int64_t logn_train_len, c10::string_view bias, const OptTensor& alibi_slopes,
    const OptTensor& t5_table, int64_t t5_num_buckets, int64_t t5_max_distance, bool t5_bidirectional) {
  Prepared s;
  prepare(s, q, k, v, positions, cu_seqlens, causal, scale, mode, inv_freq, attention_factor, layout, roper, window,
          leaky_k, logn_train_len,
          {bias, alibi_slopes, t5_table, t5_num_buckets, t5_max_distance, t5_bidirectional});
  check(out.sizes() == q.sizes(), "out.shape", out.sizes(), "q.shape");
  check(dout.sizes() == q.sizes(), "dout.shape", dout.sizes(), "q.shape");
  check(lse.scalar_type() == lse_type(q) && lse.numel() == s.p.tokens * s.q3.size(1), "lse", lse.sizes(),
        "[tokens, Hq] from the forward");
  const at::Tensor o3 = as_tokens_heads_dim(out.to(q.scalar_type()), "out");
  const at::Tensor do3 = as_tokens_heads_dim(dout.to(q.scalar_type()), "dout");
  const at::Tensor lse_c = lse.contiguous();
  at::Tensor dq = at::empty_like(s.q3, at::MemoryFormat::Contiguous);
  at::Tensor dk = at::empty_like(s.k3, at::MemoryFormat::Contiguous);
  at::Tensor dv = at::empty_like(s.v3, at::MemoryFormat::Contiguous);
  AttentionGradParams g;
  g.fwd = s.p;
  g.fwd.o = heads_view(o3);
  g.fwd.lse = lse_c.data_ptr();
  g.dout = heads_view(do3);
  g.dq = heads_view(dq);
  g.dk = heads_view(dk);
  g.dv = heads_view(dv);
  at::Tensor dt5 = s.t5.defined() ? at::empty_like(s.t5) : at::empty({0}, q.options());
  if (s.t5.defined()) g.dt5_table = dt5.data_ptr();
  attention_backward(g);
  if (s.t5.defined()) dt5 = dt5.to(t5_table->scalar_type());
  return {dq.view(q.sizes()), dk.view(k.sizes()), dv.view(v.sizes()), dt5};
}

class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
      const OptTensor& positions, const OptTensor& cu_seqlens, bool causal, double scale, c10::string_view mode,
      const OptTensor& inv_freq, double attention_factor, c10::string_view layout, bool roper, int64_t window,
      double leaky_k, int64_t logn_train_len, c10::string_view bias, const OptTensor& alibi_slopes,
      const OptTensor& t5_table, int64_t t5_num_buckets, int64_t t5_max_distance, bool t5_bidirectional) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = typed_op<decltype(attention_cpu)>("rotary::attention");
    auto [out, lse] = op.call(q, k, v, positions, cu_seqlens, causal, scale, mode, inv_freq, attention_factor, layout,
                              roper, window, leaky_k, logn_train_len, bias, alibi_slopes, t5_table, t5_num_buckets,
                              t5_max_distance, t5_bidirectional);
    ctx->save_for_backward({q, k, v, out, lse, positions.value_or(at::Tensor()), cu_seqlens.value_or(at::Tensor()),
                            inv_freq.value_or(at::Tensor()), alibi_slopes.value_or(at::Tensor()),
                            t5_table.value_or(at::Tensor())});
    ctx->saved_data["bias"] = std::string(bias);
    ctx->saved_data["t5_num_buckets"] = t5_num_buckets;
    ctx->saved_data["t5_max_distance"] = t5_max_distance;
    ctx->saved_data["t5_bidirectional"] = t5_bidirectional;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["mode"] = std::string(mode);
    ctx->saved_data["attention_factor"] = attention_factor;
    ctx->saved_data["layout"] = std::string(layout);
    ctx->saved_data["roper"] = roper;
    ctx->saved_data["window"] = window;
    ctx->saved_data["leaky_k"] = leaky_k;
    ctx->saved_data["logn_train_len"] = logn_train_len;
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto sv = ctx->get_saved_variables();
    auto opt = [](const at::Tensor& t) { return t.defined() ? OptTensor(t) : OptTensor(); };
    at::Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(sv[3]);
    static auto op = typed_op<decltype(attention_backward_cpu)>("rotary::attention_backward");
    auto& d = ctx->saved_data;
    auto [dq, dk, dv, dt5] =
        op.call(dout, sv[0], sv[1], sv[2], sv[3], sv[4], opt(sv[5]), opt(sv[6]), d["causal"].toBool(),
                d["scale"].toDouble(), d["mode"].toStringRef(), opt(sv[7]), d["attention_factor"].toDouble(),
                d["layout"].toStringRef(), d["roper"].toBool(), d["window"].toInt(), d["leaky_k"].toDouble(),
                d["logn_train_len"].toInt(), d["bias"].toStringRef(), opt(sv[8]), opt(sv[9]),
                d["t5_num_buckets"].toInt(), d["t5_max_distance"].toInt(), d["t5_bidirectional"].toBool());
    torch::autograd::variable_list g(21);  // one per forward input; q, k, v and the T5 table are differentiable
    g[0] = dq, g[1] = dk, g[2] = dv;
    if (d["bias"].toStringRef() == "t5") g[17] = dt5;  // a table given with another bias kind gets no gradient
    return first_derivative_only(std::move(g), "attention");
  }
};

std::tuple<at::Tensor, at::Tensor> attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      const OptTensor& positions, const OptTensor& cu_seqlens,
                                                      bool causal, double scale, c10::string_view mode,
                                                      const OptTensor& inv_freq, double attention_factor,
                                                      c10::string_view layout, bool roper, int64_t window,
                                                      double leaky_k, int64_t logn_train_len, c10::string_view bias,
                                                      const OptTensor& alibi_slopes, const OptTensor& t5_table,
                                                      int64_t t5_num_buckets, int64_t t5_max_distance,
                                                      bool t5_bidirectional) {
  auto r = AttentionFunction::apply(q, k, v, positions, cu_seqlens, causal, scale, mode, inv_freq, attention_factor,
                                    layout, roper, window, leaky_k, logn_train_len, bias, alibi_slopes, t5_table,
                                    t5_num_buckets, t5_max_distance, t5_bidirectional);
  return {r[0], r[1]};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const std::optional<at::Tensor>& positions,
                                             const std::optional<at::Tensor>& cu_seqlens, bool causal,
                                             double softmax_scale, const AttentionPosition& pos,
                                             const AttentionBias& bias) {
  static auto op = typed_op<decltype(attention_cpu)>("rotary::attention");
  auto o = [](const std::optional<at::Tensor>& t) { return t ? OptTensor(*t) : OptTensor(); };
  return op.call(q, k, v, o(positions), o(cu_seqlens), causal, softmax_scale, pos.mode, o(pos.inv_freq),
                 pos.attention_factor, pos.layout, pos.roper, pos.window, pos.leaky_k, pos.logn_train_len, bias.kind,
                 o(bias.alibi_slopes), o(bias.t5_table), bias.t5_num_buckets, bias.t5_max_distance,
                 bias.t5_bidirectional);
}

}  // namespace rotary::torch_ops

TORCH_LIBRARY_FRAGMENT(rotary, m) {
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, Tensor? positions, Tensor? cu_seqlens, bool causal, "
      "float softmax_scale, str mode, Tensor? inv_freq, float attention_factor, str layout, bool roper, int window, "
      "float leaky_k, int logn_train_len, str bias=\"none\", Tensor? alibi_slopes=None, Tensor? t5_table=None, "
      "int t5_num_buckets=32, int t5_max_distance=128, bool t5_bidirectional=False) -> (Tensor, Tensor)");
  m.def(
      "attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? positions, "
      "Tensor? cu_seqlens, bool causal, float softmax_scale, str mode, Tensor? inv_freq, float attention_factor, "
      "str layout, bool roper, int window, float leaky_k, int logn_train_len, str bias=\"none\", "
      "Tensor? alibi_slopes=None, Tensor? t5_table=None, int t5_num_buckets=32, int t5_max_distance=128, "
      "bool t5_bidirectional=False) -> (Tensor, Tensor, Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(rotary, CPU, m) {
  m.impl("attention", rotary::torch_ops::attention_cpu);
  m.impl("attention_backward", rotary::torch_ops::attention_backward_cpu);
}
// The backward op is not differentiated itself: past the autograd key to the backend (CPU, or the Python package's
// Meta kernel for meta and fake tensors).
TORCH_LIBRARY_IMPL(rotary, Autograd, m) {
  m.impl("attention", rotary::torch_ops::attention_autograd);
  m.impl("attention_backward", torch::CppFunction::makeFallthrough());
}
