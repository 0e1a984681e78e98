#include "rotary_torch/convert.h"

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

}  // namespace rotary::torch_ops
