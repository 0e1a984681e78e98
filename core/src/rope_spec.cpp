// RopeSpec: validation, names, and the inverse frequencies + attention factor of every scaling type.
//
// Each scaling type follows Hugging Face transformers' modeling_rope_utils.py (newest behaviour; the version
// differences are in docs/rope-scaling.md) but computes in float64 where HF computes in float32, so we agree
// with HF to float32 rounding (~1e-6 relative), not bit for bit.
#include "rotary/rope_spec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>
#include <optional>
#include <string>

#include "rotary/error.h"

namespace rotary {

namespace {

// Lower case with '-' read as '_', so "half-split", "Half_Split" and "half_split" are one name.
std::string normalized(std::string_view name) {
  std::string s(name);
  for (char& c : s) {
    if (c == '-') c = '_';
    else if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  }
  return s;
}

// Shortest text that reads back to the same double, integers in full: "1000000", "0.707", "1e-05".
std::string num(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(int64_t(v));  // 1000000, not 1e+06
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

bool finite_positive(double v) { return std::isfinite(v) && v > 0; }

void check_factor_list(const std::vector<double>& list, const char* field, int pairs) {
  check(int64_t(list.size()) == pairs, std::string(field) + ".size()", list.size(),
        "rotary_dim / 2 = " + std::to_string(pairs) + " entries (one per rotation pair)");
  for (size_t i = 0; i < list.size(); ++i)
    check(finite_positive(list[i]), std::string(field) + "[" + std::to_string(i) + "]", list[i],
          "a finite value > 0");
}

// The context length a type's formula uses as "original": original_max_position_embeddings when given, else
// max_position_embeddings (what transformers 5 fills in for yarn, llama3 and longrope when the config lacks it).
int64_t original_context(const RopeSpec& s) {
  return s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings : s.max_position_embeddings;
}

// inv_i = base^(-2i/r), i < r/2, the exponent as HF writes it: arange(0, r, 2) / r. `field` names the value
// the base came from (the base itself unless `value` is given): a base far below 1 (a config's rope_theta = 1e-310,
// or ntk_fixed's base scaled by a tiny factor) overflows base^(-2i/r) to inf, refused here rather than turned into
// NaN angles.
std::vector<double> default_inv_freq(double base, int r, const char* field = "base",
                                     std::optional<double> value = std::nullopt) {
  std::vector<double> inv(size_t(r / 2));
  for (int i = 0; i < r / 2; ++i) {
    inv[size_t(i)] = 1.0 / std::pow(base, double(2 * i) / double(r));
    if (!std::isfinite(inv[size_t(i)]))
      fail(field, num(value.value_or(base)),
           "a value whose inverse frequencies base^(-2i/r) are finite at rotary_dim r = " + std::to_string(r) +
               " (base " + num(base) + " overflows at pair " + std::to_string(i) + ")");
  }
  return inv;
}

// inv_freq[j] = `value` after dividing by a per-pair factor (longrope's lists, explicit freq_factors): a factor
// so small that the frequency overflows is refused with the list entry named.
double finite_after_list_entry(double value, const std::vector<double>& list, size_t j, const char* field) {
  if (!std::isfinite(value))
    fail(std::string(field) + "[" + std::to_string(j) + "]", num(list[j]),
         "a factor large enough that inv_freq[" + std::to_string(j) + "] stays finite");
  return value;
}

// YaRN's attention scale for a context stretched by `scale`: 0.1 m ln(scale) + 1, and 1 when not stretched.
double yarn_get_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

// YaRN (NTK-by-parts): pairs that turn more than beta_fast times over the original context keep their
// frequency, pairs that turn fewer than beta_slow times are interpolated (divided by factor), a linear ramp
// in between. `inv` comes in as the default frequencies (the extrapolation). Returns the attention factor.
double yarn_freqs(const RopeSpec& s, int r, std::vector<double>& inv) {
  const double base = s.base, factor = s.factor;
  const double l_orig = double(original_context(s));
  // The pair index at which a frequency turns `rotations` times over l_orig (fractional).
  auto correction_dim = [&](double rotations) {
    return double(r) * std::log(l_orig / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
  };
  double low = correction_dim(s.yarn.beta_fast);
  double high = correction_dim(s.yarn.beta_slow);
  if (s.yarn.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(r - 1));  // HF clamps to dim - 1, not to the last pair index
  if (low == high) high += 0.001;        // HF: prevents a division by zero in the ramp

  const std::vector<double> extrapolation = inv;
  for (size_t j = 0; j < inv.size(); ++j) {
    const double ramp = std::clamp((double(j) - low) / (high - low), 0.0, 1.0);
    const double keep = 1.0 - ramp;  // HF's inv_freq_extrapolation_factor
    const double interpolation = 1.0 / (factor * std::pow(base, double(2 * j) / double(r)));
    inv[j] = interpolation * (1.0 - keep) + extrapolation[j] * keep;
  }
  if (s.yarn.mscale && s.yarn.mscale_all_dim) {
    // 0.1 m ln(factor) + 1 overflows for m near the largest double: refused, not an inf / NaN attention factor.
    const double num_scale = yarn_get_mscale(factor, *s.yarn.mscale);
    const double den_scale = yarn_get_mscale(factor, *s.yarn.mscale_all_dim);
    check(std::isfinite(num_scale), "yarn.mscale", *s.yarn.mscale,
          "a value with 0.1 * mscale * ln(factor) + 1 finite (factor " + num(factor) + ")");
    check(std::isfinite(den_scale), "yarn.mscale_all_dim", *s.yarn.mscale_all_dim,
          "a value with 0.1 * mscale_all_dim * ln(factor) + 1 finite (factor " + num(factor) + ")");
    return num_scale / den_scale;
  }
  return yarn_get_mscale(factor, 1.0);
}

// Llama 3.1: wavelengths longer than L/low_freq_factor are interpolated by `factor`, shorter than
// L/high_freq_factor kept, a smooth blend in between (L = original context).
void llama3_freqs(const RopeSpec& s, std::vector<double>& inv) {
  const double l_orig = double(original_context(s));
  const double lo = s.llama3.low_freq_factor, hi = s.llama3.high_freq_factor;
  const double low_freq_wavelen = l_orig / lo, high_freq_wavelen = l_orig / hi;
  for (double& f : inv) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_freq_wavelen) {
      f = f / s.factor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth = (l_orig / wavelen - lo) / (hi - lo);
      f = (1.0 - smooth) * f / s.factor + smooth * f;
    }
  }
}

}  // namespace

std::string_view layout_name(RopeLayout l) {
  switch (l) {
    case RopeLayout::Interleaved: return "interleaved";
    case RopeLayout::HalfSplit: return "half_split";
  }
  return "?";
}

std::string_view scaling_name(RopeScaling s) {
  switch (s) {
    case RopeScaling::None: return "none";
    case RopeScaling::Linear: return "linear";
    case RopeScaling::NtkFixed: return "ntk_fixed";
    case RopeScaling::NtkMixed: return "ntk_mixed";
    case RopeScaling::Dynamic: return "dynamic";
    case RopeScaling::Yarn: return "yarn";
    case RopeScaling::Llama3: return "llama3";
    case RopeScaling::LongRope: return "longrope";
    case RopeScaling::Explicit: return "explicit";
  }
  return "?";
}

RopeLayout parse_layout(std::string_view name) {
  const std::string n = normalized(name);
  if (n == "interleaved" || n == "gptj" || n == "rotate_every_two") return RopeLayout::Interleaved;
  if (n == "half_split" || n == "halfsplit" || n == "neox" || n == "rotate_half") return RopeLayout::HalfSplit;
  fail("layout", std::string(name), "interleaved (gptj, rotate_every_two), half_split (neox, rotate_half)");
}

RopeScaling parse_scaling(std::string_view name) {
  const std::string n = normalized(name);
  if (n == "none" || n == "default") return RopeScaling::None;
  if (n == "linear") return RopeScaling::Linear;
  if (n == "ntk" || n == "ntk_fixed") return RopeScaling::NtkFixed;
  if (n == "ntk_mixed") return RopeScaling::NtkMixed;
  if (n == "dynamic") return RopeScaling::Dynamic;
  if (n == "yarn") return RopeScaling::Yarn;
  if (n == "llama3") return RopeScaling::Llama3;
  if (n == "longrope" || n == "su") return RopeScaling::LongRope;
  if (n == "explicit") return RopeScaling::Explicit;
  fail("scaling", std::string(name),
       "none (default), linear, ntk_fixed (ntk), ntk_mixed, dynamic, yarn, llama3, longrope (su), explicit");
}

void RopeSpec::validate() const {
  check(head_dim >= 2 && head_dim <= 4096, "head_dim", head_dim, "2..4096");
  check(rotary_dim == 0 || (rotary_dim >= 2 && rotary_dim <= head_dim && rotary_dim % 2 == 0), "rotary_dim",
        rotary_dim, "0 (= head_dim) or an even number in [2, head_dim=" + std::to_string(head_dim) + "]");
  const int r = rotary_dim_resolved();
  check(r % 2 == 0, "head_dim", head_dim, "an even number when rotary_dim is 0 (all features rotate in pairs)");
  check(finite_positive(base), "base", base, "a finite value > 0");
  check(layout == RopeLayout::Interleaved || layout == RopeLayout::HalfSplit, "layout", int(layout),
        "interleaved, half_split");
  check(max_position_embeddings >= 0, "max_position_embeddings", max_position_embeddings, ">= 0 (0: not given)");
  check(original_max_position_embeddings >= 0, "original_max_position_embeddings",
        original_max_position_embeddings, ">= 0 (0: not given)");
  if (attention_factor)
    check(finite_positive(*attention_factor), "attention_factor", *attention_factor, "a finite value > 0");

  // The types Hugging Face defines warn below factor 1 (an extension, not a compression); we refuse it.
  const bool hf_factor = scaling == RopeScaling::Linear || scaling == RopeScaling::Dynamic ||
                         scaling == RopeScaling::Yarn || scaling == RopeScaling::Llama3 ||
                         scaling == RopeScaling::LongRope;
  if (hf_factor)
    check(std::isfinite(factor) && factor >= 1.0, "factor", factor,
          std::string("a finite value >= 1 for ") + std::string(scaling_name(scaling)));
  else if (scaling == RopeScaling::NtkFixed || scaling == RopeScaling::NtkMixed)
    check(finite_positive(factor), "factor", factor, "a finite value > 0");

  switch (scaling) {
    case RopeScaling::None:
    case RopeScaling::Linear:
      break;
    case RopeScaling::NtkFixed:
      check(r >= 4, "rotary_dim", r, ">= 4 for ntk_fixed (the base exponent is r / (r - 2))");
      break;
    case RopeScaling::NtkMixed:
      check(finite_positive(ntk_mixed_exponent), "ntk_mixed_exponent", ntk_mixed_exponent, "a finite value > 0");
      break;
    case RopeScaling::Dynamic:
      check(r >= 4, "rotary_dim", r, ">= 4 for dynamic (the base exponent is r / (r - 2))");
      check(max_position_embeddings >= 1, "max_position_embeddings", max_position_embeddings,
            ">= 1 for dynamic (the length beyond which the base grows)");
      break;
    case RopeScaling::Yarn:
      check(std::isfinite(base) && base > 1.0, "base", base, "a finite value > 1 for yarn (ln(base) divides)");
      check(original_context(*this) >= 1, "original_max_position_embeddings", original_max_position_embeddings,
            ">= 1 for yarn (or max_position_embeddings >= 1 to stand in for it)");
      check(finite_positive(yarn.beta_slow), "yarn.beta_slow", yarn.beta_slow, "a finite value > 0");
      check(std::isfinite(yarn.beta_fast) && yarn.beta_fast > yarn.beta_slow, "yarn.beta_fast", yarn.beta_fast,
            "a finite value > beta_slow = " + num(yarn.beta_slow));
      if (yarn.mscale) check(finite_positive(*yarn.mscale), "yarn.mscale", *yarn.mscale, "a finite value > 0");
      if (yarn.mscale_all_dim)
        check(finite_positive(*yarn.mscale_all_dim), "yarn.mscale_all_dim", *yarn.mscale_all_dim,
              "a finite value > 0");
      break;
    case RopeScaling::Llama3:
      check(original_context(*this) >= 1, "original_max_position_embeddings", original_max_position_embeddings,
            ">= 1 for llama3 (or max_position_embeddings >= 1 to stand in for it)");
      check(finite_positive(llama3.low_freq_factor), "llama3.low_freq_factor", llama3.low_freq_factor,
            "a finite value > 0");
      check(std::isfinite(llama3.high_freq_factor) && llama3.high_freq_factor > llama3.low_freq_factor,
            "llama3.high_freq_factor", llama3.high_freq_factor,
            "a finite value > low_freq_factor = " + num(llama3.low_freq_factor));
      break;
    case RopeScaling::LongRope:
      check(original_context(*this) >= 2, "original_max_position_embeddings", original_max_position_embeddings,
            ">= 2 for longrope (or max_position_embeddings >= 2 to stand in for it; ln of it divides)");
      check_factor_list(short_factor, "short_factor", r / 2);
      check_factor_list(long_factor, "long_factor", r / 2);
      break;
    case RopeScaling::Explicit:
      check_factor_list(freq_factors, "freq_factors", r / 2);
      break;
    default:
      fail("scaling", std::to_string(int(scaling)), "a RopeScaling enumerator");
  }
}

RopeFreqs RopeSpec::freqs(int64_t seq_len) const {
  validate();
  check(seq_len >= 0, "seq_len", seq_len, ">= 0 (0: not longer than max_position_embeddings)");
  const int r = rotary_dim_resolved();
  RopeFreqs out;
  out.head_dim = head_dim;
  out.rotary_dim = r;
  out.layout = layout;
  out.inv_freq = default_inv_freq(base, r);
  std::vector<double>& inv = out.inv_freq;
  double attention = 1.0;

  switch (scaling) {
    case RopeScaling::None:
      break;
    case RopeScaling::Linear:
      for (double& f : inv) f /= factor;
      break;
    case RopeScaling::NtkFixed:
      inv = default_inv_freq(base * std::pow(factor, double(r) / double(r - 2)), r, "factor", factor);
      break;
    case RopeScaling::NtkMixed: {
      // lambda_j = exp(a j^b) with a = ln(factor) / (r/2)^b: 1 at j = 0, growing towards factor.
      const double b = ntk_mixed_exponent;
      const double a = std::log(factor) / std::pow(double(r / 2), b);
      for (size_t j = 0; j < inv.size(); ++j) {
        inv[j] /= std::exp(a * std::pow(double(j), b));
        if (!std::isfinite(inv[j]))
          fail("factor", num(factor),
               "a value whose ntk_mixed frequencies are finite (pair " + std::to_string(j) + " overflows)");
      }
      break;
    }
    case RopeScaling::Dynamic: {
      const double m = double(max_position_embeddings);
      const double l = seq_len > max_position_embeddings ? double(seq_len) : m;
      // The scaled base only grows (factor >= 1, l >= m): at worst inf, and inv_freq then 0, never inf.
      inv = default_inv_freq(base * std::pow(factor * l / m - (factor - 1.0), double(r) / double(r - 2)), r);
      break;
    }
    case RopeScaling::Yarn:
      attention = yarn_freqs(*this, r, inv);
      break;
    case RopeScaling::Llama3:
      llama3_freqs(*this, inv);
      break;
    case RopeScaling::LongRope: {
      const int64_t l_orig = original_context(*this);
      const std::vector<double>& ext = seq_len > l_orig ? long_factor : short_factor;
      const char* list_name = seq_len > l_orig ? "long_factor" : "short_factor";
      for (size_t j = 0; j < inv.size(); ++j)
        inv[j] = finite_after_list_entry(1.0 / (ext[j] * std::pow(base, double(2 * j) / double(r))), ext, j, list_name);
      attention = factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(double(l_orig)));
      break;
    }
    case RopeScaling::Explicit:
      for (size_t j = 0; j < inv.size(); ++j)
        inv[j] = finite_after_list_entry(inv[j] / freq_factors[j], freq_factors, j, "freq_factors");
      break;
  }
  out.attention_factor = attention_factor ? *attention_factor : attention;
  out.validate();
  return out;
}

std::string RopeSpec::describe() const {
  std::string s = "rope(d=" + std::to_string(head_dim) + ", r=" + std::to_string(rotary_dim_resolved()) +
                  ", base=" + num(base) + ", " + std::string(layout_name(layout)) + ", " +
                  std::string(scaling_name(scaling));
  switch (scaling) {
    case RopeScaling::None:
      break;
    case RopeScaling::Linear:
    case RopeScaling::NtkFixed:
      s += "(factor=" + num(factor) + ")";
      break;
    case RopeScaling::NtkMixed:
      s += "(factor=" + num(factor) + ", exponent=" + num(ntk_mixed_exponent) + ")";
      break;
    case RopeScaling::Dynamic:
      s += "(factor=" + num(factor) + ", max_pos=" + std::to_string(max_position_embeddings) + ")";
      break;
    case RopeScaling::Yarn:
      s += "(factor=" + num(factor) + ", orig_max_pos=" + std::to_string(original_context(*this)) +
           ", beta_fast=" + num(yarn.beta_fast) + ", beta_slow=" + num(yarn.beta_slow);
      if (yarn.mscale) s += ", mscale=" + num(*yarn.mscale);
      if (yarn.mscale_all_dim) s += ", mscale_all_dim=" + num(*yarn.mscale_all_dim);
      s += std::string(", truncate=") + (yarn.truncate ? "true" : "false") + ")";
      break;
    case RopeScaling::Llama3:
      s += "(factor=" + num(factor) + ", low_freq_factor=" + num(llama3.low_freq_factor) +
           ", high_freq_factor=" + num(llama3.high_freq_factor) +
           ", orig_max_pos=" + std::to_string(original_context(*this)) + ")";
      break;
    case RopeScaling::LongRope:
      s += "(factor=" + num(factor) + ", orig_max_pos=" + std::to_string(original_context(*this)) + ", " +
           std::to_string(short_factor.size()) + " short/" + std::to_string(long_factor.size()) + " long factors)";
      break;
    case RopeScaling::Explicit:
      s += "(" + std::to_string(freq_factors.size()) + " freq_factors)";
      break;
  }
  if (attention_factor) s += ", attention_factor=" + num(*attention_factor);
  return s + ")";
}

}  // namespace rotary
