// lab/common/process.cpp: posix_spawnp with stdin/stdout/stderr redirected to files.
#include "common/process.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "rotary/error.h"

extern char** environ;

namespace rotary::lab {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string joined(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

}  // namespace

CommandResult run_command(const std::vector<std::string>& argv, const std::string& stdin_path) {
  check(!argv.empty(), "command", "\"\"", "a program name and its arguments");
  static std::atomic<unsigned> counter{0};
  const fs::path base = fs::temp_directory_path() /
                        ("rotary-cmd." + std::to_string(getpid()) + "." + std::to_string(counter++));
  const std::string out_path = base.string() + ".out", err_path = base.string() + ".err";

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, stdin_path.empty() ? "/dev/null" : stdin_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  CommandResult r;
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    r.status = 127;
    r.err = std::string("cannot start ") + argv[0] + ": " + std::strerror(rc);
  } else {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    r.out = slurp(out_path);
    r.err = slurp(err_path);
  }
  std::error_code ignored;
  fs::remove(out_path, ignored);
  fs::remove(err_path, ignored);
  return r;
}

std::string run_command_or_fail(const std::string& what, const std::vector<std::string>& argv, const std::string& hint,
                                const std::string& stdin_path) {
  CommandResult r = run_command(argv, stdin_path);
  if (r.status != 0) {
    std::string tail = r.err.size() > 400 ? r.err.substr(r.err.size() - 400) : r.err;
    if (r.err.size() > 400) tail.insert(0, "...");
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
    // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "literal" + std::string&& here.
    std::string value = "`";
    value.append(joined(argv)).append("` exited with status ").append(std::to_string(r.status));
    if (!tail.empty()) value.append(" (").append(tail).append(")");
    fail(what, value, hint);
  }
  return std::move(r.out);
}

}  // namespace rotary::lab
