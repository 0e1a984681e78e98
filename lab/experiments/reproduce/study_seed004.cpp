// lab/experiments/reproduce/study_seed004.cpp
// Seed 004: the length-extrapolation table, window sweep and Leaky ReRoPE (an extrapolate).
#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <map>

#include "experiments/reproduce/study.h"

namespace rotary::experiments::reproduce {

namespace {

struct ExtrapolateView {
  const ExtrapolateResult* r = nullptr;
  int L = 0;
  // Accuracy of a main-table (or sweep) cell; NaN when absent.
  double acc(const std::string& metric, const std::string& method, bool logn, int test_len, int64_t window = -1,
             bool sweep = false) const {
    for (const Cell& c : r->cells)
      if (c.metric == metric && c.method.name == method && c.method.logn == logn && c.test_len == test_len &&
          c.sweep == sweep && (window < 0 || c.method.window == window))
        return c.accuracy;
    return std::nan("");
  }
  double loss(const std::string& method, int test_len) const {
    for (const Cell& c : r->cells)
      if (c.metric == "text" && c.method.name == method && !c.method.logn && c.test_len == test_len && !c.sweep)
        return c.loss;
    return std::nan("");
  }
};

}  // namespace

bool seed004_study(Reproduction& r, const std::string& study, bool wanted) {
  std::vector<Claim>& claims = r.result.claims;
  std::ostringstream& sections = r.sections;
  const ReproduceSpec& spec = r.spec;
  std::optional<ExtrapolateResult>& ex = r.ex;
  ExtrapolateSpec& es = r.es;
  if (wanted) {
    es.command_line = spec.command_line;
    if (r.progress) std::fprintf(stderr, "reproduce: seed004_extrapolate\n");
    ex = run_extrapolate(es, r.progress);
    if (ex->run.interrupted()) return r.stopped(study, ex->run);
  }
  {
    const int L = es.text.seq_len;
    const int far = L * es.multiples.back();
    const int64_t w = es.window > 0 ? es.window : L / 2;
    ExtrapolateView v{ex ? &*ex : nullptr, L};
    const std::string note = fmt::format("one text model, L = {}, tested at {} = {}L{}", L, far, es.multiples.back(),
                                         r.scale_note);
    auto claim = [&](const std::string& text, const std::string& theirs) {
      return Claim{"004", "seed004_extrapolate", text, theirs, "", "not measured", ex ? note : "study not run"};
    };
    Claim same = claim("At the training length every method scores the same",
                       "49.41% for every method at 512 (49.40% with log n)");
    Claim keeps = claim("ReRoPE keeps its accuracy far past the training length; plain RoPE does not",
                        "ReRoPE-w256 48.48% at 8L vs 49.41% at L; Baseline 23.16% at 8L");
    Claim ntk = claim("ReRoPE beats NTK-aware scaling far past the training length",
                      "48.48% vs NTK-fixed 39.61%, NTK-mixed 40.12% at 8L");
    Claim pi = claim("Position interpolation without fine-tuning falls below plain RoPE far past L",
                     "PI 13.54% vs Baseline 23.16% at 8L");
    Claim logn = claim("log-n scaling at test time helps ReRoPE", "ReRoPE-w256 48.48% -> 48.85% (log n\u2020) at 8L");
    Claim sweep = claim("ReRoPE's best window is L/4 to L/2; w = L collapses",
                        "best w128-w256 of L = 512 (48.87-49.07%); w512: 8.25% at 8L");
    Claim leaky = claim("Leaky ReRoPE (k = 16) is about as good as ReRoPE", "49.10% vs 48.87% (w128, log n)");
    Claim longer = claim("With ReRoPE a longer context gives a lower loss",
                         "Llama-2-13B: 1.4996 at 4k, 1.4267 at 8k, 1.4001 at 16k");
    if (ex) {
      const std::vector<std::string> methods{"rope", "pi", "ntk", "ntk_mixed", "yarn", "rerope", "leaky_rerope"};
      double lo = INFINITY, hi = -INFINITY;
      for (const std::string& m : methods) {
        const double a = v.acc("text", m, false, L);
        if (std::isfinite(a)) lo = std::min(lo, a), hi = std::max(hi, a);
      }
      if (std::isfinite(lo)) {
        same.ours = fmt::format("{} - {} over {} methods at L", pct(lo), pct(hi), methods.size());
        same.verdict = hi - lo <= 0.01 ? "reproduced" : "not reproduced";
      }
      const double rope_L = v.acc("text", "rope", false, L), rope_far = v.acc("text", "rope", false, far);
      const double re_far = v.acc("text", "rerope", false, far), re_L = v.acc("text", "rerope", false, L);
      if (std::isfinite(re_far) && std::isfinite(rope_far)) {
        keeps.ours = fmt::format("ReRoPE-w{} {} at {}L vs {} at L; RoPE {} at {}L", w, pct(re_far),
                                 es.multiples.back(), pct(re_L), pct(rope_far), es.multiples.back());
        keeps.verdict = verdict_of(re_far >= rope_L - 0.03 && rope_far < re_far);
      }
      const double ntk_far = v.acc("text", "ntk", false, far), mixed_far = v.acc("text", "ntk_mixed", false, far);
      if (std::isfinite(re_far) && std::isfinite(ntk_far) && std::isfinite(mixed_far)) {
        ntk.ours = fmt::format("ReRoPE {} vs NTK {}, NTK-mixed {}", pct(re_far), pct(ntk_far), pct(mixed_far));
        ntk.verdict = verdict_of(re_far > ntk_far && re_far > mixed_far);
      }
      const double pi_far = v.acc("text", "pi", false, far);
      if (std::isfinite(pi_far) && std::isfinite(rope_far)) {
        pi.ours = fmt::format("PI {} vs RoPE {}", pct(pi_far), pct(rope_far));
        pi.verdict = verdict_of(pi_far < rope_far);
      }
      const double re_logn = v.acc("text", "rerope", true, far);
      if (std::isfinite(re_logn) && std::isfinite(re_far)) {
        logn.ours = fmt::format("ReRoPE {} -> {} (log n\u2020)", pct(re_far), pct(re_logn));
        logn.verdict = verdict_of(re_logn > re_far);
      }
      std::map<int64_t, double> by_window;
      for (const Cell& c : ex->cells)
        if (c.sweep && c.metric == "text" && c.test_len == far && c.method.name == "rerope" && !c.method.logn)
          by_window[c.method.window] = c.accuracy;
      if (by_window.size() >= 3 && by_window.count(L)) {
        int64_t best = by_window.begin()->first;
        std::string list;
        for (const auto& [win, a] : by_window) {
          if (a > by_window[best]) best = win;
          list += fmt::format("{}w{} {}", list.empty() ? "" : ", ", win, pct(a));
        }
        double worst = INFINITY;
        for (const auto& [win, a] : by_window) worst = std::min(worst, a);
        sweep.ours = fmt::format("{} (best w{})", list, best);
        sweep.verdict = verdict_of(best >= L / 4 && best <= L / 2 && by_window[L] <= worst + 1e-12);
      }
      const double leaky_far = v.acc("text", "leaky_rerope", false, far);
      if (std::isfinite(leaky_far) && std::isfinite(re_far)) {
        leaky.ours = fmt::format("Leaky-w{}-k{:g} {} vs ReRoPE-w{} {}", w, es.leaky_k, pct(leaky_far), w, pct(re_far));
        leaky.verdict = verdict_of(std::abs(leaky_far - re_far) <= 0.01);
      }
      std::string losses;
      bool falling = true;
      double prev = INFINITY;
      for (int m : es.multiples) {
        const double l = v.loss("rerope", L * m);
        losses += fmt::format("{}{}: {}", losses.empty() ? "" : ", ", L * m, num(l, 4));
        falling = falling && std::isfinite(l) && l <= prev + 1e-9;
        prev = l;
      }
      longer.ours = "ReRoPE loss on the last L tokens at " + losses;
      longer.verdict = verdict_of(falling);
      sections << "### seed004_extrapolate\n\n" << note << "; [report](seed004_extrapolate/report.md)\n\n";
    }
    for (Claim* c : {&same, &keeps, &ntk, &pi, &logn, &sweep, &leaky, &longer}) claims.push_back(*c);
  }
  return true;
}

}  // namespace rotary::experiments::reproduce
