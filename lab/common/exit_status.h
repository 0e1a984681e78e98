// lab/common/exit_status.h: the one exit-status policy of the `rotary` command line (docs/errors.md).
//
//   0       success, --help
//   2       the user's input is refused: a flag, a value or a file (rotary::Error, a CLI11 usage error); the message
//           names the field, the value and what is allowed
//   3       training stopped because the loss became non-finite (the run's files say at which step)
//   70      an internal error: any other exception is a bug in rotary, and the message says so in one line
//   71      out of memory
//   128+N   interrupted by signal N after saving what was done (Ctrl-C: 130)
#pragma once

#include <cstdio>
#include <exception>

namespace rotary::lab {

enum ExitStatus : int {
  kExitSuccess = 0,
  kExitBadInput = 2,
  kExitNonFiniteLoss = 3,
  kExitInternalError = 70,  // EX_SOFTWARE of sysexits.h
  kExitOutOfMemory = 71,
};

// The exit status for an interruption by `signal` (0 = no signal known: SIGINT's).
int interrupted_exit_status(int signal);

// Prints one message for `error` to `out` ("error: ..." for bad input; "internal error (a bug in rotary ...)" with
// only the first line of the exception's text otherwise: torch appends C++ frames) and returns its exit status.
int report_exception(std::exception_ptr error, std::FILE* out);

}  // namespace rotary::lab
