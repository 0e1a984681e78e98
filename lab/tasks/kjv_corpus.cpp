// lab/tasks/kjv_corpus.cpp: reading the KJV from the `bible` program and splitting it by chapter.
#include "tasks/kjv_corpus.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "common/process.h"
#include "rotary/error.h"
#include "rotary/parse_number.h"

namespace rotary::lab {

KjvSplit parse_kjv(const std::string& bible_output) {
  std::vector<std::string> lines;
  std::istringstream in(bible_output);
  for (std::string line; std::getline(in, line);) lines.push_back(line);

  KjvSplit split;
  int next_verse = 0;  // 0 = before the first heading
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.empty()) continue;
    const auto where = [&] { return "line " + std::to_string(i + 1) + " " + quoted_text(line, 60); };
    // A heading stands alone between blank lines; a verse never does (verses follow each other directly).
    const bool alone = (i == 0 || lines[i - 1].empty()) && (i + 1 == lines.size() || lines[i + 1].empty());
    if (alone && !std::isspace(static_cast<unsigned char>(line[0]))) {
      ++split.chapters;
      next_verse = 1;
      continue;
    }
    if (next_verse == 0) fail("bible output", where(), "a chapter heading (\"Genesis 1\") before the verses");
    // "  <verse> <text>": the number up to the first space after it, read by the one rule (a number too long for an
    // int is a malformed line, not a std::out_of_range).
    const size_t pos = std::min(line.find_first_not_of(' '), line.size());
    const size_t digits_end = std::min(line.find(' ', pos), line.size());
    const std::optional<int64_t> verse =
        read_integer(std::string_view(line).substr(pos, digits_end - pos), next_verse, next_verse);
    if (!verse || digits_end >= line.size())
      fail("bible output", where(), "verse " + std::to_string(next_verse) + " as \"  " +
                                        std::to_string(next_verse) + " text\"");
    ++next_verse;
    std::string text = line.substr(digits_end + 1);
    const bool heldout = (split.chapters - 1) % kHeldoutChapterEvery == kHeldoutChapterEvery - 1;
    (heldout ? split.heldout : split.train).push_back(std::move(text));
  }
  check(!split.train.empty() && !split.heldout.empty(), "bible output chapters", split.chapters,
        "at least " + std::to_string(kHeldoutChapterEvery) + " chapters with verses");
  return split;
}

std::string run_bible() {
  std::string out = run_command_or_fail("text corpus", {"bible", "-l0", "gen1:1-rev22:21"},
                                        "the `bible` program from Debian's bible-kjv (apt-get install bible-kjv)");
  check(!out.empty(), "text corpus", "`bible -l0 gen1:1-rev22:21` printed nothing", "the whole KJV (4.3 MB)");
  return out;
}

}  // namespace rotary::lab
