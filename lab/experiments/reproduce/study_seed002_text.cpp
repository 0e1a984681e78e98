// lab/experiments/reproduce/study_seed002_text.cpp
// Seed 002: rotary against learned, T5, sinusoidal, ALiBi (and RoPER) on text (a compare).
#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "experiments/reproduce/study.h"

namespace rotary::experiments::reproduce {

bool seed002_text_study(Reproduction& r, const std::string& study, bool wanted) {
  std::vector<Claim>& claims = r.result.claims;
  std::ostringstream& sections = r.sections;
  const char* owt2 = "OWT2 2.759 vs learned 2.809, T5 2.801 (125M, 55k steps); Pile 2.173 vs 2.240, 2.223 (1.4B)";
  if (wanted) {
    StudyCompare sc;
    ReportInputs in;
    if (!r.compare(study, sc, in)) return false;
    const std::vector<EncodingStats> st = encoding_stats(in);
    const std::string& note = sc.note;
    auto add = [&](Claim c) {
      c.note = note;
      claims.push_back(c);
    };
    add(ordering_claim("002", "seed002_text", "Rotary ends with a lower validation loss than learned absolute positions",
                       owt2, st, "rope", "learned", "eval_loss"));
    add(ordering_claim("002", "seed002_text", "Rotary ends with a lower validation loss than T5's relative bias", owt2,
                       st, "rope", "t5", "eval_loss"));
    add(ordering_claim("002", "seed002_text", "T5's relative bias ends below learned absolute positions",
                       "OWT2 2.801 vs 2.809; Pile 2.223 vs 2.240", st, "t5", "learned", "eval_loss"));
    const double target = resolved_target_loss(in);
    Claim conv = ordering_claim(
        "002", "seed002_text",
        fmt::format("Rotary reaches a given validation loss ({}) in fewer steps than learned absolute positions",
                    num(target, 3)),
        "~30% faster convergence than learned absolute (Pile, 1.4B)", st, "rope", "learned", "steps");
    const EncodingStats *rope = stats_of(st, "rope"), *learned = stats_of(st, "learned"), *t5 = stats_of(st, "t5");
    if (rope && learned && std::isfinite(rope->steps_to_target) && std::isfinite(learned->steps_to_target))
      conv.ours += fmt::format("; learned / rotary = {:.2f}", learned->steps_to_target / rope->steps_to_target);
    add(conv);
    Claim conv_t5 = ordering_claim("002", "seed002_text",
                                   "Rotary reaches that loss in fewer steps than T5's relative bias",
                                   "10-20% faster than T5 RPE (Pile, 1.4B)", st, "rope", "t5", "steps");
    if (rope && t5 && std::isfinite(rope->steps_to_target) && std::isfinite(t5->steps_to_target))
      conv_t5.ours += fmt::format("; T5 / rotary = {:.2f}", t5->steps_to_target / rope->steps_to_target);
    add(conv_t5);
    // Seed 000's language-model claim: RoPER does not hurt language modelling against RoPE.
    Claim lm{"000", "seed002_text", "RoPER does not degrade language modelling against RoPE",
             "similar training and validation losses (200M model, English Wikipedia)", "", "not measured", note};
    const EncodingStats* roper = stats_of(st, "roper");
    if (rope && roper && std::isfinite(rope->eval_loss) && std::isfinite(roper->eval_loss)) {
      lm.ours = fmt::format("roper {} vs rope {}", with_spread(roper->run_eval_loss, roper->eval_loss, false),
                            with_spread(rope->run_eval_loss, rope->eval_loss, false));
      // "Not worse" up to the seeds' spread: RoPER's mean at most the larger of the two encodings' run ranges above.
      double spread = 0;
      for (const EncodingStats* s : {rope, roper})
        if (std::isfinite(s->eval_loss_max) && std::isfinite(s->eval_loss_min))
          spread = std::max(spread, s->eval_loss_max - s->eval_loss_min);
      lm.verdict = verdict_of(roper->eval_loss <= rope->eval_loss + spread);
    }
    claims.push_back(lm);
    sections << "### seed002_text\n\n" << sc.note << "; [report](seed002_text/report.md)\n\n" << results_table(in)
             << "\n";
  } else {
    claims.push_back({"002", "seed002_text", "Rotary ends with a lower validation loss than learned absolute and T5",
                      owt2, "", "not measured", "study not run"});
  }
  return true;
}

}  // namespace rotary::experiments::reproduce
