// lab/common/exit_status.cpp: see exit_status.h.
#include "common/exit_status.h"

#include <csignal>
#include <new>
#include <string>

#include "rotary/error.h"

namespace rotary::lab {
namespace {

std::string first_line(const char* what) {
  std::string s(what ? what : "");
  s = s.substr(0, s.find('\n'));
  return s.size() > 400 ? s.substr(0, 400) + "..." : s;
}

}  // namespace

int interrupted_exit_status(int signal) { return 128 + (signal > 0 ? signal : SIGINT); }

int report_exception(std::exception_ptr error, std::FILE* out) {
  constexpr const char* kBug = "internal error (a bug in rotary; please report it with the command line): ";
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    std::fprintf(out, "error: %s\n", e.what());
    return kExitBadInput;
  } catch (const std::bad_alloc&) {
    std::fprintf(out, "error: rotary: out of memory (a size given may be too large for this machine)\n");
    return kExitOutOfMemory;
  } catch (const std::exception& e) {
    std::fprintf(out, "%s%s\n", kBug, first_line(e.what()).c_str());
    return kExitInternalError;
  } catch (...) {
    std::fprintf(out, "%sunknown exception\n", kBug);
    return kExitInternalError;
  }
}

}  // namespace rotary::lab
