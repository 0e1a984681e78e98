// rotary reproduce: every seed table the lab supports, rerun at one scale, and one report of the seeds' claims
// beside our numbers (lab/experiments/reproduce.h).
#include <cstdio>
#include <set>
#include <string>
#include <string_view>

#include "cli/run_outcome.h"
#include "cli/command.h"
#include "common/exit_status.h"
#include "cli/torch/train_flags.h"
#include "experiments/reproduce.h"

namespace rotary::cli {
namespace {

struct ReproduceCommand {
  std::string scale = "default", studies, out = "runs/reproduce", cache_dir;
  int jobs = 0;
  bool no_progress = false;
  CLI::Option* studies_option = nullptr;

  void run() {
    experiments::ReproduceSpec spec;
    spec.scale = scale;
    // Given means given: --studies "" is an empty list, refused as every empty list is, not "all studies".
    if (studies_option->count()) spec.studies = parse_name_list(studies, "--studies");
    spec.out_dir = out;
    spec.cache_dir = cache_dir;
    spec.jobs = jobs;
    spec.rotary_program = "/proc/self/exe";
    spec.command_line = quoted_command_line();
    const experiments::ReproduceResult r = experiments::run_reproduce(spec, !no_progress);
    exit_if_interrupted(r.run, "reproduce");
    std::printf("%-4s %-28s %-32s %s\n", "seed", "study", "verdict", "claim");
    for (const experiments::Claim& c : r.claims)
      std::printf("%-4s %-28s %-32s %s\n", c.seed.c_str(), c.study.c_str(), c.verdict.c_str(), c.claim.c_str());
    std::printf("report: %s\nclaims: %s\n", r.report_md.c_str(), r.claims_json.c_str());
  }
};

// The studies and the seeds they come from, from the one list of studies: "seed000_addition, ..." and
// "000, 001, ...".
std::string study_names() {
  std::string names;
  for (std::string_view s : experiments::kReproduceStudies) names += (names.empty() ? "" : ", ") + std::string(s);
  return names;
}
std::string seed_numbers() {
  std::set<std::string> seeds;
  for (std::string_view s : experiments::kReproduceStudies) seeds.insert(std::string(s.substr(4, 3)));  // seedNNN_
  std::string numbers;
  for (const std::string& n : seeds) numbers += (numbers.empty() ? "" : ", ") + n;
  return numbers;
}

const CommandRegistrar kRegister([](CLI::App& root) {
  auto cmd = std::make_shared<ReproduceCommand>();
  CLI::App* sub = root.add_subcommand(
      "reproduce",
      "rerun every seed table (seeds " + seed_numbers() + ") at one scale and report each claim beside ours");
  sub->add_option("--scale", cmd->scale,
                  "smoke (a minute or two: the machinery, not the claims), default (about an hour on 2 cores) or "
                  "seed (the seeds' model sizes and steps: for a GPU-class machine)");
  cmd->studies_option = sub->add_option("--studies", cmd->studies,
                  "comma-separated subset: " + study_names() + " (default: all)");
  sub->add_option("--out", cmd->out, "output directory (default runs/reproduce)");
  sub->add_option("--cache-dir", cmd->cache_dir, "the text task's corpus and tokenizer cache");
  sub->add_option("--jobs", cmd->jobs, "training runs at once (default: cores / threads per run)")
      ->transform(integer_in(0, 256));
  sub->add_flag("--no-progress", cmd->no_progress, "no progress on stderr");
  sub->footer(
      "Writes <out>/report.md (every claim: the seed's number, ours, the verdict) and <out>/claims.json; each study "
      "in <out>/<study>/. Rerunning the same command skips what finished and resumes what was interrupted. "
      "docs/reproduce.md holds the default run's report.");
  sub->callback([cmd] { cmd->run(); });
});

}  // namespace
}  // namespace rotary::cli
