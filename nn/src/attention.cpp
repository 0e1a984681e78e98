// The model's attention for every encoding: plain torch ops (the baseline / independent check) and the fused
// rotary op. Conventions in rotary_nn/attention.h; formulas in ../shared/reference/position-encodings.md and
// core/include/rotary/attention.h (which the plain path follows term by term, including where the attention factor
// sits: ReRoPE's far scores are (a^2 R(w) q) . k on the rotated features).
#include "rotary_nn/attention.h"

#include <cmath>
#include <limits>

#include "rotary/error.h"
#include "rotary/t5_bias.h"
#include "rotary_torch/ops.h"

namespace rotary::nn {
namespace {

using torch::indexing::Slice;

torch::Tensor phi(const torch::Tensor& x) { return torch::elu(x) + 1; }  // > 0, RoFormer's feature map

// [B, S, H, D] -> [B, H, S, D]
torch::Tensor heads_first(const torch::Tensor& x) { return x.transpose(1, 2); }

// Causal by index with queries aligned to the end of the keys: true where key j is hidden from query i. [Sq, Sk]
torch::Tensor future_mask(int64_t sq, int64_t sk, const torch::Device& device) {
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  const torch::Tensor qi = torch::arange(sk - sq, sk, opts).unsqueeze(1);
  return torch::arange(sk, opts).unsqueeze(0) > qi;
}

}  // namespace

torch::Tensor repeat_kv(const torch::Tensor& x, int64_t group) {
  return group == 1 ? x : x.repeat_interleave(group, /*dim=*/2);
}

torch::Tensor alibi_slopes(int n_heads) {
  // Press et al.'s recipe: a geometric sequence starting at 2^(-8/n) for n a power of two; otherwise the slopes of
  // the largest power of two below n, then every other slope of twice that power.
  auto pow2_slopes = [](int n) {
    std::vector<double> s(static_cast<size_t>(n));
    for (int h = 0; h < n; ++h) s[size_t(h)] = std::pow(2.0, -8.0 * (h + 1) / n);
    return s;
  };
  int closest = 1;
  while (closest * 2 <= n_heads) closest *= 2;
  std::vector<double> slopes = pow2_slopes(closest);
  const std::vector<double> extra = pow2_slopes(2 * closest);
  for (int i = 0; int(slopes.size()) < n_heads; i += 2) slopes.push_back(extra[size_t(i)]);
  return torch::tensor(slopes, torch::kDouble);
}

torch::Tensor sinusoidal_encoding(const torch::Tensor& positions, int d_model, torch::ScalarType dtype) {
  const int64_t pairs = (d_model + 1) / 2;
  auto f64 = torch::TensorOptions().dtype(torch::kDouble).device(positions.device());
  const torch::Tensor inv = torch::pow(10000.0, -torch::arange(pairs, f64) * 2.0 / double(d_model));  // [pairs]
  const torch::Tensor angle = positions.to(torch::kDouble).unsqueeze(-1) * inv;                     // [B, S, pairs]
  const torch::Tensor pe = torch::stack({angle.sin(), angle.cos()}, -1).flatten(-2);                 // [B, S, 2 pairs]
  return pe.narrow(-1, 0, d_model).to(dtype);
}

torch::Tensor logn_factor(const torch::Tensor& positions, int64_t train_len, torch::ScalarType dtype) {
  const torch::Tensor p = positions.to(torch::kDouble);
  if (train_len == 0) return torch::ones_like(p).to(dtype).unsqueeze(-1).unsqueeze(-1);
  const torch::Tensor f = torch::clamp_min(torch::log(p + 1.0) / std::log(double(train_len)), 1.0);
  return f.to(dtype).unsqueeze(-1).unsqueeze(-1);  // [B, S, 1, 1]
}

bool length_dependent(const EncodingConfig& e) {
  return is_rotary(e.kind) && (e.rope.scaling == RopeScaling::Dynamic || e.rope.scaling == RopeScaling::LongRope);
}

PositionContext make_position_context(const EncodingConfig& enc, int n_heads, int head_dim, int64_t seq_len,
                                      const torch::Tensor& t5_bias) {
  PositionContext pc;
  pc.enc = enc;
  pc.softmax_scale = 1.0 / std::sqrt(double(head_dim));
  if (is_rotary(enc.kind)) {
    const RopeFreqs f = enc.rope.freqs(seq_len);
    pc.inv_freq = torch::tensor(f.inv_freq, torch::kDouble);
    pc.attention_factor = f.attention_factor;
  }
  if (enc.kind == EncodingKind::Alibi) pc.alibi_slopes = alibi_slopes(n_heads);
  if (enc.kind == EncodingKind::T5) {
    check(t5_bias.defined() && t5_bias.dim() == 2 && t5_bias.size(0) == enc.t5_num_buckets && t5_bias.size(1) == n_heads,
          "t5_bias", t5_bias.defined() ? to_text(t5_bias.sizes()) : "undefined",
          "a [t5_num_buckets, n_heads] table for kind t5");
    pc.t5_bias = t5_bias;
  }
  return pc;
}

torch::Tensor t5_buckets(const torch::Tensor& q_positions, const torch::Tensor& k_positions, int num_buckets,
                         int max_distance) {
  // Every causal distance at or beyond max_distance lands in the last bucket and every negative one in bucket 0,
  // so a table over [-1, max_distance] answers all of them through the core's one definition.
  std::vector<int64_t> table(size_t(max_distance) + 2);
  for (int64_t d = -1; d <= max_distance; ++d)
    table[size_t(d + 1)] = t5_relative_bucket(d, 0, /*bidirectional=*/false, num_buckets, max_distance);
  const torch::Tensor dist = q_positions.unsqueeze(2) - k_positions.unsqueeze(1);  // [B, Sq, Sk]
  const torch::Tensor lookup = torch::tensor(table, torch::kLong).to(dist.device());
  return lookup.index({torch::clamp(dist, -1, max_distance) + 1});
}

torch::Tensor rotate_plain(const torch::Tensor& x, const torch::Tensor& angle, const PositionContext& pc,
                           double factor) {
  const int64_t D = x.size(-1), r = pc.enc.rope.rotary_dim, half = r / 2;
  const torch::Tensor theta = angle.to(torch::kDouble).unsqueeze(-1) * pc.inv_freq.to(x.device());  // [B, S, r/2]
  const torch::Tensor cos = (theta.cos() * factor).to(x.scalar_type()).unsqueeze(2);               // [B, S, 1, r/2]
  const torch::Tensor sin = (theta.sin() * factor).to(x.scalar_type()).unsqueeze(2);
  const torch::Tensor xr = x.narrow(-1, 0, r);
  torch::Tensor yr;
  if (pc.enc.rope.layout == RopeLayout::HalfSplit) {
    // rotate_half: (x1, x2) -> (-x2, x1) with x1, x2 the two halves; cos/sin repeated over both halves.
    const torch::Tensor x1 = xr.narrow(-1, 0, half), x2 = xr.narrow(-1, half, half);
    const torch::Tensor rotated_half = torch::cat({-x2, x1}, -1);
    yr = xr * torch::cat({cos, cos}, -1) + rotated_half * torch::cat({sin, sin}, -1);
  } else {
    const torch::Tensor x1 = xr.index({"...", Slice(0, r, 2)}), x2 = xr.index({"...", Slice(1, r, 2)});
    yr = torch::stack({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1).flatten(-2);
  }
  return r == D ? yr : torch::cat({yr, x.narrow(-1, r, D - r)}, -1);
}

torch::Tensor softmax_attention_plain(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& q_positions, const torch::Tensor& k_positions,
                                      const PositionContext& pc) {
  const EncodingConfig& e = pc.enc;
  const int64_t Sq = q.size(1), Sk = k.size(1), group = q.size(2) / k.size(2);
  const bool rotary = is_rotary(e.kind), far = is_windowed(e.kind), roper = e.kind == EncodingKind::Roper;
  const double A = pc.attention_factor, w = double(e.window), lk = e.leaky_k;
  const torch::Tensor qp = q_positions.to(torch::kDouble), kp = k_positions.to(torch::kDouble);  // [B, S]
  const torch::Tensor qs = q * logn_factor(q_positions, e.logn_train_len, q.scalar_type());

  auto scores = [&](const torch::Tensor& qq, const torch::Tensor& kk) {  // [B, Hq, Sq, Sk]
    return torch::matmul(heads_first(qq), heads_first(repeat_kv(kk, group)).transpose(-1, -2)) * pc.softmax_scale;
  };
  const torch::Tensor qn = rotary ? rotate_plain(qs, qp, pc, A) : qs;
  const torch::Tensor kn = rotary ? rotate_plain(k, kp, pc, A) : k;
  torch::Tensor s = scores(qn, kn);
  const torch::Tensor dist = qp.unsqueeze(2) - kp.unsqueeze(1);  // [B, Sq, Sk] pos_i - pos_j
  torch::Tensor near;                                             // [B, 1, Sq, Sk]
  if (far) {
    // The seed's second matrix: ReRoPE scores far keys as (R(w) q) . k (a^2 on the rotated part, as in the core),
    // Leaky ReRoPE as (R((pos_i - w)/k + w) q) . (R(pos_j / k) k).
    torch::Tensor s2;
    if (e.kind == EncodingKind::Rerope) {
      s2 = scores(rotate_plain(qs, torch::full_like(qp, w), pc, A * A), k);
    } else {
      s2 = scores(rotate_plain(qs, (qp - w) / lk + w, pc, A), rotate_plain(k, kp / lk, pc, A));
    }
    near = (dist < w).unsqueeze(1);
    s = torch::where(near, s, s2);
  }
  if (e.kind == EncodingKind::Alibi)
    s = s - (pc.alibi_slopes.view({1, -1, 1, 1}) * dist.unsqueeze(1)).to(s.scalar_type());
  if (e.kind == EncodingKind::T5) {  // bias[bucket, h] -> [B, Hq, Sq, Sk]
    const torch::Tensor b = t5_buckets(q_positions, k_positions, e.t5_num_buckets, e.t5_max_distance);
    s = s + pc.t5_bias.index({b}).permute({0, 3, 1, 2}).to(s.scalar_type());
  }
  s = s.masked_fill(future_mask(Sq, Sk, q.device()), -std::numeric_limits<double>::infinity());
  const torch::Tensor p = torch::softmax(s, -1);

  auto weighted = [&](const torch::Tensor& probs, const torch::Tensor& values) {  // -> [B, Sq, Hq, D]
    return torch::matmul(probs, heads_first(repeat_kv(values, group))).transpose(1, 2);
  };
  if (!roper) return weighted(p, v);
  // RoPER: o_i = sum_j p_ij R(-delta_ij) v_j. Inside the window delta = pos_i - pos_j, so R(-pos_i) sum p R(pos_j) v.
  const torch::Tensor o_near = rotate_plain(weighted(far ? p * near : p, rotate_plain(v, kp, pc, 1.0)), -qp, pc, 1.0);
  if (!far) return o_near;
  torch::Tensor o_far;
  if (e.kind == EncodingKind::Rerope) {  // delta = w for every far key
    o_far = rotate_plain(weighted(p * near.logical_not(), v), torch::full_like(qp, -w), pc, 1.0);
  } else {  // delta = w + (pos_i - w)/k - pos_j/k
    o_far = rotate_plain(weighted(p * near.logical_not(), rotate_plain(v, kp / lk, pc, 1.0)), -((qp - w) / lk + w),
                         pc, 1.0);
  }
  return o_near + o_far;
}

torch::Tensor softmax_attention_fused(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& positions, const PositionContext& pc) {
  return std::get<0>(torch_ops::attention(q, k, v, positions, std::nullopt, /*causal=*/true, pc.softmax_scale,
                                          fused_attention_position(pc), fused_attention_bias(pc)));
}

torch_ops::AttentionBias fused_attention_bias(const PositionContext& pc) {
  torch_ops::AttentionBias b;
  if (pc.enc.kind == EncodingKind::Alibi) {
    b.kind = "alibi";
    b.alibi_slopes = pc.alibi_slopes;
  } else if (pc.enc.kind == EncodingKind::T5) {
    b.kind = "t5";
    b.t5_table = pc.t5_bias;
    b.t5_num_buckets = pc.enc.t5_num_buckets;
    b.t5_max_distance = pc.enc.t5_max_distance;
  }
  return b;
}

torch_ops::AttentionPosition fused_attention_position(const PositionContext& pc) {
  const EncodingConfig& e = pc.enc;
  torch_ops::AttentionPosition ap;
  if (is_rotary(e.kind)) {
    const FusedPositionMode m = fused_position_mode(e.kind);
    ap.mode = m.mode;
    ap.roper = m.roper;
    ap.inv_freq = pc.inv_freq;
    ap.attention_factor = pc.attention_factor;
    ap.layout = std::string(layout_name(e.rope.layout));
    ap.window = e.window;
    ap.leaky_k = e.leaky_k;
  }
  ap.logn_train_len = e.logn_train_len;
  return ap;
}

LinearFeatures linear_features(const torch::Tensor& x, const torch::Tensor& positions, const PositionContext& pc,
                               AttentionKind attention, const torch::Tensor& projection, bool query) {
  const bool rope = pc.enc.kind == EncodingKind::Rope;
  if (attention == AttentionKind::Performer) {
    const torch::Tensor xr = rope ? rotate_plain(x, positions, pc, pc.attention_factor) : x;
    const torch::Tensor f = performer_features(xr, projection, query);
    return {f, f};
  }
  const torch::Tensor ph = phi(x);
  return {rope ? rotate_plain(ph, positions, pc, pc.attention_factor) : ph, ph};
}

torch::Tensor linear_attention_plain(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& q_positions, const torch::Tensor& k_positions,
                                     const PositionContext& pc, AttentionKind attention,
                                     const torch::Tensor& projection) {
  const int64_t group = q.size(2) / k.size(2);
  const LinearFeatures fq = linear_features(q, q_positions, pc, attention, projection, /*query=*/true);
  const LinearFeatures fk = linear_features(k, k_positions, pc, attention, projection, /*query=*/false);
  const torch::Tensor hidden = future_mask(q.size(1), k.size(1), q.device());
  auto matrix = [&](const torch::Tensor& a, const torch::Tensor& b) {  // [B, Hq, Sq, Sk], future entries 0
    const torch::Tensor m = torch::matmul(heads_first(a), heads_first(repeat_kv(b, group)).transpose(-1, -2));
    return m.masked_fill(hidden, 0.0);
  };
  const torch::Tensor num = torch::matmul(matrix(fq.num, fk.num), heads_first(repeat_kv(v, group)));  // [B, Hq, Sq, Dv]
  const torch::Tensor den = matrix(fq.den, fk.den).sum(-1, /*keepdim=*/true);                         // [B, Hq, Sq, 1]
  return (num / den).transpose(1, 2);
}

torch::Tensor linear_attention_fused(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& positions, const PositionContext& pc,
                                     AttentionKind attention, const torch::Tensor& projection) {
  // The core kernel has one kv head per query head: GQA repeats k, v (autograd sums their gradients back).
  const int64_t group = q.size(2) / k.size(2);
  const bool rope = pc.enc.kind == EncodingKind::Rope;
  const std::string layout(layout_name(pc.enc.rope.layout));
  // The performer: rotate (the fused rope op), then FAVOR+, then the kernel on those features.
  if (attention == AttentionKind::Performer) {
    auto turned = [&](const torch::Tensor& x) {
      return rope ? torch_ops::rope(x, positions, pc.inv_freq, pc.attention_factor, layout) : x;
    };
    const torch::Tensor fq = performer_features(turned(q), projection, /*query=*/true);
    const torch::Tensor fk = performer_features(turned(k), projection, /*query=*/false);
    return torch_ops::linear_attention(fq, repeat_kv(fk, group), repeat_kv(v, group), positions, std::nullopt,
                                       /*causal=*/true, std::nullopt, 1.0, layout, "identity");
  }
  std::optional<torch::Tensor> inv_freq;  // none: no rotation
  if (rope) inv_freq = pc.inv_freq;
  return torch_ops::linear_attention(q, repeat_kv(k, group), repeat_kv(v, group), positions, std::nullopt,
                                     /*causal=*/true, inv_freq, pc.attention_factor, layout);
}

torch::Tensor draw_performer_projection(int64_t m, int64_t d, at::Generator gen) {
  auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  std::vector<torch::Tensor> blocks;
  for (int64_t rows = 0; rows < m; rows += d) {
    const torch::Tensor g = torch::randn({d, d}, gen, f64);
    auto [qm, r] = at::linalg_qr(g, "reduced");
    // Signs of R's diagonal into Q: Q is then Haar-distributed (QR alone leaves it biased toward R's sign choice).
    qm = qm * torch::sign(torch::diagonal(r)).unsqueeze(0);
    blocks.push_back(qm.t().narrow(0, 0, std::min(d, m - rows)));  // orthonormal rows
  }
  const torch::Tensor rows = torch::cat(blocks, 0);                     // [m, d]
  const torch::Tensor norms = torch::randn({m, d}, gen, f64).norm(2, -1, true);  // chi(d): the lengths of N(0, I) rows
  return (rows * norms).to(torch::kFloat);
}

torch::Tensor performer_features(const torch::Tensor& x, const torch::Tensor& projection, bool query) {
  check(projection.defined() && projection.dim() == 2 && projection.size(1) == x.size(-1), "performer projection",
        projection.defined() ? projection.sizes() : c10::IntArrayRef{}, "[m, head_dim = " + std::to_string(x.size(-1)) + "]");
  const auto work = x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  const int64_t D = x.size(-1), m = projection.size(0);
  const torch::Tensor w = projection.to(work);
  const torch::Tensor xs = x.to(work) * std::pow(double(D), -0.25);            // x' = x D^-1/4
  const torch::Tensor u = torch::matmul(xs, w.t());                             // [.., m] w_i . x'
  const torch::Tensor diag = xs.pow(2).sum(-1, /*keepdim=*/true) * 0.5;         // |x'|^2 / 2
  torch::Tensor shift;
  if (query) {
    // Per query: a factor common to its numerator and normaliser. Not detached: the output still depends on it
    // through eps, and autograd must see that dependence to match finite differences.
    shift = std::get<0>(u.max(-1, /*keepdim=*/true));
  } else {
    // w . x' - |x'|^2/2 <= |w|^2/2 for every x': a constant of the draw bounds every key feature, and nothing of a
    // key depends on another key (causal; the decoder's running sums equal the full forward).
    const double bound = (w.pow(2).sum(-1).max().item<double>()) * 0.5;
    shift = torch::full({1}, std::max(0.0, bound - kPerformerKeyExponentCap), u.options());
  }
  const torch::Tensor f = (torch::exp(u - diag - shift) + kPerformerEps) * (1.0 / std::sqrt(double(m)));
  return f.to(x.scalar_type());
}

torch::Tensor model_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& positions, const PositionContext& pc, AttentionKind attention,
                              bool fused, const torch::Tensor& projection) {
  if (attention != AttentionKind::Softmax)
    return fused ? linear_attention_fused(q, k, v, positions, pc, attention, projection)
                 : linear_attention_plain(q, k, v, positions, positions, pc, attention, projection);
  return fused ? softmax_attention_fused(q, k, v, positions, pc)
               : softmax_attention_plain(q, k, v, positions, positions, pc);
}

}  // namespace rotary::nn
