// `rotary freqs`: the inverse frequencies and attention factor of a rotation, as JSON.
//
// The rotation comes from flags (--head-dim, --scaling, ...) or from a Hugging Face config.json (--hf-config);
// --seq-len matters for dynamic (the base grows past max_position_embeddings) and longrope (long factors past
// the original context). Bad values throw rotary::Error, which main() prints before exiting with status 2.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "rotary/error.h"
#include "rotary/hf_config.h"
#include "rotary/rope_spec.h"

namespace rotary::cli {
namespace {

struct FreqsArgs {
  std::string hf_config;
  int64_t seq_len = 0;
  std::string layout = "half_split";
  int head_dim = 0;
  int rotary_dim = 0;
  double partial_rotary_factor = 1.0;
  double base = 10000.0;
  std::string scaling = "none";
  double factor = 1.0;
  int64_t max_position_embeddings = 0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 0.0, mscale_all_dim = 0.0;
  bool no_truncate = false;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  std::vector<double> short_factor, long_factor, freq_factors;
  double attention_factor = 1.0;
  double ntk_mixed_exponent = 0.75;
};

// The flags that describe a rotation by hand; none of them may be combined with --hf-config.
const char* const kSpecFlags[] = {"--head-dim", "--rotary-dim", "--partial-rotary-factor", "--base", "--scaling",
                                  "--factor", "--max-position-embeddings", "--original-max-position-embeddings",
                                  "--beta-fast", "--beta-slow", "--mscale", "--mscale-all-dim", "--no-truncate",
                                  "--low-freq-factor", "--high-freq-factor", "--short-factor", "--long-factor",
                                  "--freq-factors", "--attention-factor", "--ntk-mixed-exponent"};

RopeSpec spec_from_flags(const CLI::App& cmd, const FreqsArgs& a) {
  auto given = [&](const char* flag) { return cmd.get_option(flag)->count() > 0; };
  RopeSpec s;
  if (!given("--head-dim")) fail("--head-dim", "missing", "an even head dimension (or --hf-config FILE)");
  s.head_dim = a.head_dim;
  if (given("--rotary-dim") && given("--partial-rotary-factor"))
    fail("--partial-rotary-factor", to_text(a.partial_rotary_factor), "not together with --rotary-dim");
  if (given("--partial-rotary-factor")) {
    check(a.partial_rotary_factor > 0 && a.partial_rotary_factor <= 1, "--partial-rotary-factor",
          a.partial_rotary_factor, "a fraction in (0, 1]");
    s.rotary_dim = int(double(a.head_dim) * a.partial_rotary_factor);  // int(head_dim * factor), as HF
    check(s.rotary_dim >= 2 && s.rotary_dim % 2 == 0, "--partial-rotary-factor", a.partial_rotary_factor,
          "a fraction giving an even rotary dim >= 2 (int(" + std::to_string(a.head_dim) + " * factor) = " +
              std::to_string(s.rotary_dim) + ")");
  } else {
    s.rotary_dim = a.rotary_dim;
  }
  s.base = a.base;
  s.scaling = parse_scaling(a.scaling);
  s.max_position_embeddings = a.max_position_embeddings;
  s.original_max_position_embeddings = a.original_max_position_embeddings;
  s.factor = a.factor;
  // As transformers 5: yarn and longrope without a factor take max / original context.
  if (!given("--factor") && (s.scaling == RopeScaling::Yarn || s.scaling == RopeScaling::LongRope) &&
      a.max_position_embeddings > 0 && a.original_max_position_embeddings > 0)
    s.factor = double(a.max_position_embeddings) / double(a.original_max_position_embeddings);
  s.ntk_mixed_exponent = a.ntk_mixed_exponent;
  s.yarn.beta_fast = a.beta_fast;
  s.yarn.beta_slow = a.beta_slow;
  if (given("--mscale")) s.yarn.mscale = a.mscale;
  if (given("--mscale-all-dim")) s.yarn.mscale_all_dim = a.mscale_all_dim;
  s.yarn.truncate = !a.no_truncate;
  s.llama3.low_freq_factor = a.low_freq_factor;
  s.llama3.high_freq_factor = a.high_freq_factor;
  s.short_factor = a.short_factor;
  s.long_factor = a.long_factor;
  s.freq_factors = a.freq_factors;
  if (given("--attention-factor")) s.attention_factor = a.attention_factor;
  return s;
}

using Json = nlohmann::ordered_json;  // keys in the order written: the spec first, then what it yields

Json optional_json(const std::optional<double>& v) { return v ? Json(*v) : Json(); }

Json spec_json(const RopeSpec& s) {
  return {{"describe", s.describe()},
          {"head_dim", s.head_dim},
          {"rotary_dim", s.rotary_dim_resolved()},
          {"base", s.base},
          {"layout", layout_name(s.layout)},
          {"scaling", scaling_name(s.scaling)},
          {"factor", s.factor},
          {"max_position_embeddings", s.max_position_embeddings},
          {"original_max_position_embeddings", s.original_max_position_embeddings},
          {"ntk_mixed_exponent", s.ntk_mixed_exponent},
          {"yarn",
           {{"beta_fast", s.yarn.beta_fast},
            {"beta_slow", s.yarn.beta_slow},
            {"mscale", optional_json(s.yarn.mscale)},
            {"mscale_all_dim", optional_json(s.yarn.mscale_all_dim)},
            {"truncate", s.yarn.truncate}}},
          {"llama3", {{"low_freq_factor", s.llama3.low_freq_factor}, {"high_freq_factor", s.llama3.high_freq_factor}}},
          {"short_factor", s.short_factor},
          {"long_factor", s.long_factor},
          {"freq_factors", s.freq_factors},
          {"attention_factor", optional_json(s.attention_factor)}};
}

void run_freqs(const CLI::App& cmd, const FreqsArgs& a) {
  RopeSpec spec;
  if (!a.hf_config.empty()) {
    for (const char* flag : kSpecFlags)
      if (cmd.get_option(flag)->count() > 0)
        fail(flag, "given with --hf-config", "either --hf-config FILE or the spec flags (with --hf-config only "
                                             "--seq-len and --layout)");
    spec = rope_spec_from_hf_config_file(a.hf_config);
  } else {
    spec = spec_from_flags(cmd, a);
  }
  if (cmd.get_option("--layout")->count() > 0) spec.layout = parse_layout(a.layout);
  const RopeFreqs f = spec.freqs(a.seq_len);
  const Json out = {{"spec", spec_json(spec)},
                              {"rotary_dim", f.rotary_dim},
                              {"seq_len", a.seq_len},
                              {"inv_freq", f.inv_freq},
                              {"attention_factor", f.attention_factor}};
  std::printf("%s\n", out.dump(2).c_str());
}

const CommandRegistrar kRegisterFreqs([](CLI::App& root) {
  auto args = std::make_shared<FreqsArgs>();
  CLI::App* cmd = root.add_subcommand(
      "freqs", "Print a rotation's spec, inverse frequencies and attention factor as JSON (from flags or a "
               "Hugging Face config.json)");
  FreqsArgs& a = *args;
  cmd->add_option("--hf-config", a.hf_config, "Hugging Face config.json (or a model directory holding one)");
  cmd->add_option("--seq-len", a.seq_len, "sequence length (dynamic and longrope depend on it; 0: not longer "
                                          "than max_position_embeddings)")
      ->transform(integer_in(0, int64_t{1} << 53));
  cmd->add_option("--layout", a.layout, "pair layout: half_split (HF, GPT-NeoX) or interleaved (GPT-J, Meta)");
  cmd->add_option("--head-dim", a.head_dim, "head dimension")->transform(integer_in(0, 4096));
  cmd->add_option("--rotary-dim", a.rotary_dim, "rotated features (even, <= head dim; 0: all)")->transform(integer_in(0, 4096));
  cmd->add_option("--partial-rotary-factor", a.partial_rotary_factor, "rotary dim = int(head_dim * this)")->transform(finite_in(0, 1));
  cmd->add_option("--base", a.base, "rope base (theta)")->transform(finite());
  cmd->add_option("--scaling", a.scaling,
                  "none, linear, ntk_fixed, ntk_mixed, dynamic, yarn, llama3, longrope, explicit");
  cmd->add_option("--factor", a.factor, "scaling factor (yarn/longrope without it: max / original context)")->transform(finite());
  cmd->add_option("--max-position-embeddings", a.max_position_embeddings, "the model's configured context")->transform(integer_in(0, int64_t{1} << 53));
  cmd->add_option("--original-max-position-embeddings", a.original_max_position_embeddings,
                  "pre-extension context (yarn, llama3, longrope)")->transform(integer_in(0, int64_t{1} << 53));
  cmd->add_option("--beta-fast", a.beta_fast, "yarn: extrapolate pairs turning more often than this")->transform(finite());
  cmd->add_option("--beta-slow", a.beta_slow, "yarn: interpolate pairs turning less often than this")->transform(finite());
  cmd->add_option("--mscale", a.mscale, "yarn (DeepSeek): attention factor numerator's mscale")->transform(finite());
  cmd->add_option("--mscale-all-dim", a.mscale_all_dim, "yarn (DeepSeek): attention factor denominator's mscale")->transform(finite());
  cmd->add_flag("--no-truncate", a.no_truncate, "yarn: keep the correction range unrounded");
  cmd->add_option("--low-freq-factor", a.low_freq_factor, "llama3 low_freq_factor")->transform(finite());
  cmd->add_option("--high-freq-factor", a.high_freq_factor, "llama3 high_freq_factor")->transform(finite());
  cmd->add_option("--short-factor", a.short_factor, "longrope short factors, comma separated (rotary_dim/2)")
      ->delimiter(',')->transform(finite());
  cmd->add_option("--long-factor", a.long_factor, "longrope long factors, comma separated (rotary_dim/2)")
      ->delimiter(',')->transform(finite());
  cmd->add_option("--freq-factors", a.freq_factors, "explicit per-pair divisors, comma separated (rotary_dim/2)")
      ->delimiter(',')->transform(finite());
  cmd->add_option("--attention-factor", a.attention_factor, "override the computed attention factor")->transform(finite());
  cmd->add_option("--ntk-mixed-exponent", a.ntk_mixed_exponent, "ntk_mixed: b in lambda_j = exp(a j^b)")->transform(finite());
  cmd->callback([cmd, args] { run_freqs(*cmd, *args); });
});

}  // namespace
}  // namespace rotary::cli
