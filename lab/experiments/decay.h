// lab/experiments/decay.h: RoPE's long-term decay (RoFormer section 3.4.3, seed 003), as a bound and as measured on a
// trained model.
//
// The bound. With h_i = q_[2i:2i+1] k*_[2i:2i+1] (pair i of q and k as complex numbers) and the partial sums
// S_j = sum_{i<j} e^{i (m - n) theta_i} (S_0 = 0), Abel summation gives
//   |sum_i h_i e^{i (m - n) theta_i}| <= (max_i |h_{i+1} - h_i|) * sum_{j=1}^{r/2} |S_j|,
// so the score's content-free envelope as a function of the distance m - n is the "relative upper bound"
//   B(m - n) = a^2 / (r/2) * sum_{j=1}^{r/2} |S_j|
// (RoFormer's figure 2 plots it for d = 128, base 10000). theta_i are the RopeSpec's actual inverse frequencies,
// so every scaling changes it; a (the attention factor, YaRN's) multiplies q and k, hence a^2. Computed in float64.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rotary/rope_spec.h"
#include "rotary_nn/model.h"
#include "tasks/task.h"

namespace rotary::experiments {

// The largest distance a decay curve is computed to: 4 x the longest training length (2^20) the lab accepts;
// beyond it the CSV alone would grow past a hundred megabytes.
constexpr int64_t kMaxDecayDistance = int64_t{1} << 22;

// B(distance) for distance = 0 .. max_distance (inclusive): [max_distance + 1]. max_distance in
// [0, kMaxDecayDistance].
std::vector<double> decay_bound(const RopeFreqs& freqs, int64_t max_distance);

// Measured on a trained RoPE-family model (its active encoding, overrides included) over held-out windows.
struct MeasuredDecay {
  // Content fixed, distance varied (what the bound is about): pairs (q_i, k_j) of un-rotated projections sampled
  // from the windows (every layer and head alike), each scored as if it sat at distance d:
  // scale * a^2 * sum_p h_p e^{i d theta_p} over the rotated pairs. [max_distance + 1]
  std::vector<double> abs_score;   // mean |.|: the quantity the bound bounds
  std::vector<double> mean_score;  // mean real part: the actual rotated-pair contribution to the logit
  // In context: the model's pre-softmax logits and softmax probabilities at their actual distance i - j, averaged
  // over windows, queries, heads and layers (log-n included). [seq_len]
  std::vector<double> context_score;
  std::vector<double> context_prob;
  int64_t samples = 0;             // (q, k) pairs in abs_score / mean_score
  int seq_len = 0, windows = 0, layers = 0, heads = 0;
};

// rotary::Error if the model's active encoding is not rope (ReRoPE etc. are not functions of m - n alone), or
// for windows / seq_len / samples out of range.
MeasuredDecay measure_decay(nn::Transformer& model, const lab::Task& task, int windows, int seq_len,
                            int64_t max_distance, int64_t samples, uint64_t seed);

// Writes <out>/decay_bound.csv (distance, one column per spec), decay_bound.png, and with a measurement
// decay_model.csv and decay_model.png (bound and measured |q R k|, each divided by its value at distance 0) and
// attention_by_distance.png. Returns the PNGs made; `problem` says why plots are missing.
struct DecayCurve {
  std::string name;    // column / legend name
  RopeSpec spec;
  std::vector<double> bound;
};
std::vector<std::string> write_decay_outputs(const std::string& out_dir, const std::vector<DecayCurve>& curves,
                                             const MeasuredDecay* measured, std::string& problem);

}  // namespace rotary::experiments
