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

// Torch reports a failed allocation as a c10::Error (a std::exception), not std::bad_alloc: its CPU allocator says
// "[enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't allocate memory: ..." (torch 1.x) or
// "DefaultCPUAllocator: not enough memory: ..." (2.x), CUDA's "CUDA out of memory". Recognised by that first line,
// so this file stays torch-free.
bool is_allocation_failure(const std::string& line) {
  return line.find("DefaultCPUAllocator: can't allocate memory") != std::string::npos ||
         line.find("DefaultCPUAllocator: not enough memory") != std::string::npos ||
         line.find("CUDA out of memory") != std::string::npos;
}

}  // namespace

int interrupted_exit_status(int signal) { return 128 + (signal > 0 ? signal : SIGINT); }

int report_exception(std::exception_ptr error, std::FILE* out) {
  constexpr const char* kBug = "internal error (a bug in rotary; please report it with the command line): ";
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    // Whole: rotary::Error escapes a NUL (a user's text quoted in the message), which would end what() there.
    std::fprintf(out, "error: %s\n", e.what());
    return kExitBadInput;
  } catch (const std::bad_alloc&) {
    std::fprintf(out, "error: rotary: out of memory (a size given may be too large for this machine)\n");
    return kExitOutOfMemory;
  } catch (const std::exception& e) {
    const std::string line = first_line(e.what());
    if (is_allocation_failure(line)) {
      std::fprintf(out, "error: rotary: out of memory (a size given may be too large for this machine): %s\n",
                   line.c_str());
      return kExitOutOfMemory;
    }
    std::fprintf(out, "%s%s\n", kBug, line.c_str());
    return kExitInternalError;
  } catch (...) {
    std::fprintf(out, "%sunknown exception\n", kBug);
    return kExitInternalError;
  }
}

}  // namespace rotary::lab
