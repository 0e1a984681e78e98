// lab/tasks/kjv_corpus.h: the King James Bible as printed by `bible` (Debian package bible-kjv), split into
// training and held-out verses. Internal to rotary_tasks and its tests.
#pragma once

#include <string>
#include <vector>

namespace rotary::lab {

struct KjvSplit {
  std::vector<std::string> train;    // verse texts without their numbers, in book order
  std::vector<std::string> heldout;  // the verses of every 20th chapter (chapter index % 20 == 19, 0-based)
  int chapters = 0;
};

inline constexpr int kHeldoutChapterEvery = 20;

// Parses `bible -l0 "gen1:1-rev22:21"` output: each chapter is a blank line, a heading ("Genesis 1",
// "1 Samuel 3"), a blank line, then one line per verse, "  1 In the beginning ...", numbers counting from 1.
// Throws rotary::Error naming the line that breaks this shape.
KjvSplit parse_kjv(const std::string& bible_output);

// Runs `bible -l0 "gen1:1-rev22:21"` and returns its output; throws rotary::Error if it cannot.
std::string run_bible();

}  // namespace rotary::lab
