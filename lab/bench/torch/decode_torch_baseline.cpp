// The seed's ReRoPE decode step in PyTorch, the baseline of `rotary bench decode` (lab/bench/decode_torch_baseline.h).
#include "bench/decode_torch_baseline.h"

#include <torch/torch.h>

#include "bench/torch/torch_rotations.h"

#include <cmath>
#include <cstring>
#include <memory>

namespace rotary::bench {
namespace {

using torch::indexing::Slice;

// [1, Hkv, T, D] -> [1, Hkv * groups, T, D], as transformers' repeat_kv.
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const auto s = x.sizes();
  return x.index({Slice(), Slice(), torch::indexing::None})
      .expand({s[0], s[1], groups, s[2], s[3]})
      .reshape({s[0], s[1] * groups, s[2], s[3]});
}

struct State {
  torch::Tensor k, v, q;             // [1, Hkv, T, D], [1, Hkv, T, D], [1, Hq, 1, D]
  torch::Tensor cos_cached, sin_cached;  // [max_pos, D] f32 (HF caches these once)
  torch::Tensor positions;           // [1, T] int64, 0..T-1
  int64_t window = 0, groups = 1, dim = 0;
};

}  // namespace

std::function<void(float*)> make_torch_rerope_decode(const TorchRerotateCase& c) {
  torch::set_num_threads(c.threads);
  torch::NoGradGuard no_grad;
  auto st = std::make_shared<State>();
  const int64_t T = c.context, D = c.dim;
  st->k = torch::from_blob(const_cast<float*>(c.k), {T, c.hkv, D}, torch::kFloat32).permute({1, 0, 2}).unsqueeze(0).contiguous();
  st->v = torch::from_blob(const_cast<float*>(c.v), {T, c.hkv, D}, torch::kFloat32).permute({1, 0, 2}).unsqueeze(0).contiguous();
  st->q = torch::from_blob(const_cast<float*>(c.q), {1, c.hq, 1, D}, torch::kFloat32).clone();
  const auto inv = torch::from_blob(const_cast<double*>(c.inv_freq), {D / 2}, torch::kFloat64).clone();
  const auto t = torch::arange(T, torch::kFloat64);
  const auto freqs = torch::outer(t, inv);
  const auto emb = torch::cat({freqs, freqs}, -1);  // [T, D]
  st->cos_cached = emb.cos().to(torch::kFloat32);
  st->sin_cached = emb.sin().to(torch::kFloat32);
  st->positions = torch::arange(T, torch::kInt64).unsqueeze(0);
  st->window = c.window;
  st->groups = c.hq / c.hkv;
  st->dim = D;
  return [st](float* o) {
    torch::NoGradGuard guard;
    // position_ids = (position_ids[:, -1] - position_ids).clip(max=window): the clipped distance of every key.
    const auto rel = (st->positions.index({Slice(), Slice(-1, torch::indexing::None)}) - st->positions)
                         .clamp_max(st->window);                                       // [1, T]
    const auto cos = st->cos_cached.index({rel}).unsqueeze(1);                         // [1, 1, T, D]
    const auto sin = st->sin_cached.index({rel}).unsqueeze(1);
    const auto k = st->k * cos + rotate_half(st->k) * (-sin);                          // R(-d_j) k_j
    const auto kr = repeat_kv(k, st->groups), vr = repeat_kv(st->v, st->groups);       // [1, Hq, T, D]
    const auto scores = torch::matmul(st->q, kr.transpose(2, 3)) / std::sqrt(double(st->dim));  // [1, Hq, 1, T]
    const auto probs = torch::softmax(scores, -1, torch::kFloat32);
    const auto out = torch::matmul(probs, vr).contiguous();                            // [1, Hq, 1, D]
    std::memcpy(o, out.data_ptr<float>(), size_t(out.numel()) * sizeof(float));
  };
}

}  // namespace rotary::bench
