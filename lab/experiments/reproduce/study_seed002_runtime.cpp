// lab/experiments/reproduce/study_seed002_runtime.cpp
// Seed 002: what rotary costs (two benchmarks, as child processes).
#include <cmath>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "experiments/reproduce/child_cache.h"
#include "experiments/reproduce/study.h"

namespace rotary::experiments::reproduce {

using nlohmann::json;

bool seed002_runtime_study(Reproduction& r, const std::string& study, bool wanted) {
  std::vector<Claim>& claims = r.result.claims;
  std::ostringstream& sections = r.sections;
  const ReproduceSpec& spec = r.spec;
  {
    const std::string dir = lab::join_path(spec.out_dir, "seed002_runtime");
    Claim naive{"002", "seed002_runtime", "Rotary applied naively costs several times an additive position embedding",
                "4-5x (5.3 ms vs 2.1 ms for q, k of [2048, 16, 12, 64], PyTorch on a GPU)", "", "not measured", ""};
    Claim fused{"002", "seed002_runtime", "Fused, rotary costs at most 2-2.5x an additive embedding",
                "2-2.5x with TorchScript fusion", "", "not measured", ""};
    Claim model{"002", "seed002_runtime", "In a whole model, rotary costs 1-3% of training time over learned positions",
                "1-3% across model sizes, fused", "", "not measured", ""};
    if (wanted) {
      lab::make_dirs(dir);
      const bool smoke = is_scale(spec.scale, "smoke");
      std::vector<std::string> cost{"bench", "rope-cost", "--json", "--threads", "1"};
      if (smoke) cost.insert(cost.end(), {"--seq", "64", "--batch", "2", "--trials", "3", "--min-trial-ms", "2"});
      else cost.insert(cost.end(), {"--trials", "9"});
      std::string problem;
      const json j = cached_child_json(spec, dir, "rope_cost", cost, problem, r.progress);
      if (!j.is_null()) {
        const double ours = j.value("rope_apply_over_additive", std::nan(""));
        fused.ours = fmt::format("ours {:.2f}x (rope_apply / in-place add, 1 thread, CPU)", ours);
        fused.verdict = verdict_of(ours <= 2.5);
        if (j.contains("torch_rotary_over_torch_additive")) {
          const double t = j["torch_rotary_over_torch_additive"].get<double>();
          naive.ours = fmt::format("{:.2f}x (PyTorch composition / PyTorch add, 1 thread, CPU)", t);
          naive.verdict = verdict_of(t >= 2);
        } else {
          naive.note = "this build has no torch";
        }
        fused.note = naive.note = smoke ? "smoke scale: [64, 2, 12, 64]" : "the seed's shape";
      } else {
        naive.note = fused.note = problem;
      }
      std::vector<std::string> train{"bench", "train", "--json", "--encoding", "rope", "--against", "learned"};
      if (smoke) train.insert(train.end(), {"--seq-len", "32", "--d-model", "32", "--n-layers", "1", "--n-heads", "2",
                                            "--trials", "1", "--steps", "1", "--warmup", "1"});
      else train.insert(train.end(), {"--trials", "7", "--steps", "3"});
      problem.clear();
      const json t = cached_child_json(spec, dir, "train_overhead", train, problem, r.progress);
      if (!t.is_null() && t.contains("overhead_percent_vs_against")) {
        const double o = t["overhead_percent_vs_against"].get<double>();
        model.ours = fmt::format("{:+.1f}% (d_model {}, {} layers, seq {}; median of {} trials)", o,
                                 t.value("d_model", 0), t.value("n_layers", 0), t.value("seq_len", 0),
                                 t.value("trials", 0));
        model.verdict = verdict_of(o <= 3.0);
        model.note = "one run on a shared machine: a few percent is within its noise";
      } else {
        model.note = problem;
      }
      sections << "### seed002_runtime\n\nOutputs: `seed002_runtime/rope_cost.json` (`rotary " << [&] {
        std::string l;
        for (size_t i = 0; i < cost.size(); ++i) l += (i ? " " : "") + cost[i];
        return l;
      }() << "`), `seed002_runtime/train_overhead.json`.\n\n";
    } else {
      naive.note = fused.note = model.note = "study not run";
    }
    claims.push_back(naive);
    claims.push_back(fused);
    claims.push_back(model);
  }
  return true;
}

}  // namespace rotary::experiments::reproduce
