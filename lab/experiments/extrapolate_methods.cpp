// lab/experiments/extrapolate_methods.cpp
#include "experiments/extrapolate_methods.h"

#include <algorithm>
#include <span>
#include <fmt/format.h>

#include "experiments/checkpoint_model.h"
#include "rotary/error.h"

namespace rotary::experiments {
namespace {

std::string method_choices(std::span<const std::string_view> names) {
  std::string s;
  for (std::string_view n : names) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

// "16" for 16.0, "2.5" for 2.5: labels and file names without trailing zeros.
std::string short_number(double v) { return fmt::format("{:g}", v); }

}  // namespace

void check_method_name(const std::string& name, const std::string& field, bool checkpoint) {
  const std::span<const std::string_view> names =
      checkpoint ? std::span<const std::string_view>(kCheckpointMethods) : std::span<const std::string_view>(kExtrapolateMethods);
  check(std::find(names.begin(), names.end(), name) != names.end(), field, name, method_choices(names));
}

std::string Method::key() const {
  std::string k = name;
  if (name == "rerope" || name == "leaky_rerope") k += fmt::format("_w{}", window);
  if (name == "leaky_rerope") k += "_k" + short_number(leaky_k);
  if (name == "dynamic" && dynamic_factor != 1) k += "_f" + short_number(dynamic_factor);
  if (logn) k += "_logn";
  if (context == "memory")
    k += fmt::format("+memory_{}_W{}_k{}{}{}", memory_policy, memory_window, memory_top_k,
                     memory_dtype == "f32" ? "" : "_" + memory_dtype,
                     memory_search == "exact"          ? ""
                     : !is_paged_search(memory_search) ? "_" + memory_search
                                                       : fmt::format("_{}_B{}", memory_search, memory_page_size));
  if (context == "window") k += fmt::format("+window_W{}", memory_window);
  return k;
}

std::string Method::label(bool trained_logn) const {
  std::string l;
  if (name == "native") l = "native";
  else if (name == "rope") l = "RoPE";
  else if (name == "pi") l = "PI";
  else if (name == "ntk") l = "NTK-fixed";
  else if (name == "ntk_mixed") l = "NTK-mixed";
  else if (name == "dynamic") l = dynamic_factor == 1 ? "NTK-dynamic" : "NTK-dynamic-f" + short_number(dynamic_factor);
  else if (name == "yarn") l = "YaRN";
  else if (name == "rerope") l = fmt::format("ReRoPE-w{}", window);
  else l = fmt::format("Leaky ReRoPE-w{}-k{}", window, short_number(leaky_k));
  if (logn) l += trained_logn ? "-log n" : "-log n†";
  else if (trained_logn) l += "-no log n";
  if (context == "memory")
    l += fmt::format(" + memory ({}, W {}, top-{}{}{})", memory_policy, memory_window, memory_top_k,
                     memory_dtype == "f32" ? "" : ", " + memory_dtype,
                     memory_search == "exact"          ? ""
                     : !is_paged_search(memory_search) ? ", " + memory_search
                                                       : fmt::format(", {} B {}", memory_search, memory_page_size));
  if (context == "window") l += fmt::format(" + window W {} alone", memory_window);
  return l;
}

bool length_dependent_method(const Method& m) { return m.name == "dynamic"; }

nn::EncodingOverride method_override(const Method& m, const nn::EncodingConfig& trained, int64_t train_len,
                                     int64_t test_len) {
  check_method_name(m.name, "method", /*checkpoint=*/true);
  check(trained.kind == nn::EncodingKind::Rope, "encoding.kind", trained.kind,
        "rope (extrapolate applies inference-time methods to a RoPE model)");
  check(train_len >= 2, "train_len", train_len, ">= 2");
  check(test_len >= 1, "test_len", test_len, ">= 1");

  nn::EncodingOverride o;
  o.logn_train_len = m.logn ? train_len : 0;
  if (m.name == "native") return o;
  o.kind = m.name == "rerope" || m.name == "leaky_rerope" ? nn::parse_encoding_kind(m.name, "method")
                                                           : nn::EncodingKind::Rope;
  // The seed sets the factor of the fixed scalings from the test length; at test_len <= L it is 1 (no change).
  const double factor = std::max(1.0, static_cast<double>(test_len) / static_cast<double>(train_len));
  const bool windowed = m.name == "rerope" || m.name == "leaky_rerope";
  RopeSpec s = trained.rope;
  if (!windowed) {  // the factor methods start from the unscaled frequencies (a checkpoint's scaling removed)
    RopeSpec unscaled;
    unscaled.head_dim = s.head_dim;
    unscaled.rotary_dim = s.rotary_dim;
    unscaled.base = s.base;
    unscaled.layout = s.layout;
    s = unscaled;
  }
  if (m.name == "pi") {
    s.scaling = RopeScaling::Linear;
    s.factor = factor;
  } else if (m.name == "ntk") {
    s.scaling = RopeScaling::NtkFixed;
    s.factor = factor;
  } else if (m.name == "ntk_mixed") {
    s.scaling = RopeScaling::NtkMixed;
    s.factor = factor;
  } else if (m.name == "dynamic") {
    check(m.dynamic_factor >= 1, "dynamic_factor", m.dynamic_factor, ">= 1");
    s.scaling = RopeScaling::Dynamic;
    s.factor = m.dynamic_factor;
    s.max_position_embeddings = train_len;
  } else if (m.name == "yarn") {
    s.scaling = RopeScaling::Yarn;
    s.factor = factor;
    s.original_max_position_embeddings = train_len;
    s.max_position_embeddings = std::max(test_len, train_len);
  }
  o.rope = s;
  if (m.name == "rerope" || m.name == "leaky_rerope") {
    check(m.window >= 1 && m.window <= train_len, "window", m.window,
          fmt::format("an integer in [1, {}] (the training length; the seed finds L/4 to L/2 best)", train_len));
    o.window = m.window;
  }
  if (m.name == "leaky_rerope") {
    check(m.leaky_k >= 1, "leaky_k", m.leaky_k, "a number >= 1 (k = 1 is plain RoPE)");
    o.leaky_k = m.leaky_k;
  }
  return o;
}

}  // namespace rotary::experiments
