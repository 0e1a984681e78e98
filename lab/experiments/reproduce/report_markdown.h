// lab/experiments/reproduce/report_markdown.h: the report of `rotary reproduce` - report.md (every claim beside
// our number and its verdict, then each study's section) and claims.json.
#pragma once

#include <string>

#include "experiments/reproduce.h"

namespace rotary::experiments::reproduce {

// Writes <out>/report.md from result.claims, result.seconds and the studies' `sections`, and <out>/claims.json;
// sets result.report_md and result.claims_json to their paths.
void write_report(const ReproduceSpec& spec, const std::string& sections, ReproduceResult& result);

}  // namespace rotary::experiments::reproduce
