// rotary::rope_table / rope_table_ - rotate x by cos / sin tables the caller gives (rotary/rope_table.h): the kernel
// under rotary.apply_rotary_emb (flash-attn's contract) and rotary.apply_rotary_pos_emb (transformers').
//
//   torch.ops.rotary.rope_table(x, cos, sin, rows, rotary_dim, layout, width, transpose) -> Tensor
//   torch.ops.rotary.rope_table_(x, cos, sin, rows, rotary_dim, layout, width, transpose) -> Tensor  (in place)
// x [B, S, H, D] with any strides whose last dim is contiguous (so transformers' [B, H, S, D] passes as its
// transpose(1, 2) view, with no copy); rows [B, S] int64: the table row of each token; cos, sin [rows, width]
// with width "pairs" (rotary_dim / 2 entries) or "features" (rotary_dim entries). The tables are converted once to
// float32 (float64 for a float64 x). Autograd lives in the Python package (rotary/rotary_emb.py): the gradient is
// the same op with transpose=True, and the in-place form must mark x dirty, which a Python Function does.
#include <torch/torch.h>

#include "rotary/error.h"
#include "rotary/rope_table.h"
#include "rotary_torch/convert.h"

namespace rotary::torch_ops {
namespace {

TableWidth parse_width(c10::string_view w) {
  if (w == "pairs") return TableWidth::Pairs;
  if (w == "features") return TableWidth::Features;
  fail("width", std::string(w), "pairs, features");
}

at::Tensor table_as(const at::Tensor& t, const char* field, at::ScalarType type) {
  check(t.device().is_cpu(), std::string(field) + ".device", t.device().str(), "cpu");
  check(t.dim() == 2, std::string(field) + ".dim()", t.dim(), "2 ([rows, width])");
  at::Tensor out = t.to(type);
  return out.stride(1) == 1 && out.stride(0) >= out.size(1) ? out : out.contiguous();
}

// Runs the kernel from x_in into x_out (the same tensor in place), one batch row at a time: a batch row of a
// [B, H, S, D] tensor seen as [B, S, H, D] is a strided [S, H, D] view the kernel takes as it is.
void run(const at::Tensor& x_in, const at::Tensor& x_out, const at::Tensor& cos, const at::Tensor& sin,
         const at::Tensor& rows, int64_t rotary_dim, c10::string_view layout, c10::string_view width, bool transpose) {
  check(x_in.device().is_cpu(), "x.device", x_in.device().str(), "cpu");
  check(x_in.dim() == 4, "x.dim()", x_in.dim(), "4 ([batch, seqlen, heads, head_dim])");
  check(x_in.stride(3) == 1, "x.stride(-1)", x_in.stride(3), "1 (the head_dim elements contiguous)");
  check(rows.scalar_type() == at::kLong, "rows.dtype", c10::toString(rows.scalar_type()), "int64");
  check(rows.dim() == 2 && rows.size(0) == x_in.size(0) && rows.size(1) == x_in.size(1), "rows.shape",
        c10::str(rows.sizes()), "[batch, seqlen] of x = " + c10::str(x_in.sizes().slice(0, 2)));
  const DType dtype = core_dtype(x_in, "x");
  const at::ScalarType table_type = dtype == DType::F64 ? at::kDouble : at::kFloat;
  const at::Tensor c = table_as(cos, "cos", table_type), s = table_as(sin, "sin", table_type);
  check(c.sizes() == s.sizes(), "sin.shape", c10::str(sin.sizes()), "the shape of cos = " + c10::str(cos.sizes()));
  const at::Tensor r = rows.contiguous();
  RopeTableParams p;
  p.head_dim = int(x_in.size(3));
  p.rotary_dim = int(rotary_dim);
  p.layout = parse_layout(std::string(layout));
  p.width = parse_width(width);
  check(c.size(1) == p.table_width(), "cos.shape[-1]", c.size(1),
        std::string(width == "pairs" ? "rotary_dim / 2" : "rotary_dim") + " = " + std::to_string(p.table_width()));
  check(c.stride(0) == s.stride(0), "sin.stride(0)", s.stride(0), "cos.stride(0)");
  p.cos = c.data_ptr();
  p.sin = s.data_ptr();
  p.table_rows = c.size(0);
  p.row_stride = c.stride(0);
  p.tokens = x_in.size(1);
  p.dtype = dtype;
  p.transpose = transpose;
  for (int64_t b = 0; b < x_in.size(0); ++b) {
    const at::Tensor xi = x_in[b], xo = x_out[b];  // [S, H, D]
    p.rows = r.data_ptr<int64_t>() + b * r.size(1);
    p.x_in = HeadsView{xi.data_ptr(), xi.size(1), xi.stride(0), xi.stride(1)};
    p.x_out = HeadsView{xo.data_ptr(), xo.size(1), xo.stride(0), xo.stride(1)};
    rope_table_apply(p);
  }
}

at::Tensor rope_table_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& rows,
                          int64_t rotary_dim, c10::string_view layout, c10::string_view width, bool transpose) {
  const at::Tensor in = x.dim() == 4 && x.stride(3) != 1 ? x.contiguous() : x;
  at::Tensor out = at::empty_like(in);  // x's own strides when dense: a [B, H, S, D] input gives a [B, H, S, D] output
  run(in, out, cos, sin, rows, rotary_dim, layout, width, transpose);
  return out;
}

at::Tensor rope_table_inplace_cpu(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& rows,
                                  int64_t rotary_dim, c10::string_view layout, c10::string_view width,
                                  bool transpose) {
  run(x, x, cos, sin, rows, rotary_dim, layout, width, transpose);
  return x;
}

}  // namespace
}  // namespace rotary::torch_ops

TORCH_LIBRARY_FRAGMENT(rotary, m) {
  m.def("rope_table(Tensor x, Tensor cos, Tensor sin, Tensor rows, int rotary_dim, str layout, str width, "
        "bool transpose) -> Tensor");
  m.def("rope_table_(Tensor(a!) x, Tensor cos, Tensor sin, Tensor rows, int rotary_dim, str layout, str width, "
        "bool transpose) -> Tensor(a!)");
}
TORCH_LIBRARY_IMPL(rotary, CPU, m) {
  m.impl("rope_table", rotary::torch_ops::rope_table_cpu);
  m.impl("rope_table_", rotary::torch_ops::rope_table_inplace_cpu);
}
// Differentiated by the Python package (rotary/embedding.py): past the autograd key to the backend (CPU, or Meta).
TORCH_LIBRARY_IMPL(rotary, Autograd, m) {
  m.impl("rope_table", torch::CppFunction::makeFallthrough());
  m.impl("rope_table_", torch::CppFunction::makeFallthrough());
}
