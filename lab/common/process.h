// lab/common/process.h: run a program (no shell) and collect what it prints.
//
// The text task drives `bible`, `spm_train` and `spm_encode` as separate processes instead of linking
// libsentencepiece: Debian's libsentencepiece carries its own protobuf-lite 3.14 and libtorch links protobuf
// 3.21, and the two cannot live in one process (the version check aborts, or the static initialisers clash).
#pragma once

#include <string>
#include <vector>

namespace rotary::lab {

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
