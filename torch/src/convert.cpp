#include "rotary_torch/convert.h"

#include <torch/csrc/autograd/functions/basic_ops.h>

#include "rotary/error.h"

namespace rotary::torch_ops {

DType core_dtype(const at::Tensor& t, const char* field) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::F32;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    case at::kDouble: return DType::F64;
    default: fail(std::string(field) + ".dtype", std::string(c10::toString(t.scalar_type())),
                  "float32, float16, bfloat16, float64");
  }
}

at::Tensor as_tokens_heads_dim(const at::Tensor& t, const char* field) {
  check(t.device().is_cpu(), std::string(field) + ".device", t.device().str(), "cpu");
  check(t.dim() >= 3, std::string(field) + ".dim()", t.dim(), ">= 3 ([..., heads, head_dim])");
  const int64_t H = t.size(-2), D = t.size(-1);
  at::Tensor x = t.stride(-1) == 1 ? t : t.contiguous();
  // Flatten the leading dims into tokens; reshape copies only when the strides do not allow a view.
  return x.reshape({-1, H, D});
}

HeadsView heads_view(const at::Tensor& t3) {
  return HeadsView{t3.data_ptr(), t3.size(1), t3.stride(0), t3.stride(1)};
}

PositionMode position_mode_from_name(const std::string& mode) {
  if (mode == "none") return PositionMode::None;
  if (mode == "rope") return PositionMode::Rope;
  if (mode == "rerope") return PositionMode::Rerope;
  if (mode == "leaky_rerope") return PositionMode::LeakyRerope;
  fail("mode", mode, "none, rope, rerope, leaky_rerope");
}

RopeFreqs freqs_from(const at::Tensor& inv_freq, double attention_factor, const std::string& layout,
                     int64_t head_dim) {
  check(inv_freq.dim() == 1, "inv_freq.dim()", inv_freq.dim(), "1 ([rotary_dim / 2])");
  at::Tensor f = inv_freq.to(at::kDouble).contiguous();
  RopeFreqs out;
  out.head_dim = int(head_dim);
  out.rotary_dim = int(2 * f.size(0));
  out.layout = parse_layout(layout);
  out.inv_freq.assign(f.data_ptr<double>(), f.data_ptr<double>() + f.size(0));
  out.attention_factor = attention_factor;
  out.validate();
  return out;
}

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check(q.dim() == 3 || q.dim() == 4, "q.dim()", q.dim(), "3 ([tokens, H, D]) or 4 ([B, S, H, D])");
  const std::string q_dim = "the same as q.dim() = " + std::to_string(q.dim());
  check(k.dim() == q.dim(), "k.dim()", k.dim(), q_dim);
  check(v.dim() == q.dim(), "v.dim()", v.dim(), q_dim);
  const std::string q_type = std::string("q.dtype = ") + c10::toString(q.scalar_type());
  check(k.scalar_type() == q.scalar_type(), "k.dtype", c10::toString(k.scalar_type()), q_type);
  check(v.scalar_type() == q.scalar_type(), "v.dtype", c10::toString(v.scalar_type()), q_type);
  for (int d = 0; d + 2 < q.dim(); ++d) {
    const std::string want = "q.shape[" + std::to_string(d) + "] = " + std::to_string(q.size(d));
    check(k.size(d) == q.size(d), "k.shape[" + std::to_string(d) + "]", k.size(d), want);
    check(v.size(d) == q.size(d), "v.shape[" + std::to_string(d) + "]", v.size(d), want);
  }
  // Empty heads or features cannot be viewed as [tokens, H, D] (and a 0 value dim means "head_dim" to the core).
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    check(t->size(-2) >= 1, std::string(name) + ".shape[-2]", t->size(-2), ">= 1 (heads)");
    check(t->size(-1) >= 1, std::string(name) + ".shape[-1]", t->size(-1), ">= 1 (features)");
  }
  check(v.size(-2) == k.size(-2), "v.shape[-2]", v.size(-2), "k heads = " + std::to_string(k.size(-2)));
}

Sequences sequences_from(const at::Tensor& q, const OptTensor& cu_seqlens, const OptTensor& positions,
                         int64_t tokens) {
  Sequences s;
  if (q.dim() == 4) {
    check(!cu_seqlens.has_value(), "cu_seqlens", "given", "none with 4-d [B, S, H, D] inputs (rows are the sequences)");
    s.cu = at::arange(q.size(0) + 1, at::kLong) * q.size(1);  // [0, S, 2S, ..., BS]
    s.batch = q.size(0);
  } else if (cu_seqlens.has_value()) {
    check(cu_seqlens->scalar_type() == at::kLong && cu_seqlens->dim() == 1, "cu_seqlens",
          c10::toString(cu_seqlens->scalar_type()), "a 1-d int64 tensor [batch + 1]");
    check(cu_seqlens->numel() >= 2, "cu_seqlens.numel()", cu_seqlens->numel(), ">= 2 ([batch + 1], batch >= 1)");
    s.cu = cu_seqlens->contiguous();
    s.batch = s.cu.numel() - 1;
  }
  if (positions.has_value()) {
    check(positions->scalar_type() == at::kLong, "positions.dtype", c10::toString(positions->scalar_type()), "int64");
    check(positions->numel() == tokens, "positions.numel()", positions->numel(),
          "the number of tokens = " + std::to_string(tokens));
    s.positions = positions->contiguous();
  }
  return s;
}

torch::autograd::variable_list first_derivative_only(torch::autograd::variable_list grads, const char* op) {
  if (!at::GradMode::is_enabled()) return grads;
  for (at::Tensor& g : grads) {
    if (!g.defined()) continue;
    g = g.detach();
    g.set_requires_grad(true);
  }
  auto error = std::make_shared<torch::autograd::DelayedError>(
      std::string("rotary: ") + op +
          " has no second derivative (its backward is a fused kernel); differentiate its gradient through the plain "
          "torch path, or call backward without create_graph",
      int(grads.size()));
  return (*error)(std::move(grads));
}

}  // namespace rotary::torch_ops
