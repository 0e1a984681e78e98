// lab/tasks/kjv_corpus.cpp: reading the KJV from the `bible` program and splitting it by chapter.
#include "tasks/kjv_corpus.h"

#include <cctype>
#include <charconv>
#include <system_error>
#include <sstream>

#include "common/process.h"
#include "rotary/error.h"

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
    const auto where = [&] { return "line " + std::to_string(i + 1) + " \"" + line.substr(0, 60) + "\""; };
    // A heading stands alone between blank lines; a verse never does (verses follow each other directly).
    const bool alone = (i == 0 || lines[i - 1].empty()) && (i + 1 == lines.size() || lines[i + 1].empty());
    if (alone && !std::isspace(static_cast<unsigned char>(line[0]))) {
      ++split.chapters;
      next_verse = 1;
      continue;
    }
    if (next_verse == 0) fail("bible output", where(), "a chapter heading (\"Genesis 1\") before the verses");
    size_t pos = line.find_first_not_of(' ');
    size_t digits_end = pos;
    while (digits_end < line.size() && std::isdigit(static_cast<unsigned char>(line[digits_end]))) ++digits_end;
    // from_chars, not stoi: a number too long for an int is a malformed line, not a std::out_of_range.
    int verse = 0;
    const bool number_fits =
        digits_end != pos &&
        std::from_chars(line.data() + pos, line.data() + digits_end, verse).ec == std::errc();
    if (!number_fits || digits_end >= line.size() || line[digits_end] != ' ' || verse != next_verse)
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
