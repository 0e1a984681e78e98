// lab/experiments/reproduce/study_seed000.cpp
// Seed 000: RoPER against RoPE on one of its three tasks (a compare).
#include <sstream>

#include "experiments/reproduce/study.h"

namespace rotary::experiments::reproduce {

bool seed000_study(Reproduction& r, const std::string& study, bool wanted) {
  std::vector<Claim>& claims = r.result.claims;
  std::ostringstream& sections = r.sections;
  struct Seed000 {
    const char* study;
    const char* claim;
    const char* theirs;
    const char* metric;
  };
  const Seed000 seed000[] = {
      {"seed000_addition", "RoPER solves more step-by-step additions than RoPE (exact match, sampled)",
       "RoPER above RoPE (the seed's chart; no number in its text)", "sampled"},
      {"seed000_substring_index", "RoPER solves more substring-by-index problems than RoPE (exact match, sampled)",
       "RoPER 96.11 vs RoPE 62.00 of 128 (75.1% vs 48.4%; the seed's chart as issue 12 reads it)", "sampled"},
      {"seed000_substring_search", "RoPER ends substring-by-search with a lower loss than RoPE",
       "RoPER's loss curves below RoPE's (the seed's chart)", "eval_loss"},
  };
  for (const Seed000& s : seed000) {
    if (study != s.study) continue;
    if (!wanted) {
      claims.push_back({"000", s.study, s.claim, s.theirs, "", "not measured", "study not run"});
      return true;
    }
    StudyCompare sc;
    ReportInputs in;
    if (!r.compare(s.study, sc, in)) return false;
    const std::vector<EncodingStats> st = encoding_stats(in);
    Claim c = ordering_claim("000", s.study, s.claim, s.theirs, st, "roper", "rope", s.metric);
    c.note = sc.note;
    claims.push_back(c);
    sections << "### " << s.study << "\n\n" << sc.note << "; [report](" << s.study << "/report.md)\n\n"
             << results_table(in) << "\n";
  }
  return true;
}

}  // namespace rotary::experiments::reproduce
