// lab/common/stop_signal.h: SIGINT / SIGTERM as a request to stop at the next safe point (torch-free: training, the
// experiments' loops and the checkpoint commands share one flag), and the thread count a run uses.
#pragma once

#include <signal.h>

namespace rotary::lab {

// While a StopSignalGuard lives, SIGINT and SIGTERM set a flag that long loops read at their safe points (the end
// of a training step, of a perplexity cell). The flag stays set after the guard goes (so `compare` does not start
// the next run) until cleared.
bool stop_requested();
int stop_signal();  // the signal that set the flag (-1: a request from the code, 0: none)
void request_stop(int signal);
void clear_stop_request();
// Installs the flag-setting SIGINT/SIGTERM handlers for its lifetime, restoring the previous handlers after.
class StopSignalGuard {
 public:
  StopSignalGuard();
  ~StopSignalGuard();
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// Threads per process: `requested` if > 0, else this machine's cores shared among `processes` ranks.
int resolve_threads(int requested, int processes = 1);

}  // namespace rotary::lab
