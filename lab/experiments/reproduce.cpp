// lab/experiments/reproduce.cpp: `rotary reproduce` - the checks, the studies in their order and the report. Each
// study is a file of lab/experiments/reproduce/ (study.h says what lives where).
#include "experiments/reproduce.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "common/files.h"
#include "common/lists.h"
#include "experiments/reproduce/report_markdown.h"
#include "experiments/reproduce/study.h"
#include "rotary/error.h"

namespace rotary::experiments {

using namespace train;  // the training engine these experiments run on

void validate(const ReproduceSpec& spec) {
  check(std::find(std::begin(kReproduceScales), std::end(kReproduceScales), spec.scale) != std::end(kReproduceScales),
        "scale", spec.scale, "smoke, default or seed");
  std::string all;
  for (std::string_view s : kReproduceStudies) all += (all.empty() ? "" : ", ") + std::string(s);
  for (const std::string& s : spec.studies)
    check(std::find(std::begin(kReproduceStudies), std::end(kReproduceStudies), s) != std::end(kReproduceStudies),
          "studies", s, all);
  lab::check_unique(spec.studies, "studies");
  check(spec.jobs >= 0 && spec.jobs <= 256, "jobs", spec.jobs, "an integer in [0, 256] (0: one per core)");
}

namespace reproduce {

bool Reproduction::stopped(const std::string& study, const RunOutcome& run) {
  result.run = RunOutcome::interrupted_by(
      run.signal, study + ": " + run.message + "; rerun the same `rotary reproduce` to continue");
  return false;
}

bool Reproduction::compare(const std::string& study, StudyCompare& sc, ReportInputs& in) {
  sc = compare_study(spec, study);
  if (progress) std::fprintf(stderr, "reproduce: %s (%s)\n", study.c_str(), sc.note.c_str());
  CompareResult c = run_compare(sc.spec, progress);
  if (c.run.interrupted()) return stopped(study, c.run);
  in = ReportInputs{sc.spec.out_dir, sc.spec.base.task, sc.spec.encodings, c.runs, sc.spec.base, "", {}};
  return true;
}

namespace {

struct StudyEntry {
  std::string_view name;
  StudyRun run;
};
// Every study, in the order they run and their claims are listed (seed 003 after seed 004: it reads its model). A
// list rather than studies registering themselves from their files: the order matters, and the linker leaves out
// of a program a file of the rotary_experiments archive that nothing refers to, so a self-registered study would
// vanish without a word (the static_assert below cannot miss one).
constexpr StudyEntry kStudyTable[] = {
    {"seed000_addition", seed000_study},
    {"seed000_substring_index", seed000_study},
    {"seed000_substring_search", seed000_study},
    {"seed001_memory", seed001_study},
    {"seed002_text", seed002_text_study},
    {"seed002_performer", seed002_performer_study},
    {"seed002_runtime", seed002_runtime_study},
    {"seed004_extrapolate", seed004_study},
    {"seed003_decay", seed003_study},
};
constexpr bool same_studies() {
  if (std::size(kStudyTable) != std::size(kReproduceStudies)) return false;
  for (size_t i = 0; i < std::size(kStudyTable); ++i)
    if (kStudyTable[i].name != kReproduceStudies[i]) return false;
  return true;
}

}  // namespace

}  // namespace reproduce

using reproduce::is_scale;

ReproduceResult run_reproduce(const ReproduceSpec& spec, bool progress) {
  validate(spec);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> studies = spec.studies;
  if (studies.empty())
    for (std::string_view s : kReproduceStudies) studies.emplace_back(s);
  auto wanted = [&](const std::string& s) { return std::find(studies.begin(), studies.end(), s) != studies.end(); };
  // Every run description is checked before the first run starts.
  for (const std::string& s : studies) {
    if (s.rfind("seed000_", 0) == 0 || s == "seed002_text" || s == "seed002_performer") {
      const CompareSpec c = reproduce::compare_study(spec, s).spec;
      for (const std::string& enc : c.encodings) {
        TrainConfig t = c.base;
        t.model.encoding.kind = nn::parse_encoding_kind(enc, "encodings");
        t.validate();
      }
    }
    if (s == "seed004_extrapolate") validate(reproduce_extrapolate_spec(spec));
    if (s == "seed001_memory") validate(reproduce_memory_spec(spec));
  }
  // Held while the studies run (created here, once everything is checked): a second reproduce on this --out is
  // refused naming this one.
  const lab::DirectoryLock lock(spec.out_dir, "--out");

  ReproduceResult result;
  reproduce::Reproduction r{spec, progress, result, {}, reproduce_extrapolate_spec(spec), std::nullopt,
                            is_scale(spec.scale, "smoke") ? " (smoke scale: not evidence)" : ""};
  for (const reproduce::StudyEntry& s : reproduce::kStudyTable)
    if (!s.run(r, std::string(s.name), wanted(std::string(s.name)))) return result;

  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  reproduce::write_report(spec, r.sections.str(), result);
  return result;
}

}  // namespace rotary::experiments
