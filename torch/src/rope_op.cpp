// rotary::rope - rotate x [..., H, D] by per-token positions [...]; autograd through the transpose rotation.
//
//   torch.ops.rotary.rope(x, positions, inv_freq, attention_factor, layout, direction) -> Tensor
// direction: "forward" (a R(p)), "inverse" (R(-p)/a), "transpose" (a R(-p)). The gradient of each is again one
// rotation: forward <-> transpose, and inverse's transpose R(p)/a is "forward" with factor 1/a.
#include <torch/torch.h>

#include "rotary/error.h"
#include "rotary/rope.h"
#include "rotary_torch/convert.h"
#include "rotary_torch/ops.h"

namespace rotary::torch_ops {
namespace {

RopeDirection parse_direction(const std::string& d) {
  if (d == "forward") return RopeDirection::Forward;
  if (d == "inverse") return RopeDirection::Inverse;
  if (d == "transpose") return RopeDirection::Transpose;
  fail("direction", d, "forward, inverse, transpose");
}

at::Tensor rope_cpu(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& inv_freq,
                    double attention_factor, c10::string_view layout, c10::string_view direction) {
  const at::Tensor x3 = as_tokens_heads_dim(x, "x");
  const int64_t tokens = x3.size(0);
  check(positions.scalar_type() == at::kLong, "positions.dtype", c10::toString(positions.scalar_type()), "int64");
  check(positions.numel() == tokens, "positions.numel()", positions.numel(),
        "the number of tokens in x (x.shape[:-2] flattened) = " + std::to_string(tokens));
  const at::Tensor pos = positions.contiguous();
  const RopeFreqs f = freqs_from(inv_freq, attention_factor, std::string(layout), x3.size(2));
  at::Tensor out = at::empty_like(x3, at::MemoryFormat::Contiguous);
  RopeParams p;
  p.freqs = &f;
  p.tokens = tokens;
  p.positions = pos.data_ptr<int64_t>();
  p.dtype = core_dtype(x, "x");
  p.q_in = heads_view(x3);
  p.q_out = heads_view(out);
  p.direction = parse_direction(std::string(direction));
  rope_apply(p);
  return out.view(x.sizes());
}

at::Tensor rope_dispatch(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& inv_freq, double a,
                         c10::string_view layout, c10::string_view direction) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("rotary::rope", "").typed<decltype(rope_cpu)>();
  return op.call(x, positions, inv_freq, a, layout, direction);
}

class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& positions,
                            const at::Tensor& inv_freq, double a, c10::string_view layout,
                            c10::string_view direction) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({positions, inv_freq});
    ctx->saved_data["a"] = a;
    ctx->saved_data["layout"] = std::string(layout);
    ctx->saved_data["direction"] = std::string(direction);
    return rope_dispatch(x, positions, inv_freq, a, layout, direction);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    double a = ctx->saved_data["a"].toDouble();
    const std::string layout = ctx->saved_data["layout"].toStringRef();
    const std::string dir = ctx->saved_data["direction"].toStringRef();
    std::string back = "transpose";
    if (dir == "transpose") back = "forward";
    if (dir == "inverse") back = "forward", a = 1.0 / a;
    at::Tensor dx = rope_dispatch(grads[0].contiguous(), saved[0], saved[1], a, layout, back);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor rope_autograd(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& inv_freq, double a,
                         c10::string_view layout, c10::string_view direction) {
  return RopeFunction::apply(x, positions, inv_freq, a, layout, direction);
}

}  // namespace

at::Tensor rope(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& inv_freq,
                double attention_factor, const std::string& layout, const std::string& direction) {
  return rope_dispatch(x, positions, inv_freq, attention_factor, layout, direction);
}

}  // namespace rotary::torch_ops

TORCH_LIBRARY_FRAGMENT(rotary, m) {
  m.def("rope(Tensor x, Tensor positions, Tensor inv_freq, float attention_factor, str layout, str direction) -> Tensor");
}
TORCH_LIBRARY_IMPL(rotary, CPU, m) { m.impl("rope", rotary::torch_ops::rope_cpu); }
TORCH_LIBRARY_IMPL(rotary, Autograd, m) { m.impl("rope", rotary::torch_ops::rope_autograd); }
