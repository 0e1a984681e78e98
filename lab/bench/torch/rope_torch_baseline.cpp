// The PyTorch composition baseline of `rotary bench rope` (see lab/bench/rope_torch_baseline.h).
#include "bench/rope_torch_baseline.h"

#include <torch/torch.h>

#include "bench/torch/torch_rotations.h"

#include <memory>

namespace rotary::bench {
namespace {

struct State {
  torch::Tensor q, cos, sin;
  bool interleaved = false;
};

}  // namespace

std::function<void()> make_torch_rope(const TorchRopeCase& c) {
  torch::set_num_threads(c.threads);
  torch::NoGradGuard no_grad;
  const auto dtype = c.bf16 ? torch::kBFloat16 : torch::kFloat32;
  auto st = std::make_shared<State>();
  st->interleaved = c.interleaved;
  // freqs [tokens, dim/2] in float64 as HF does in float32 (the baseline's accuracy is not what is measured).
  const auto inv = torch::pow(c.base, -torch::arange(0, c.dim, 2, torch::kFloat64) / double(c.dim));
  const auto pos = torch::from_blob(const_cast<int64_t*>(c.positions), {c.tokens}, torch::kInt64).to(torch::kFloat64);
  const auto angles = torch::outer(pos, inv);
  const auto emb = c.interleaved ? angles.repeat_interleave(2, -1) : torch::cat({angles, angles}, -1);  // [T, dim]
  st->cos = emb.cos().to(dtype).view({1, c.tokens, 1, c.dim});
  st->sin = emb.sin().to(dtype).view({1, c.tokens, 1, c.dim});
  st->q = torch::rand({1, c.tokens, c.heads, c.dim}, torch::kFloat32).to(dtype);
  return [st] {
    torch::NoGradGuard guard;
    const auto& q = st->q;
    const auto out = q * st->cos + (st->interleaved ? rotate_every_two(q) : rotate_half(q)) * st->sin;
    (void)out;
  };
}

namespace {

struct QkState {
  torch::Tensor q, k, cos, sin, pe;
};

std::shared_ptr<QkState> make_qk(const TorchQkCase& c) {
  torch::set_num_threads(c.threads);
  torch::NoGradGuard no_grad;
  const auto dtype = c.bf16 ? torch::kBFloat16 : torch::kFloat32;
  auto st = std::make_shared<QkState>();
  const auto inv = torch::pow(10000.0, -torch::arange(0, c.dim, 2, torch::kFloat64) / double(c.dim));
  const auto angles = torch::outer(torch::arange(c.seq, torch::kFloat64), inv);
  const auto emb = torch::cat({angles, angles}, -1);  // [seq, dim]
  st->cos = emb.cos().to(dtype).view({c.seq, 1, 1, c.dim});
  st->sin = emb.sin().to(dtype).view({c.seq, 1, 1, c.dim});
  st->pe = torch::rand({c.seq, 1, 1, c.dim}, torch::kFloat32).to(dtype);  // a learned table's values
  st->q = torch::rand({c.seq, c.batch, c.heads, c.dim}, torch::kFloat32).to(dtype);
  st->k = torch::rand({c.seq, c.batch, c.heads, c.dim}, torch::kFloat32).to(dtype);
  return st;
}

}  // namespace

std::function<void()> make_torch_rotary_qk(const TorchQkCase& c) {
  auto st = make_qk(c);
  return [st] {
    torch::NoGradGuard guard;
    const auto q = st->q * st->cos + rotate_half(st->q) * st->sin;
    const auto k = st->k * st->cos + rotate_half(st->k) * st->sin;
    (void)q, (void)k;
  };
}

std::function<void()> make_torch_additive_qk(const TorchQkCase& c) {
  auto st = make_qk(c);
  return [st] {
    torch::NoGradGuard guard;
    const auto q = st->q + st->pe;
    const auto k = st->k + st->pe;
    (void)q, (void)k;
  };
}

}  // namespace rotary::bench
