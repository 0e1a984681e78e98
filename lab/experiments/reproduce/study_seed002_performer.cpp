// lab/experiments/reproduce/study_seed002_performer.cpp
// Seed 002: rotary inside a Performer (a compare).
#include "experiments/reproduce/study.h"

namespace rotary::experiments::reproduce {

bool seed002_performer_study(Reproduction& r, const std::string& study, bool wanted) {
  std::vector<Claim>& claims = r.result.claims;
  std::ostringstream& sections = r.sections;
  const char* performer_claim = "Rotary inside a Performer lowers its validation loss";
  const char* performer_theirs = "\"stark decreases in validation loss\" (enwik8, 8 layers x 512, chart)";
  if (wanted) {
    StudyCompare sc;
    ReportInputs in;
    if (!r.compare(study, sc, in)) return false;
    Claim c = ordering_claim("002", "seed002_performer", performer_claim, performer_theirs, encoding_stats(in), "rope",
                             "none", "eval_loss");
    c.note = sc.note + ", KJV characters";
    claims.push_back(c);
    sections << "### seed002_performer\n\nPerformer (FAVOR+) attention; encodings `none` (no position information "
                "but the causal prefix sums) and `rope` (rotary on q and k before the feature map). "
             << sc.note << "; [report](seed002_performer/report.md)\n\n" << results_table(in) << "\n";
  } else {
    claims.push_back({"002", "seed002_performer", performer_claim, performer_theirs, "", "not measured", "study not run"});
  }
  return true;
}

}  // namespace rotary::experiments::reproduce
