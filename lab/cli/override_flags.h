// lab/cli/override_flags.h: the inference-time encoding overrides (--kind, --scaling, --window, ...) of the commands
// that run a model - a trained run (eval, generate) or a checkpoint (generate) - torch-free.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "cli/options.h"
#include "rotary/error.h"
#include "rotary/rope_spec.h"
#include "rotary/settings.h"
#include "rotary_nn/config.h"

namespace rotary::cli {

// Inference-time encoding overrides; each flag given changes one field of the trained encoding.
struct OverrideFlags {
  std::string kind, scaling;
  double factor = 0, base = 0, leaky_k = 0;
  int64_t original_max = 0, window = 0, logn = -1;
  CLI::Option *kind_opt, *scaling_opt, *factor_opt, *base_opt, *original_opt, *window_opt, *leaky_opt, *logn_opt;

  void add_to(CLI::App& app) {
    // The ranges are the trained fields' own (nn::model_settings); whether a value fits the trained model is
    // nn::apply_override's to say.
    auto range = [](const std::string& path) { return range_of(settings::find_setting(nn::model_settings(), path).allowed); };
    kind_opt = app.add_option("--kind", kind, "run as another rope-family kind (rope -> rerope, leaky_rerope)");
    scaling_opt = app.add_option("--scaling", scaling, "rope scaling: none, linear, ntk, ntk_mixed, dynamic, yarn, llama3");
    factor_opt = app.add_option("--factor", factor, "rope scaling factor")->transform(range("encoding.rope.factor"));
    base_opt = app.add_option("--base", base, "rope base")->transform(range("encoding.rope.base"));
    original_opt = app.add_option("--original-max", original_max, "pre-extension context (yarn, llama3, dynamic)")
                       ->transform(range("encoding.rope.original_max_position_embeddings"));
    window_opt = app.add_option("--window", window, "rerope / leaky_rerope window")->transform(range("encoding.window"));
    leaky_opt = app.add_option("--leaky-k", leaky_k, "leaky_rerope k")->transform(range("encoding.leaky_k"));
    logn_opt = app.add_option("--logn", logn, "log-n query scaling training length (0 = off)")
                   ->transform(range("encoding.logn_train_len"));
  }

  bool any() const {
    for (CLI::Option* o : {kind_opt, scaling_opt, factor_opt, base_opt, original_opt, window_opt, leaky_opt, logn_opt})
      if (o->count() > 0) return true;
    return false;
  }

  // The override the flags describe (empty when none is given).
  nn::EncodingOverride override_of(const nn::ModelConfig& trained) const {
    nn::EncodingOverride o;
    if (!any()) return o;
    if (kind_opt->count()) o.kind = nn::parse_encoding_kind(kind, "--kind");
    if (scaling_opt->count() || factor_opt->count() || base_opt->count() || original_opt->count()) {
      RopeSpec s = trained.resolved_encoding().rope;
      if (scaling_opt->count()) s.scaling = parse_scaling(scaling);
      if (factor_opt->count()) s.factor = factor;
      if (base_opt->count()) s.base = base;
      if (original_opt->count()) s.original_max_position_embeddings = original_max;
      // A value the resulting scaling does not read is refused rather than silently dropped.
      check(!factor_opt->count() || (s.scaling != RopeScaling::None && s.scaling != RopeScaling::Explicit), "--factor",
            factor, "with a scaling that reads it (--scaling linear, ntk, ntk_mixed, dynamic, yarn, llama3, longrope, "
                    "or a checkpoint trained with one; the scaling here is " + std::string(scaling_name(s.scaling)) + ")");
      check(!original_opt->count() || s.scaling == RopeScaling::Yarn || s.scaling == RopeScaling::Llama3 ||
                s.scaling == RopeScaling::LongRope,
            "--original-max", original_max,
            "with a scaling that reads it (--scaling yarn, llama3, longrope; the scaling here is " +
                std::string(scaling_name(s.scaling)) + ")");
      o.rope = s;
    }
    if (window_opt->count()) o.window = window;
    if (leaky_opt->count()) o.leaky_k = leaky_k;
    if (logn_opt->count()) o.logn_train_len = logn;
    return o;
  }
};

}  // namespace rotary::cli
