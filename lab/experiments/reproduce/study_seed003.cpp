// lab/experiments/reproduce/study_seed003.cpp
// Seed 003: the decay bound, and measured on seed 004's text model (`rotary decay`).
#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <map>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "experiments/decay.h"
#include "experiments/reproduce/child_cache.h"
#include "experiments/reproduce/decay_csv.h"
#include "experiments/reproduce/study.h"

namespace rotary::experiments::reproduce {

using nlohmann::json;

namespace {

double block_mean(const std::vector<double>& v, size_t lo, size_t hi) {
  double s = 0;
  size_t n = 0;
  for (size_t i = lo; i < hi && i < v.size(); ++i) s += v[i], ++n;
  return n ? s / double(n) : std::nan("");
}

}  // namespace

bool seed003_study(Reproduction& r, const std::string&, bool wanted) {
  std::vector<Claim>& claims = r.result.claims;
  std::ostringstream& sections = r.sections;
  const ReproduceSpec& spec = r.spec;
  const ExtrapolateSpec& es = r.es;
  {
    Claim bound{"003", "seed003_decay", "The relative upper bound of RoPE's score decays as the distance grows",
                "RoFormer's figure 2 (d = 128, base 10000): decaying with oscillations", "", "not measured", ""};
    Claim measured{"003", "seed003_decay", "On a trained RoPE model the score's magnitude falls with distance",
                   "(not measured in the seed; the bound is its argument)", "", "not measured", ""};
    if (wanted) {
      RopeSpec rs;
      rs.head_dim = 128;
      const std::vector<double> b = decay_bound(rs.freqs(), 4096);
      const double near = block_mean(b, 1, 16), mid = block_mean(b, 16, 256), farb = block_mean(b, 256, 4097);
      bound.ours = fmt::format("mean bound at distances 1-15: {:.2f}, 16-255: {:.2f}, 256-4096: {:.2f} (B(0) = {:.2f})",
                               near, mid, farb, b[0]);
      bound.verdict = verdict_of(near > mid && mid > farb);
      bound.note = "computed exactly (float64), d = 128, base 10000";
      const std::string dir = lab::join_path(spec.out_dir, "seed003_decay");
      const std::string model_dir = lab::join_path(es.out_dir, "text_model");
      if (lab::file_exists(lab::join_path(model_dir, "checkpoint.pt"))) {
        std::string problem;
        std::vector<std::string> args{"decay", "--checkpoint", model_dir, "--out", dir, "--windows",
                                      is_scale(spec.scale, "smoke") ? "2" : "16", "--threads", "0"};
        if (is_scale(spec.scale, "smoke")) args.insert(args.end(), {"--samples", "64"});
        const json j = cached_child_json(spec, dir, "decay_measured", args, problem, r.progress);
        const std::string csv = lab::join_path(dir, "decay_model.csv");
        if (!j.is_null() && lab::file_exists(csv)) {
          const std::map<int64_t, double> rel = read_measured_decay(csv);
          std::vector<double> series;
          for (const auto& [d, val] : rel) series.push_back(val);
          const size_t n = series.size(), L = size_t(es.text.seq_len);
          const double first = block_mean(series, 1, std::min<size_t>(16, n)),
                       last = block_mean(series, std::min(L, n), n);
          measured.ours = fmt::format("mean abs(q R(d) k), relative to d = 0: {:.3f} at d 1-15, {:.3f} at d >= L = {}", first,
                                      last, L);
          measured.verdict = verdict_of(first > last);
          measured.note = "seed004_extrapolate's RoPE text model" + r.scale_note;
        } else {
          measured.note = problem;
        }
      } else {
        measured.note = "needs seed004_extrapolate's text model";
      }
      sections << "### seed003_decay\n\n`rotary decay --checkpoint " << model_dir << " --out " << dir
               << "` (bound and measured curves: [decay_model.png](seed003_decay/decay_model.png))\n\n";
    } else {
      bound.note = measured.note = "study not run";
    }
    claims.push_back(bound);
    claims.push_back(measured);
  }
  return true;
}

}  // namespace rotary::experiments::reproduce
