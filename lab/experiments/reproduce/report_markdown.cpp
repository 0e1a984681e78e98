// lab/experiments/reproduce/report_markdown.cpp
#include "experiments/reproduce/report_markdown.h"

#include <algorithm>
#include <fmt/format.h>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/files.h"
#include "common/machine.h"

namespace rotary::experiments::reproduce {

using nlohmann::json;

void write_report(const ReproduceSpec& spec, const std::string& sections, ReproduceResult& result) {
  std::ostringstream md;
  md << "# rotary reproduce: the seeds' claims, rerun\n\n";
  if (!spec.command_line.empty()) md << "Command: `" << spec.command_line << "`\n\n";
  md << fmt::format("Scale: **{}**. Machine: {}, {} cores. This invocation: {:.0f} s (studies finished by an earlier "
                    "invocation were reused).\n\n",
                    spec.scale, lab::cpu_description(), std::thread::hardware_concurrency(), result.seconds);
  md << "Verdicts: *reproduced* - the seed's ordering holds (for compares: every run of the expected winner beats "
        "every run of the other); *same ordering, within noise* - the means are in the seed's order but the runs' "
        "ranges overlap; *not reproduced* - the means are in the other order, or the number misses the seed's; *not "
        "measured* - the study did not run or cannot measure it here.\n\n";
  const std::vector<Claim>& claims = result.claims;
  std::map<std::string, int> counts;
  for (const Claim& c : claims) ++counts[c.verdict];
  md << "Summary:";
  for (const auto& [v, n] : counts) md << " " << v << " " << n << ";";
  md << "\n\n## Claims\n\n| seed | claim | the seed | ours | verdict | scale / note |\n|---|---|---|---|---|---|\n";
  auto cell = [](std::string s) {
    std::replace(s.begin(), s.end(), '|', '/');  // a '|' would split the markdown cell
    return s.empty() ? std::string("-") : s;
  };
  for (const Claim& c : claims)
    md << "| " << c.seed << " | " << cell(c.claim) << " | " << cell(c.theirs) << " | " << cell(c.ours) << " | **"
       << c.verdict << "** | " << cell(c.note) << " |\n";
  md << "\n## Studies\n\n" << sections;
  result.report_md = lab::join_path(spec.out_dir, "report.md");
  lab::write_file_atomic(result.report_md, md.str());
  json j = json::array();
  for (const Claim& c : claims)
    j.push_back({{"seed", c.seed}, {"study", c.study}, {"claim", c.claim}, {"theirs", c.theirs}, {"ours", c.ours},
                 {"verdict", c.verdict}, {"note", c.note}});
  result.claims_json = lab::join_path(spec.out_dir, "claims.json");
  lab::write_file_atomic(result.claims_json, json{{"scale", spec.scale}, {"claims", j}}.dump(2));
}

}  // namespace rotary::experiments::reproduce
