// rotary::linear_attention / rotary::linear_attention_backward - RoFormer eq. 19 linear attention of the core
// (rotary/linear_attention.h), with or without RoPE.
//
//   torch.ops.rotary.linear_attention(q, k, v, positions?, cu_seqlens?, causal, inv_freq?, attention_factor,
//                                     layout, feature_map="elu_plus_one") -> out
//   torch.ops.rotary.linear_attention_backward(dout, q, k, v, positions?, cu_seqlens?, causal, inv_freq?,
//                                              attention_factor, layout, feature_map="elu_plus_one") -> (dq, dk, dv)
// feature_map "identity": q and k are the caller's positive features (a Performer's), each value > 0.
// q, k [B, S, H, D] or packed [T, H, D]; v [.., H, Dv]; out like v. inv_freq none: no rotation (the attention
// factor then has nowhere to go and is ignored). The binding only validates shapes, builds
// rotary::LinearAttentionParams and forwards; the autograd function saves q, k, v (the core backward recomputes
// the running state and does not read out) and calls linear_attention_backward.
#include <torch/torch.h>

#include "rotary/error.h"
#include "rotary/linear_attention.h"
#include "rotary_torch/convert.h"
#include "rotary_torch/ops.h"

namespace rotary::torch_ops {
namespace {

// Everything the core needs besides the output pointers; keeps the tensors it points into alive.
struct Prepared {
  LinearAttentionParams p;
  RopeFreqs freqs;
  Sequences seqs;
  at::Tensor q3, k3, v3;
};

void prepare(Prepared& s, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& positions,
             const OptTensor& cu_seqlens, bool causal, const OptTensor& inv_freq, double attention_factor,
             c10::string_view layout, c10::string_view feature_map) {
  check_qkv(q, k, v);
  check(k.size(-1) == q.size(-1), "k.shape[-1]", k.size(-1), "head_dim of q = " + std::to_string(q.size(-1)));
  // Query heads against key heads: the core names the field (k.heads), it has no GQA.
  parse_layout(std::string(layout));  // rejected even when unused (no inv_freq), so a typo never passes silently
  s.q3 = as_tokens_heads_dim(q, "q");
  s.k3 = as_tokens_heads_dim(k, "k");
  s.v3 = as_tokens_heads_dim(v, "v");
  LinearAttentionParams& p = s.p;
  p.tokens = s.q3.size(0);
  p.head_dim = int(q.size(-1));
  p.value_dim = int(v.size(-1));
  p.dtype = core_dtype(q, "q");
  p.q = heads_view(s.q3);
  p.k = heads_view(s.k3);
  p.v = heads_view(s.v3);
  p.causal = causal;
  p.feature_map = parse_feature_map(std::string(feature_map));
  s.seqs = sequences_from(q, cu_seqlens, positions, p.tokens);
  p.batch = s.seqs.batch;
  p.cu_seqlens = s.seqs.cu_ptr();
  p.positions = s.seqs.positions_ptr();
  if (inv_freq.has_value()) {
    s.freqs = freqs_from(*inv_freq, attention_factor, std::string(layout), p.head_dim);
    p.freqs = &s.freqs;
  }
}

// The output shape: q's with the last dim Dv. [B, S, H, Dv] or [T, H, Dv]
std::vector<int64_t> out_shape(const at::Tensor& q, const at::Tensor& v) {
  std::vector<int64_t> shape = q.sizes().vec();
  shape.back() = v.size(-1);
  return shape;
}

at::Tensor linear_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const OptTensor& positions, const OptTensor& cu_seqlens, bool causal,
                                const OptTensor& inv_freq, double attention_factor, c10::string_view layout,
                                c10::string_view feature_map) {
  Prepared s;
  prepare(s, q, k, v, positions, cu_seqlens, causal, inv_freq, attention_factor, layout, feature_map);
  at::Tensor out = at::empty_like(s.v3, at::MemoryFormat::Contiguous);  // [tokens, H, Dv]
  s.p.o = heads_view(out);
  linear_attention_forward(s.p);
  return out.view(out_shape(q, v));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_attention_backward_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& positions,
    const OptTensor& cu_seqlens, bool causal, const OptTensor& inv_freq, double attention_factor,
    c10::string_view layout, c10::string_view feature_map) {
  Prepared s;
  prepare(s, q, k, v, positions, cu_seqlens, causal, inv_freq, attention_factor, layout, feature_map);
  check(dout.sizes().vec() == out_shape(q, v), "dout.shape", dout.sizes(), "the output's shape (q's, last dim Dv)");
  const at::Tensor do3 = as_tokens_heads_dim(dout.to(q.scalar_type()), "dout");
  at::Tensor dq = at::empty_like(s.q3, at::MemoryFormat::Contiguous);
  at::Tensor dk = at::empty_like(s.k3, at::MemoryFormat::Contiguous);
  at::Tensor dv = at::empty_like(s.v3, at::MemoryFormat::Contiguous);
  LinearAttentionGradParams g;
  g.fwd = s.p;  // o stays null: the backward does not read it
  g.dout = heads_view(do3);
  g.dq = heads_view(dq);
  g.dk = heads_view(dk);
  g.dv = heads_view(dv);
  linear_attention_backward(g);
  return {dq.view(q.sizes()), dk.view(k.sizes()), dv.view(v.sizes())};
}

class LinearAttentionFunction : public torch::autograd::Function<LinearAttentionFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const OptTensor& positions, const OptTensor& cu_seqlens, bool causal,
                            const OptTensor& inv_freq, double attention_factor, c10::string_view layout,
                            c10::string_view feature_map) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = typed_op<decltype(linear_attention_cpu)>("rotary::linear_attention");
    at::Tensor out = op.call(q, k, v, positions, cu_seqlens, causal, inv_freq, attention_factor, layout, feature_map);
    ctx->save_for_backward({q, k, v, positions.value_or(at::Tensor()), cu_seqlens.value_or(at::Tensor()),
                            inv_freq.value_or(at::Tensor())});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["attention_factor"] = attention_factor;
    ctx->saved_data["layout"] = std::string(layout);
    ctx->saved_data["feature_map"] = std::string(feature_map);
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto sv = ctx->get_saved_variables();
    auto opt = [](const at::Tensor& t) { return t.defined() ? OptTensor(t) : OptTensor(); };
    const at::Tensor dout = grads[0].defined() ? grads[0] : at::zeros(out_shape(sv[0], sv[2]), sv[2].options());
    static auto op = typed_op<decltype(linear_attention_backward_cpu)>("rotary::linear_attention_backward");
    auto& d = ctx->saved_data;
    auto [dq, dk, dv] = op.call(dout, sv[0], sv[1], sv[2], opt(sv[3]), opt(sv[4]), d["causal"].toBool(), opt(sv[5]),
                                d["attention_factor"].toDouble(), d["layout"].toStringRef(),
                                d["feature_map"].toStringRef());
    torch::autograd::variable_list g(10);  // one per forward input; only q, k, v are differentiable
    g[0] = dq, g[1] = dk, g[2] = dv;
    return first_derivative_only(std::move(g), "linear_attention");
  }
};

at::Tensor linear_attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const OptTensor& positions, const OptTensor& cu_seqlens, bool causal,
                                     const OptTensor& inv_freq, double attention_factor, c10::string_view layout,
                                     c10::string_view feature_map) {
  return LinearAttentionFunction::apply(q, k, v, positions, cu_seqlens, causal, inv_freq, attention_factor, layout,
                                        feature_map);
}

}  // namespace

at::Tensor linear_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& positions, const std::optional<at::Tensor>& cu_seqlens,
                            bool causal, const std::optional<at::Tensor>& inv_freq, double attention_factor,
                            const std::string& layout, const std::string& feature_map) {
  static auto op = typed_op<decltype(linear_attention_cpu)>("rotary::linear_attention");
  auto o = [](const std::optional<at::Tensor>& t) { return t ? OptTensor(*t) : OptTensor(); };
  return op.call(q, k, v, o(positions), o(cu_seqlens), causal, o(inv_freq), attention_factor, layout, feature_map);
}

}  // namespace rotary::torch_ops

TORCH_LIBRARY_FRAGMENT(rotary, m) {
  m.def(
      "linear_attention(Tensor q, Tensor k, Tensor v, Tensor? positions, Tensor? cu_seqlens, bool causal, "
      "Tensor? inv_freq, float attention_factor, str layout, str feature_map=\"elu_plus_one\") -> Tensor");
  m.def(
      "linear_attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor? positions, Tensor? cu_seqlens, "
      "bool causal, Tensor? inv_freq, float attention_factor, str layout, str feature_map=\"elu_plus_one\") -> "
      "(Tensor, Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(rotary, CPU, m) {
  m.impl("linear_attention", rotary::torch_ops::linear_attention_cpu);
  m.impl("linear_attention_backward", rotary::torch_ops::linear_attention_backward_cpu);
}
// The backward op is not differentiated itself: past the autograd key to the backend (CPU, or Meta).
TORCH_LIBRARY_IMPL(rotary, Autograd, m) {
  m.impl("linear_attention", rotary::torch_ops::linear_attention_autograd);
  m.impl("linear_attention_backward", torch::CppFunction::makeFallthrough());
}
