// lab/experiments/reproduce/study.h: what the studies of `rotary reproduce` (reproduce.h) share - internal to
// lab/experiments/reproduce.cpp and lab/experiments/reproduce/.
//
// Each study is one file here (study_seed<NNN>*.cpp) defining a StudyRun; reproduce.cpp lists them in the order they
// run. Beside them: the run descriptions per scale (run_specs.cpp), the claims' numbers and verdicts (claims.cpp),
// the child-process cache (child_cache.h), the measured-decay CSV (decay_csv.h) and the report (report_markdown.h).
#pragma once

#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "experiments/compare.h"
#include "experiments/extrapolate.h"
#include "experiments/report.h"
#include "experiments/reproduce.h"

namespace rotary::experiments::reproduce {

// ---- the studies' run descriptions, per scale (run_specs.cpp) ------------------------------------------------

bool is_scale(const std::string& s, std::string_view name);

// A compare study's runs and the scale in words, for the report.
struct StudyCompare {
  CompareSpec spec;
  std::string note;
};
// The compare of a seed000_* / seed002_text / seed002_performer study; rotary::Error for another study name.
StudyCompare compare_study(const ReproduceSpec& r, const std::string& study);

// ---- numbers and verdicts (claims.cpp) -------------------------------------------------------------------------

std::string num(double v, int decimals);  // "n/a" when not finite
std::string pct(double v);                // "12.3%"; "n/a" when not finite

// The stats of encoding `enc`; null when the compare had none.
const EncodingStats* stats_of(const std::vector<EncodingStats>& all, const std::string& enc);

// "rope 0.2469 (0.2457-0.2496)": the drop-worst mean and the spread of every run.
std::string with_spread(const std::vector<double>& runs, double mean, bool percent, int decimals = 3);

// A claim that encoding `better` beats `worse` on one metric of a compare (sampled, greedy, steps or eval_loss).
Claim ordering_claim(const std::string& seed, const std::string& study, const std::string& text,
                     const std::string& theirs, const std::vector<EncodingStats>& stats, const std::string& better,
                     const std::string& worse, const std::string& metric);

std::string verdict_of(bool ok);  // reproduced | not reproduced

// ---- the studies (reproduce.cpp runs them) ---------------------------------------------------------------------

// What every study reads and adds to: the spec, the claims and the report's sections, and seed 004's extrapolation
// (seed 003 measures its text model).
struct Reproduction {
  const ReproduceSpec& spec;
  bool progress;
  ReproduceResult& result;
  std::ostringstream sections;
  ExtrapolateSpec es;
  std::optional<ExtrapolateResult> ex;
  std::string scale_note;  // for the claims whose note does not already say the scale

  // Records that `study` was interrupted (result.run) and returns false, so a study can `return stopped(...)`.
  bool stopped(const std::string& study, const RunOutcome& run);
  // Runs a compare study into `in`; false when it was interrupted.
  bool compare(const std::string& study, StudyCompare& sc, ReportInputs& in);
};

// A study: when `wanted`, runs and adds its claims; otherwise adds them as "not measured" (study not run). Returns
// false when it was interrupted (r.result.run says how).
using StudyRun = bool (*)(Reproduction& r, const std::string& study, bool wanted);

bool seed000_study(Reproduction& r, const std::string& study, bool wanted);            // study_seed000.cpp
bool seed001_study(Reproduction& r, const std::string& study, bool wanted);            // study_seed001.cpp
bool seed002_text_study(Reproduction& r, const std::string& study, bool wanted);       // study_seed002_text.cpp
bool seed002_performer_study(Reproduction& r, const std::string& study, bool wanted);  // study_seed002_performer.cpp
bool seed002_runtime_study(Reproduction& r, const std::string& study, bool wanted);    // study_seed002_runtime.cpp
bool seed003_study(Reproduction& r, const std::string& study, bool wanted);            // study_seed003.cpp
bool seed004_study(Reproduction& r, const std::string& study, bool wanted);            // study_seed004.cpp

}  // namespace rotary::experiments::reproduce
