// rotary/rope_spec.h: what a rotation is (RopeSpec) and the frequencies it yields (RopeFreqs).
//
// A RopeSpec is the full description of a model's rotary embedding: head dim, rotary dim (partial rotation),
// base, pair layout and context-extension scaling. RopeSpec::freqs(seq_len) turns it into the per-pair inverse
// frequencies and the attention factor, exactly as Hugging Face transformers computes them for its rope types
// (see ../shared/reference/position-encodings.md and docs/rope-scaling.md), but in float64.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rotary {

// The largest |position| (and distance, window, context length) any kernel takes: positions stay exact as doubles,
// from which the angles are computed.
inline constexpr int64_t kMaxAbsPosition = int64_t(1) << 53;

// Which features form rotation pair i (r = rotary_dim).
enum class RopeLayout : uint8_t {
  Interleaved,  // (2i, 2i+1): RoFormer, GPT-J, Meta's Llama code ("rotate every two")
  HalfSplit,    // (i, i + r/2): GPT-NeoX, Hugging Face Llama ("rotate half")
};

enum class RopeScaling : uint8_t {
  None,      // inv_i = base^(-2i/r)                                     (HF "default")
  Linear,    // position interpolation: inv_i / factor                   (HF "linear")
  NtkFixed,  // base' = base * factor^(r/(r-2))                          (vLLM / Su "ntk")
  NtkMixed,  // inv_i / exp(a * i^b), a = ln(factor) / (r/2)^b           (Su, kexue.fm 9706)
  Dynamic,   // NTK with base' recomputed from the current length        (HF "dynamic")
  Yarn,      // NTK-by-parts ramp + attention factor                     (HF "yarn")
  Llama3,    // wavelength bands                                          (HF "llama3")
  LongRope,  // per-pair short/long factor lists + attention factor      (HF "longrope", old "su")
  Explicit,  // inv_i / freq_factors[i], factors given by the user
};

// The features (a, b) of rotation pair i < r/2 under a layout: the one place the two layouts differ. Rotating the
// pair by angle t is (x_a, x_b) -> (x_a cos t - x_b sin t, x_a sin t + x_b cos t).
struct RopePair {
  int a, b;
};
inline constexpr RopePair rope_pair(RopeLayout layout, int rotary_dim, int i) {
  return layout == RopeLayout::Interleaved ? RopePair{2 * i, 2 * i + 1} : RopePair{i, i + rotary_dim / 2};
}

std::string_view layout_name(RopeLayout l);
std::string_view scaling_name(RopeScaling s);
// Accept our names and Hugging Face's ("default", "linear", "dynamic", "yarn", "llama3", "longrope", "su",
// "ntk", "ntk_mixed", ...); throw rotary::Error listing the choices otherwise.
RopeLayout parse_layout(std::string_view name);
RopeScaling parse_scaling(std::string_view name);

// What the kernels consume: per-pair inverse frequencies and the attention factor (which multiplies cos and
// sin, so both q and k; the logits scale by its square).
struct RopeFreqs {
  int head_dim = 0;
  int rotary_dim = 0;
  RopeLayout layout = RopeLayout::HalfSplit;
  std::vector<double> inv_freq;  // [rotary_dim / 2]
  double attention_factor = 1.0;

  int pairs() const { return rotary_dim / 2; }
  // Throws rotary::Error if the fields do not fit together (used by every kernel entry point).
  void validate() const;
};

struct YarnParams {
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale;          // DeepSeek-style: attention_factor = get_mscale(f, mscale) / get_mscale(f, mscale_all_dim)
  std::optional<double> mscale_all_dim;
  bool truncate = true;                  // round the correction range to integers (HF default true)
};

struct Llama3Params {
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
};

struct RopeSpec {
  int head_dim = 0;
  int rotary_dim = 0;  // 0 means head_dim; must be even and <= head_dim; the exponent uses rotary_dim
  double base = 10000.0;
  RopeLayout layout = RopeLayout::HalfSplit;

  RopeScaling scaling = RopeScaling::None;
  double factor = 1.0;                        // linear, ntk, dynamic, yarn, llama3 (and longrope's derived factor)
  int64_t max_position_embeddings = 0;        // the model's configured context (dynamic, yarn, longrope)
  int64_t original_max_position_embeddings = 0;  // pre-extension context (yarn, llama3, longrope); 0: not given
  double ntk_mixed_exponent = 0.75;           // b in lambda_j = exp(a * j^b)
  YarnParams yarn;
  Llama3Params llama3;
  std::vector<double> short_factor;           // longrope, r/2 entries
  std::vector<double> long_factor;            // longrope, r/2 entries
  std::vector<double> freq_factors;           // explicit, r/2 entries
  std::optional<double> attention_factor;     // overrides the computed attention factor (any type; HF configs give it for yarn, longrope)

  int rotary_dim_resolved() const { return rotary_dim == 0 ? head_dim : rotary_dim; }

  // Throws rotary::Error naming the first field that is out of range.
  void validate() const;

  // Inverse frequencies and attention factor for a sequence of length seq_len (only dynamic and longrope
  // depend on it; 0 means "not longer than max_position_embeddings").
  RopeFreqs freqs(int64_t seq_len = 0) const;

  // One line, for logs and reports: "rope(d=128, r=128, base=10000, half_split, yarn(factor=4, ...))".
  std::string describe() const;
};


}  // namespace rotary
