// lab/experiments/reproduce/claims.cpp: the numbers of `rotary reproduce`'s claims and their verdicts.
#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "experiments/reproduce/study.h"

namespace rotary::experiments {

namespace reproduce {

std::string num(double v, int decimals) { return std::isfinite(v) ? fmt::format("{:.{}f}", v, decimals) : "n/a"; }
std::string pct(double v) { return std::isfinite(v) ? fmt::format("{:.1f}%", 100 * v) : "n/a"; }

const EncodingStats* stats_of(const std::vector<EncodingStats>& all, const std::string& enc) {
  for (const EncodingStats& s : all)
    if (s.encoding == enc) return &s;
  return nullptr;
}

std::string with_spread(const std::vector<double>& runs, double mean, bool percent, int decimals) {
  double lo = INFINITY, hi = -INFINITY;
  for (double v : runs)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  auto f = [&](double v) { return percent ? pct(v) : num(v, decimals); };
  if (!std::isfinite(lo)) return f(mean);
  return runs.size() > 1 ? fmt::format("{} ({}-{})", f(mean), f(lo), f(hi)) : f(mean);
}

Claim ordering_claim(const std::string& seed, const std::string& study, const std::string& text,
                     const std::string& theirs, const std::vector<EncodingStats>& stats, const std::string& better,
                     const std::string& worse, const std::string& metric) {
  Claim c{seed, study, text, theirs, "", "not measured", ""};
  const EncodingStats* a = stats_of(stats, better);
  const EncodingStats* b = stats_of(stats, worse);
  if (!a || !b) return c;
  const bool percent = metric == "sampled" || metric == "greedy";
  const bool higher = percent;
  auto runs = [&](const EncodingStats* s) -> const std::vector<double>& {
    if (metric == "sampled") return s->run_sampled;
    if (metric == "greedy") return s->run_greedy;
    if (metric == "steps") return s->run_steps_to_target;
    return s->run_eval_loss;
  };
  auto mean = [&](const EncodingStats* s) {
    if (metric == "sampled") return s->accuracy_sampled;
    if (metric == "greedy") return s->accuracy_greedy;
    if (metric == "steps") return s->steps_to_target;
    return s->eval_loss;
  };
  const int decimals = metric == "steps" ? 0 : 3;
  c.ours = fmt::format("{} {} vs {} {}", better, with_spread(runs(a), mean(a), percent, decimals), worse,
                       with_spread(runs(b), mean(b), percent, decimals));
  c.verdict = ordering_verdict(runs(a), runs(b), higher);
  // The drop-worst means decide "within noise"; ordering_verdict looks at every run's values, so for a claim on
  // the means (the seeds report means) take the means' order when the spreads overlap.
  if (c.verdict == "same ordering, within noise" || c.verdict == "not reproduced") {
    const double ma = mean(a), mb = mean(b);
    if (std::isfinite(ma) && std::isfinite(mb))
      c.verdict = (higher ? ma > mb : ma < mb) ? "same ordering, within noise" : "not reproduced";
  }
  return c;
}

std::string verdict_of(bool ok) { return ok ? "reproduced" : "not reproduced"; }

}  // namespace reproduce

std::string ordering_verdict(const std::vector<double>& expected_better, const std::vector<double>& other,
                             bool higher_is_better) {
  auto finite = [](const std::vector<double>& v) {
    std::vector<double> f;
    for (double x : v)
      if (std::isfinite(x)) f.push_back(x);
    return f;
  };
  const std::vector<double> a = finite(expected_better), b = finite(other);
  if (a.empty() || b.empty()) return "not measured";
  const double a_worst = higher_is_better ? *std::min_element(a.begin(), a.end()) : *std::max_element(a.begin(), a.end());
  const double b_best = higher_is_better ? *std::max_element(b.begin(), b.end()) : *std::min_element(b.begin(), b.end());
  if (higher_is_better ? a_worst > b_best : a_worst < b_best) return "reproduced";
  const double ma = drop_worst_mean(a, higher_is_better), mb = drop_worst_mean(b, higher_is_better);
  if (higher_is_better ? ma > mb : ma < mb) return "same ordering, within noise";
  return "not reproduced";
}

}  // namespace rotary::experiments
