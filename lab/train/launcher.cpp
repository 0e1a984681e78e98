// lab/train/launcher.cpp: `--nproc N` starts N ranks of this executable (distributed.h: launch_workers). No
// torch here: the launcher only starts the workers with the rank variables set (common/process.h) and waits.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/process.h"
#include "rotary/error.h"
#include "train/distributed.h"

namespace rotary::train {
namespace {

std::vector<pid_t> g_children;  // read by the signal handler
volatile sig_atomic_t g_forwarded_signal = 0;

void forward_signal(int sig) {
  g_forwarded_signal = sig;
  for (pid_t pid : g_children)
    if (pid > 0) ::kill(pid, sig);
}

}  // namespace

int launch_workers(const LaunchSpec& spec, const std::vector<std::string>& argv) {
  check(spec.nproc >= 1, "nproc", spec.nproc, "an integer >= 1");
  check(spec.nnodes >= 1, "nnodes", spec.nnodes, "an integer >= 1");
  check(spec.node_rank >= 0 && spec.node_rank < spec.nnodes, "node_rank", spec.node_rank, "in [0, nnodes)");
  const char* master = std::getenv("MASTER_ADDR");
  if (spec.nnodes > 1 && (!master || !*master))
    fail("MASTER_ADDR", "<unset>", "rank 0's host name (and MASTER_PORT) when nnodes > 1");
  const int world = spec.nproc * spec.nnodes;

  g_children.assign(static_cast<size_t>(spec.nproc), -1);
  struct sigaction sa {}, old_int {}, old_term {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);

  // A worker that cannot be started counts as one that exited with 127 (as when a forked child's exec failed).
  int not_started = 0;
  for (int i = 0; i < spec.nproc; ++i) {
    lab::SpawnOptions worker;
    worker.program = "/proc/self/exe";
    worker.env = {{"RANK", std::to_string(spec.node_rank * spec.nproc + i)},
                  {"LOCAL_RANK", std::to_string(i)},
                  {"WORLD_SIZE", std::to_string(world)}};
    if (!master || !*master) worker.env.emplace_back("ROTARY_STORE_FILE", spec.store_file);
    worker.die_with_parent = true;  // a launcher killed outright leaves no rank blocked in an all-reduce
    pid_t pid = -1;
    const int error = lab::spawn_process(argv, worker, pid);
    if (error == EAGAIN || error == ENOMEM) {  // no process could be made
      forward_signal(SIGTERM);
      throw Error(std::string("rotary: fork failed: ") + std::strerror(error));
    }
    if (error != 0) {
      std::fprintf(stderr, "rotary: exec of the worker failed: %s\n", std::strerror(error));
      ++not_started;
      continue;
    }
    g_children[static_cast<size_t>(i)] = pid;
  }

  // Wait for every worker. Once one has failed, give the others a grace period to finish on their own (after a
  // Ctrl-C or a non-finite loss every rank stops at the same step; rank 0 may still be writing its checkpoint),
  // then kill them: a rank that crashed leaves its peers blocked in an all-reduce forever. Checkpoints are
  // written atomically, so a kill never leaves a torn one.
  int first_failure = not_started > 0 ? 127 : 0;
  int left = spec.nproc - not_started;
  double grace_left_s = not_started > 0 ? 30 : -1;  // < 0: no failure yet
  while (left > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, grace_left_s < 0 ? 0 : WNOHANG);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (pid == 0) {  // nobody exited yet, during the grace period
      ::usleep(50000);
      grace_left_s -= 0.05;
      if (grace_left_s <= 0) {
        for (pid_t c : g_children)
          if (c > 0) ::kill(c, SIGKILL);
        grace_left_s = 1e9;
      }
      continue;
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    for (pid_t& c : g_children)
      if (c == pid) c = -1;
    --left;
    if (code != 0 && first_failure == 0) {
      first_failure = code;
      grace_left_s = 30;
    }
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  g_children.clear();
  return first_failure;
}

}  // namespace rotary::train
