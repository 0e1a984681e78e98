// lab/common/progress.h: the progress bar of a run on stderr (torch-free: training and the checkpoint commands).
//
// On a terminal: one line redrawn in place - bar, step, loss, tokens/s, time left. Otherwise (a log file, a
// pipe, ctest): a plain line every ~5% of the run and for every message, so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace rotary::lab {

class Progress {
 public:
  // enabled = false prints nothing (data-parallel ranks other than 0, tests).
  Progress(int64_t total_steps, int64_t first_step, bool enabled);
  void update(int64_t step, double loss, double tokens_per_s);
  // A line of its own (evaluations, checkpoints, warnings), above the bar.
  void message(const std::string& text);
  void finish();

 private:
  void draw(bool final_line);
  int64_t total_, first_, step_ = 0;
  double loss_ = 0, tokens_per_s_ = 0;
  bool enabled_, tty_, bar_drawn_ = false;
  int64_t plain_every_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

}  // namespace rotary::lab
