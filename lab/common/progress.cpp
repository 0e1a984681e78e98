// lab/common/progress.cpp
#include "common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace rotary::lab {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}

Progress::Progress(int64_t total_steps, int64_t first_step, bool enabled)
    : total_(total_steps),
      first_(first_step),
      step_(first_step),
      enabled_(enabled),
      tty_(::isatty(STDERR_FILENO) == 1),
      plain_every_(std::max<int64_t>(1, total_steps / 20)),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(int64_t step, double loss, double tokens_per_s) {
  step_ = step;
  loss_ = loss;
  tokens_per_s_ = tokens_per_s;
  if (!enabled_) return;
  if (tty_) {
    // Redraw at most 10 times a second: a tiny model takes thousands of steps a second.
    const auto now = std::chrono::steady_clock::now();
    if (now - last_draw_ < std::chrono::milliseconds(100) && step != total_) return;
    last_draw_ = now;
    draw(false);
  } else if (step % plain_every_ == 0 || step == total_) {
    draw(false);
  }
}

void Progress::draw(bool final_line) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done_here = step_ - first_;
  // Time left from the pace of this process (a resumed run does not count the steps it did not do).
  const double left = done_here > 0 ? elapsed / done_here * static_cast<double>(total_ - step_) : NAN;
  char stats[160];
  std::snprintf(stats, sizeof stats, "step %lld/%lld  loss %.4f  %.0f tok/s  left %s", static_cast<long long>(step_),
                static_cast<long long>(total_), loss_, tokens_per_s_, format_duration(left).c_str());
  if (tty_) {
    constexpr int kWidth = 24;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * step_ / total_) : kWidth;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r[%s] %s\x1b[K%s", bar.c_str(), stats, final_line ? "\n" : "");
    bar_drawn_ = !final_line;
  } else {
    std::fprintf(stderr, "%s\n", stats);
  }
  std::fflush(stderr);
}

void Progress::message(const std::string& text) {
  if (!enabled_) return;
  if (tty_ && bar_drawn_) std::fprintf(stderr, "\r\x1b[K");
  std::fprintf(stderr, "%s\n", text.c_str());
  if (tty_ && bar_drawn_) draw(false);
  std::fflush(stderr);
}

void Progress::finish() {
  if (enabled_ && tty_ && bar_drawn_) draw(true);
}

}  // namespace rotary::lab
