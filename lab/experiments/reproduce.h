// lab/experiments/reproduce.h: `rotary reproduce` - every seed table the lab supports, rerun at one scale, and one
// report that puts each claim of the seeds beside our number and says whether it is reproduced.
//
// Studies (each in <out>/<study>/, each resumable: the compares and the extrapolation skip finished runs and
// continue interrupted ones, a benchmark's output is kept and reused while its command is the same):
//   seed000_addition, seed000_substring_index, seed000_substring_search   RoPE vs RoPER (compare)
//   seed001_memory      a ReRoPE passkey model read far past its training length through the retrieval memory,
//                       under each position policy (`rotary memory`: the seed's problem and its two questions)
//   seed002_text        learned, T5 bias, RoPE, sinusoidal, ALiBi, RoPER on KJV text, BPE (compare)
//   seed002_performer   Performer without and with rotary on KJV characters (compare)
//   seed002_runtime     `rotary bench rope-cost` and `rotary bench train --against learned` (child processes)
//   seed004_extrapolate the length-extrapolation table, window sweep and Leaky ReRoPE (extrapolate)
//   seed003_decay       RoFormer's decay bound, and measured on seed004's RoPE text model (`rotary decay`)
// Scales: smoke (CI: tiny models, a minute or two), default (about an hour on 2 cores), seed (the seeds' own
// model sizes and steps, for a GPU-class machine; days on 2 cores).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "experiments/compare.h"
#include "experiments/extrapolate.h"
#include "experiments/memory_experiment.h"

namespace rotary::experiments {

inline constexpr std::string_view kReproduceStudies[] = {
    "seed000_addition", "seed000_substring_index", "seed000_substring_search", "seed001_memory",
    "seed002_text",     "seed002_performer",       "seed002_runtime",          "seed004_extrapolate",
    "seed003_decay"};
inline constexpr std::string_view kReproduceScales[] = {"smoke", "default", "seed"};

struct ReproduceSpec {
  std::string scale = "default";     // one of kReproduceScales
  std::vector<std::string> studies;  // subset of kReproduceStudies, run in that list's order; empty: all
  std::string out_dir = "runs/reproduce";
  std::string rotary_program;        // the `rotary` executable for side-by-side training runs, benchmarks and
                                     // decay (the CLI gives /proc/self/exe); empty: the benchmarks and the
                                     // measured decay are "not measured", runs go one after the other
  int jobs = 0;                      // compare's --jobs (0: cores / threads per run)
  std::string cache_dir;             // the text task's cache ("" = its default)
  std::string command_line;          // recorded in the report
};

// rotary::Error naming the field for an unknown scale or study, or a study named twice.
void validate(const ReproduceSpec& spec);

// One claim of a seed and what we measured for it.
struct Claim {
  std::string seed;      // "000", "002", ...
  std::string study;     // where it was measured (a kReproduceStudies name)
  std::string claim;     // the claim, one sentence
  std::string theirs;    // the seed's number(s), or what its figure shows
  std::string ours;      // our number(s); "" when not measured
  std::string verdict;   // reproduced | same ordering, within noise | not reproduced | not measured
  std::string note;      // why, when it needs saying (one model, a different scale, ...)
};

struct ReproduceResult {
  std::vector<Claim> claims;
  std::string report_md;       // <out>/report.md
  std::string claims_json;     // <out>/claims.json
  RunOutcome run;
  double seconds = 0;
};

ReproduceResult run_reproduce(const ReproduceSpec& spec, bool progress);

// The run descriptions a scale gives: the compare of a seed000_* / seed002_text / seed002_performer study, and
// seed004_extrapolate's. rotary::Error for another study name.
CompareSpec reproduce_compare_spec(const ReproduceSpec& spec, const std::string& study);
ExtrapolateSpec reproduce_extrapolate_spec(const ReproduceSpec& spec);
// seed001_memory's `rotary memory` run: the default model (a ReRoPE passkey model at L = 256) read at L, 8L, 64L
// (the seed scale: to 512L, 50 prompts, and the approximate indexes; smoke: a tiny model at L and 2L).
MemorySpec reproduce_memory_spec(const ReproduceSpec& spec);

// How a difference between two encodings' runs reads against the spread over seeds: `expected_better` and
// `other` are every run's value of one metric. "reproduced" when every run of the expected winner beats every run
// of the other, "same ordering, within noise" when only the means (drop-worst) are in the expected order,
// "not reproduced" otherwise, "not measured" when either side has no finite value.
std::string ordering_verdict(const std::vector<double>& expected_better, const std::vector<double>& other,
                             bool higher_is_better);

}  // namespace rotary::experiments
