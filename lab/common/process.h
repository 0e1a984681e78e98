// lab/common/process.h: the lab's one way to start a program - posix_spawnp, no shell anywhere - and to find one
// in PATH.
//
// The text task drives `bible`, `spm_train` and `spm_encode` as separate processes instead of linking
// libsentencepiece: Debian's libsentencepiece carries its own protobuf-lite 3.14 and libtorch links protobuf
// 3.21, and the two cannot live in one process (the version check aborts, or the static initialisers clash).
// The reports run gnuplot, and `rotary train --nproc N` starts its ranks (train/launcher.cpp), the same way.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace rotary::lab {

struct SpawnOptions {
  std::string program;      // what to run, looked up in PATH unless it has a '/'; empty: argv[0]
  std::string cwd;          // the child's working directory (the paths below are relative to it); empty: ours
  std::vector<std::pair<std::string, std::string>> env;  // set in the child's environment, the rest is ours
  std::string stdin_path;   // empty: inherited
  std::string stdout_path;  // created or truncated with `file_mode`; empty: inherited
  std::string stderr_path;  // likewise; empty: inherited (or stdout's file, with stderr_to_stdout)
  bool stderr_to_stdout = false;  // 2>&1
  mode_t file_mode = 0666;        // before the umask
  // The child ends when this process does, however it ends (SIGKILL included): for `rotary` children, which
  // call die_with_parent_if_asked() first thing. posix_spawn cannot set PR_SET_PDEATHSIG in the child itself, so
  // the child is told our pid (ROTARY_PARENT_PID) and asks the kernel for SIGTERM at our death. Spawn from the
  // main thread: the kernel sends the signal when the spawning thread ends.
  bool die_with_parent = false;
};

// In a child started with die_with_parent: PR_SET_PDEATHSIG(SIGTERM), or SIGTERM to itself at once if the parent
// is already gone. Removes ROTARY_PARENT_PID from the environment (the child's own children are not the parent's).
// A no-op in a process started otherwise.
void die_with_parent_if_asked();

// Starts the program with `argv` without waiting for it. Returns 0 and sets `pid`, or the errno value of what
// failed (the program is missing or cannot be run, a file cannot be opened, no process could be made).
int spawn_process(const std::vector<std::string>& argv, const SpawnOptions& options, pid_t& pid);

// Waits for `pid` (through EINTR): its exit status, 128 + n when killed by signal n.
int wait_process(pid_t pid);

// Where `command -v name` finds the program: `name` itself if it has a '/' (and is executable), else the first
// executable regular file `name` in the directories of PATH. "" if there is none.
std::string find_in_path(const std::string& name);

struct CommandResult {
  int status = 0;    // exit status; 128 + n when killed by signal n; 127 when the program could not be started
  std::string out;   // standard output
  std::string err;   // standard error
};

// Runs argv[0] (looked up in PATH) with argv, standard input from `stdin_path` (empty: /dev/null). Output goes
// through temporary files, so a program that prints a lot never blocks on a full pipe.
CommandResult run_command(const std::vector<std::string>& argv, const std::string& stdin_path = "");

// run_command, and a rotary::Error naming `what`, the command, its status and the end of its stderr unless it
// exits 0. `hint` says what is needed (e.g. "apt-get install sentencepiece").
std::string run_command_or_fail(const std::string& what, const std::vector<std::string>& argv, const std::string& hint,
                                const std::string& stdin_path = "");

}  // namespace rotary::lab
