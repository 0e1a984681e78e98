// lab/experiments/decay.cpp
#include "experiments/decay.h"

#include <cmath>
#include <fmt/format.h>
#include <random>

#include "common/files.h"
#include "common/plots.h"
#include "rotary/error.h"
#include "rotary_nn/attention.h"

namespace rotary::experiments {

std::vector<double> decay_bound(const RopeFreqs& freqs, int64_t max_distance) {
  freqs.validate();
  check(max_distance >= 0 && max_distance <= kMaxDecayDistance, "max_distance", max_distance,
        "an integer in [0, " + std::to_string(kMaxDecayDistance) + "]");
  const int pairs = freqs.pairs();
  const double a2 = freqs.attention_factor * freqs.attention_factor;
  std::vector<double> bound(static_cast<size_t>(max_distance) + 1);
  for (int64_t d = 0; d <= max_distance; ++d) {
    double re = 0, im = 0, sum = 0;  // S_j = sum_{i<j} e^{i d theta_i}, accumulated pair by pair
    for (int j = 0; j < pairs; ++j) {
      const double angle = static_cast<double>(d) * freqs.inv_freq[static_cast<size_t>(j)];
      re += std::cos(angle);
      im += std::sin(angle);
      sum += std::hypot(re, im);
    }
    bound[static_cast<size_t>(d)] = a2 * sum / pairs;
  }
  return bound;
}

namespace {

// Pair p of the rotated features as a complex number: [N, D] -> [N, r/2] complex128.
torch::Tensor as_complex_pairs(const torch::Tensor& x, const nn::EncodingConfig& e) {
  const int64_t r = e.rope.rotary_dim, half = r / 2;
  const torch::Tensor xr = x.narrow(-1, 0, r).to(torch::kDouble);
  torch::Tensor re, im;
  if (e.rope.layout == RopeLayout::HalfSplit) {
    re = xr.narrow(-1, 0, half), im = xr.narrow(-1, half, half);
  } else {
    using torch::indexing::Slice;
    re = xr.index({"...", Slice(0, r, 2)}), im = xr.index({"...", Slice(1, r, 2)});
  }
  return torch::complex(re.contiguous(), im.contiguous());
}

}  // namespace

MeasuredDecay measure_decay(nn::Transformer& model, const lab::Task& task, int windows, int seq_len,
                            int64_t max_distance, int64_t samples, uint64_t seed) {
  const nn::EncodingConfig& e = model->active_encoding();
  check(e.kind == nn::EncodingKind::Rope, "encoding.kind", e.kind,
        "rope (the decay is a function of the distance m - n only under plain RoPE)");
  check(model->config().attention == nn::AttentionKind::Softmax, "attention", model->config().attention, "softmax");
  check(windows >= 1, "windows", windows, ">= 1");
  check(seq_len >= 2, "seq_len", seq_len, ">= 2");
  check(samples >= 1 && samples <= (int64_t{1} << 24), "samples", samples, "an integer in [1, 16777216]");
  check(max_distance >= 0 && max_distance <= kMaxDecayDistance, "max_distance", max_distance,
        "an integer in [0, " + std::to_string(kMaxDecayDistance) + "]");
  const int64_t available = task.heldout_rows(seq_len);
  check(available == 0 || windows <= available, "windows", windows,
        fmt::format("at most {} (held-out rows of length {})", available, seq_len));

  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  const nn::ModelConfig& cfg = model->config();
  const int64_t W = windows, S = seq_len, H = cfg.n_heads;
  std::vector<int64_t> ids;
  for (int i = 0; i < windows; ++i) {
    const std::vector<int32_t> row = task.heldout_sequence(seed, i, seq_len).tokens;
    ids.insert(ids.end(), row.begin(), row.begin() + S);
  }
  const torch::Tensor tokens = torch::tensor(ids, torch::kInt64).view({W, S});                        // [W, S]
  const torch::Tensor pos = torch::arange(S, torch::kInt64).expand({W, S}).contiguous();               // [W, S]
  const nn::PositionContext pc = nn::make_position_context(e, cfg.n_heads, cfg.head_dim(), S);
  const double A = pc.attention_factor;

  MeasuredDecay out;
  out.seq_len = seq_len;
  out.windows = windows;
  out.heads = cfg.n_heads;
  std::vector<double> score_sum(static_cast<size_t>(S), 0.0), prob_sum(static_cast<size_t>(S), 0.0);
  std::vector<double> n_sum(static_cast<size_t>(S), 0.0);
  torch::Tensor abs_sum = torch::zeros({max_distance + 1}, torch::kDouble), re_sum = abs_sum.clone();  // [D + 1]
  // e^{i d theta_p}: [r/2, D + 1]
  const torch::Tensor dist = torch::arange(max_distance + 1, torch::kDouble);
  const torch::Tensor phase = pc.inv_freq.to(torch::kDouble).unsqueeze(1) * dist.unsqueeze(0);
  const torch::Tensor rot = torch::complex(phase.cos(), phase.sin());
  std::mt19937_64 rng(seed);
  const int64_t per_layer = std::max<int64_t>(1, samples / cfg.n_layers);

  // The model's own forward, block by block, with an attention that also records the scores.
  auto record = [&](const torch::Tensor& q, const torch::Tensor& k) {  // q [W, S, H, D], k [W, S, Hkv, D]
    const torch::Tensor kk = nn::repeat_kv(k, q.size(2) / k.size(2));                            // [W, S, H, D]
    const torch::Tensor qs = q * nn::logn_factor(pos, e.logn_train_len, q.scalar_type());
    const torch::Tensor qr = nn::rotate_plain(qs, pos.to(torch::kDouble), pc, A).permute({0, 2, 1, 3});  // [W, H, S, D]
    const torch::Tensor kr = nn::rotate_plain(kk, pos.to(torch::kDouble), pc, A).permute({0, 2, 3, 1});  // [W, H, D, S]
    torch::Tensor s = (torch::matmul(qr, kr) * pc.softmax_scale).to(torch::kDouble);                     // [W, H, S, S]
    const torch::Tensor future = torch::ones({S, S}, torch::kBool).triu(1);
    const torch::Tensor p = torch::softmax(s.masked_fill(future, -INFINITY), -1);                        // [W, H, S, S]
    for (int64_t d = 0; d < S; ++d) {
      score_sum[d] += s.diagonal(-d, 2, 3).sum().item<double>();
      prob_sum[d] += p.diagonal(-d, 2, 3).sum().item<double>();
      n_sum[d] += static_cast<double>(W * H * (S - d));
    }
    // Content-fixed samples: a query and an earlier-or-equal key of the same head and window.
    std::vector<int64_t> qi, ki;  // flat indices into [W, S, H]
    for (int64_t n = 0; n < per_layer; ++n) {
      const int64_t b = static_cast<int64_t>(rng() % W), h = static_cast<int64_t>(rng() % H);
      const int64_t i = static_cast<int64_t>(rng() % S), j = static_cast<int64_t>(rng() % (i + 1));
      qi.push_back((b * S + i) * H + h);
      ki.push_back((b * S + j) * H + h);
    }
    const torch::Tensor qf = q.reshape({W * S * H, -1}).index_select(0, torch::tensor(qi));   // [N, D]
    const torch::Tensor kf = kk.reshape({W * S * H, -1}).index_select(0, torch::tensor(ki));  // [N, D]
    const torch::Tensor h = as_complex_pairs(qf, e) * as_complex_pairs(kf, e).conj();          // [N, r/2]
    const torch::Tensor at = torch::matmul(h, rot) * (pc.softmax_scale * A * A);               // [N, D + 1]
    abs_sum += at.abs().sum(0);
    re_sum += torch::real(at).sum(0);
    out.samples += per_layer;
  };
  torch::Tensor x = model->named_parameters()["tok_emb.weight"].index_select(0, tokens.reshape({-1})).view({W, S, -1});
  for (const auto& child : model->named_children()) {
    auto block = std::dynamic_pointer_cast<nn::BlockImpl>(child.value());
    if (!block) continue;
    ++out.layers;
    x = block->forward(x, [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
      record(q, k);
      return nn::model_attention(q, k, v, pos, pc, cfg.attention, cfg.fused);
    });
  }
  if (was_training) model->train();

  out.abs_score.resize(static_cast<size_t>(max_distance) + 1);
  out.mean_score.resize(out.abs_score.size());
  auto as = abs_sum.accessor<double, 1>();
  auto rs = re_sum.accessor<double, 1>();
  for (int64_t d = 0; d <= max_distance; ++d) {
    out.abs_score[d] = as[d] / static_cast<double>(out.samples);
    out.mean_score[d] = rs[d] / static_cast<double>(out.samples);
  }
  for (int64_t d = 0; d < S; ++d) {
    out.context_score.push_back(score_sum[d] / n_sum[d]);
    out.context_prob.push_back(prob_sum[d] / n_sum[d]);
  }
  return out;
}

std::vector<std::string> write_decay_outputs(const std::string& out_dir, const std::vector<DecayCurve>& curves,
                                             const MeasuredDecay* measured, std::string& problem) {
  check(!curves.empty(), "specs", "(none)", "at least one RopeSpec");
  lab::make_dirs(out_dir);
  lab::remove_stale_temp_files(out_dir);
  const size_t n = curves.front().bound.size();
  std::string csv = "distance";
  for (const DecayCurve& c : curves) csv += "," + c.name;
  csv += "\n";
  for (size_t d = 0; d < n; ++d) {
    csv += std::to_string(d);
    for (const DecayCurve& c : curves) csv += fmt::format(",{:.9g}", c.bound[d]);
    csv += "\n";
  }
  lab::write_file_atomic(lab::join_path(out_dir, "decay_bound.csv"), csv);

  const std::string csv_columns = "set datafile separator ','";
  lab::Figure bound{"decay_bound.png",
                    "RoFormer's relative upper bound a^2/(r/2) sum_j |S_j| against the relative distance",
                    "relative distance m - n", "relative upper bound", {csv_columns}, {}};
  for (size_t i = 0; i < curves.size(); ++i)
    bound.series.push_back(fmt::format("'decay_bound.csv' using 1:{} with lines lw 2 title {} noenhanced", i + 2,
                                       lab::gnuplot_quoted(curves[i].name)));
  std::vector<lab::Figure> figures{bound};
  std::vector<std::string> pngs{lab::join_path(out_dir, "decay_bound.png")};

  if (measured) {
    const MeasuredDecay& m = *measured;
    const double b0 = curves.front().bound[0], a0 = m.abs_score[0];
    std::string mcsv = "distance,bound,bound_relative,abs_score,abs_score_relative,mean_score,context_score,context_prob\n";
    for (size_t d = 0; d < m.abs_score.size(); ++d) {
      const bool ctx = d < m.context_score.size();
      mcsv += fmt::format("{},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{},{}\n", d, curves.front().bound[d],
                          curves.front().bound[d] / b0, m.abs_score[d], m.abs_score[d] / a0, m.mean_score[d],
                          ctx ? fmt::format("{:.9g}", m.context_score[d]) : "",
                          ctx ? fmt::format("{:.9g}", m.context_prob[d]) : "");
    }
    lab::write_file_atomic(lab::join_path(out_dir, "decay_model.csv"), mcsv);
    figures.push_back({"decay_model.png",
                       fmt::format("Bound vs the model's own q, k placed at distance m - n ({} samples), each / its "
                                   "value at 0", m.samples),
                       "relative distance m - n", "relative to distance 0", {csv_columns},
                       {"'decay_model.csv' using 1:3 with lines lw 2 title 'bound (spec)'",
                        "'decay_model.csv' using 1:5 with lines lw 2 title 'measured mean |q R(m-n) k|' noenhanced"}});
    figures.push_back({"attention_by_distance.png",
                       fmt::format("Attention in context: mean softmax probability by distance ({} windows x {} "
                                   "tokens, all heads and layers)", m.windows, m.seq_len),
                       "distance i - j", "mean attention probability", {csv_columns, "set logscale y"},
                       {"'decay_model.csv' using 1:8 with lines lw 2 title 'p(i, j)'"}});
    pngs.push_back(lab::join_path(out_dir, "decay_model.png"));
    pngs.push_back(lab::join_path(out_dir, "attention_by_distance.png"));
  }
  problem = lab::run_gnuplot(out_dir, lab::figure_script(figures));
  std::vector<std::string> made;
  for (const std::string& p : pngs)
    if (lab::file_exists(p)) made.push_back(p);
  return made;
}

}  // namespace rotary::experiments
