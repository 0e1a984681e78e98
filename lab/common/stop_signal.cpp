#include "common/stop_signal.h"

#include <algorithm>
#include <atomic>
#include <thread>

namespace rotary::lab {
namespace {

std::atomic<int> g_stop_signal{0};

void on_stop_signal(int sig) { g_stop_signal.store(sig); }

}  // namespace

StopSignalGuard::StopSignalGuard() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls (gloo sockets, file writes) carry on; the loop reads the flag
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
}

StopSignalGuard::~StopSignalGuard() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
}

bool stop_requested() { return g_stop_signal.load() != 0; }
int stop_signal() { return g_stop_signal.load(); }
void request_stop(int signal) { g_stop_signal.store(signal); }
void clear_stop_request() { g_stop_signal.store(0); }

int resolve_threads(int requested, int processes) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return requested > 0 ? requested : std::max(1, cores / std::max(1, processes));
}

}  // namespace rotary::lab
