// rotary decay: RoFormer's long-term decay bound of a rotation spec (CSV + PNG), and with --checkpoint the same
// measured on a trained RoPE model's attention.
#include <cstdio>
#include <fmt/format.h>
#include <sstream>

#include "cli/command.h"
#include "cli/torch/load_model.h"
#include "cli/torch/train_flags.h"
#include "experiments/decay.h"
#include "rotary/hf_config.h"

namespace rotary::cli {
namespace {

struct DecayCommand {
  CLI::App* app = nullptr;
  std::string hf_config, layout = "half_split", scalings = "none", checkpoint, out = "runs/decay";
  int head_dim = 128, rotary_dim = 0, windows = 8, seq_len = 0, threads = 0;
  double base = 10000, factor = 1;
  int64_t max_position = 0, original_max = 0, max_distance = 0, samples = 4096;
  uint64_t seed = 0;

  bool given(const std::string& name) const { return app->get_option(name)->count() > 0; }

  // The spec of the flags (or of --hf-config) with one scaling of the list.
  RopeSpec spec_for(const std::string& scaling, const RopeSpec& from) const {
    RopeSpec s = from;
    if (given("--scaling")) s.scaling = parse_scaling(scaling);
    if (given("--factor")) s.factor = factor;
    if (given("--max-position-embeddings")) s.max_position_embeddings = max_position;
    if (given("--original-max")) s.original_max_position_embeddings = original_max;
    return s;
  }

  void run() {
    if (threads > 0) train::use_threads(threads);
    const std::vector<std::string> names = parse_name_list(scalings, "--scaling");

    std::optional<LoadedRun> run;
    RopeSpec base_spec;
    if (!checkpoint.empty()) {
      for (const char* f : {"--hf-config", "--head-dim", "--rotary-dim", "--layout", "--base"})
        check(!given(f), f, "given", "not with --checkpoint (the rotation comes from the model)");
      check(names.size() == 1, "--scaling", scalings, "one scaling with --checkpoint (it is applied to the model)");
      run = load_run(checkpoint);
      base_spec = run->model->active_encoding().rope;
    } else if (!hf_config.empty()) {
      for (const char* f : {"--head-dim", "--rotary-dim", "--layout", "--base"})
        check(!given(f), f, "given", "not with --hf-config (the rotation comes from the config)");
      base_spec = rope_spec_from_hf_config_file(hf_config);
    } else {
      base_spec.head_dim = head_dim;
      base_spec.rotary_dim = rotary_dim;
      base_spec.base = base;
      base_spec.layout = parse_layout(layout);
    }
    const int64_t dmax = max_distance > 0 ? max_distance : run ? 4 * run->config.seq_len : 1024;
    const int64_t freq_len = std::max<int64_t>(dmax + 1, base_spec.max_position_embeddings);

    std::vector<experiments::DecayCurve> curves;
    for (const std::string& name : names) {
      experiments::DecayCurve c;
      c.spec = spec_for(name, base_spec);
      c.spec.validate();
      // Short column / legend names; the full specs are printed below.
      c.name = c.spec.scaling == RopeScaling::None ? std::string("none")
                                                   : fmt::format("{} x{:g}", scaling_name(c.spec.scaling), c.spec.factor);
      // Dynamic NTK and longrope depend on the length: take the frequencies for the longest distance shown.
      c.bound = experiments::decay_bound(c.spec.freqs(freq_len), dmax);
      curves.push_back(c);
    }
    std::optional<experiments::MeasuredDecay> measured;
    if (run) {
      if (given("--scaling") || given("--factor") || given("--max-position-embeddings") || given("--original-max")) {
        nn::EncodingOverride o;
        o.rope = curves.front().spec;
        run->model->set_override(o);
      }
      const int len = seq_len > 0 ? seq_len : run->config.seq_len;
      measured = experiments::measure_decay(run->model, *run->task, windows, len, dmax, samples, seed);
    }
    std::string problem;
    const std::vector<std::string> pngs = experiments::write_decay_outputs(out, curves, measured ? &*measured : nullptr, problem);

    for (const auto& c : curves) std::printf("%s: %s\n", c.name.c_str(), c.spec.describe().c_str());
    std::printf("%8s", "distance");
    for (const auto& c : curves) std::printf("  %12s", c.name.c_str());
    std::printf("\n");
    std::vector<int64_t> shown;
    for (int64_t d = 0; d < dmax; d = d == 0 ? 1 : d * 4) shown.push_back(d);
    shown.push_back(dmax);
    for (int64_t d : shown) {
      std::printf("%8lld", static_cast<long long>(d));
      for (const auto& c : curves) std::printf("  %12.4f", c.bound[static_cast<size_t>(d)]);
      std::printf("\n");
    }
    if (measured)
      std::printf("measured on %s: %lld (q, k) samples; mean |q R k| %.4f at 0, %.4f at %lld\n", run->checkpoint.c_str(),
                  static_cast<long long>(measured->samples), measured->abs_score.front(), measured->abs_score.back(),
                  static_cast<long long>(dmax));
    if (!problem.empty()) std::printf("note: %s\n", problem.c_str());
    for (const std::string& p : pngs) std::printf("wrote %s\n", p.c_str());
    std::printf("wrote %s/decay_bound.csv%s\n", out.c_str(), measured ? (" and " + out + "/decay_model.csv").c_str() : "");
  }
};

const CommandRegistrar kRegister([](CLI::App& root) {
  auto cmd = std::make_shared<DecayCommand>();
  CLI::App* sub = root.add_subcommand(
      "decay", "RoFormer's long-term decay: the relative upper bound against distance (CSV + PNG), and measured on a model");
  cmd->app = sub;
  sub->add_option("--hf-config", cmd->hf_config, "the rotation of a Hugging Face config.json")->check(CLI::ExistingPath);
  sub->add_option("--head-dim", cmd->head_dim, "head dimension (default 128, as RoFormer's figure)")->transform(integer_in(2, 4096));
  sub->add_option("--rotary-dim", cmd->rotary_dim, "rotated features (default: all)")->transform(integer_in(0, 4096));
  sub->add_option("--base", cmd->base, "RoPE base (default 10000)")->transform(finite());
  sub->add_option("--layout", cmd->layout, "half_split | interleaved (does not change the bound)");
  sub->add_option("--scaling", cmd->scalings, "scaling, or a comma-separated list to compare (none, linear, ntk, "
                                              "ntk_mixed, dynamic, yarn, llama3)");
  sub->add_option("--factor", cmd->factor, "scaling factor")->transform(finite());
  sub->add_option("--max-position-embeddings", cmd->max_position, "the model's context (dynamic, yarn)")->transform(integer_in(0, int64_t{1} << 53));
  sub->add_option("--original-max", cmd->original_max, "pre-extension context (yarn, llama3)")->transform(integer_in(0, int64_t{1} << 53));
  sub->add_option("--max-distance", cmd->max_distance, "largest distance (default 1024, or 4 x L with --checkpoint)")->transform(integer_in(0, experiments::kMaxDecayDistance));
  sub->add_option("--checkpoint", cmd->checkpoint, "also measure this RoPE model (file or run directory)");
  sub->add_option("--windows", cmd->windows, "held-out windows for the measurement (default 8)")->transform(integer_in(1, 1 << 16));
  sub->add_option("--seq-len", cmd->seq_len, "window length (default: the model's training length)")->transform(integer_in(0, kMaxSequenceLength));
  sub->add_option("--samples", cmd->samples, "sampled (q, k) pairs (default 4096)")->transform(integer_in(1, 1 << 24));
  sub->add_option("--seed", cmd->seed, "seed of the pair sampling")->transform(unsigned_up_to(UINT64_MAX));
  sub->add_option("--threads", cmd->threads, "torch threads (0 = default)")->transform(integer_in(0, kMaxThreads));
  sub->add_option("--out", cmd->out, "output directory (default runs/decay)");
  sub->footer("See docs/decay.md for the formula and what is measured.");
  sub->callback([cmd] { cmd->run(); });
});

}  // namespace
}  // namespace rotary::cli
