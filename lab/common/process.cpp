// lab/common/process.cpp: posix_spawnp, with the child's directory, environment and standard files set up by file
// actions (see process.h).
#include "common/process.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

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

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

namespace {
// How a child learns the pid of the parent it must not outlive (SpawnOptions::die_with_parent).
constexpr const char* kParentPidVariable = "ROTARY_PARENT_PID";
}  // namespace

void die_with_parent_if_asked() {
  const char* parent = std::getenv(kParentPidVariable);
  if (parent == nullptr) return;
  const long expected = std::strtol(parent, nullptr, 10);
  ::unsetenv(kParentPidVariable);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The parent may have died between our start and the prctl: then we were already adopted by another process.
  if (expected > 0 && ::getppid() != pid_t(expected)) ::raise(SIGTERM);
}

int spawn_process(const std::vector<std::string>& argv, const SpawnOptions& given, pid_t& pid) {
  check(!argv.empty(), "command", "\"\"", "a program name and its arguments");
  SpawnOptions options = given;
  if (options.die_with_parent) options.env.emplace_back(kParentPidVariable, std::to_string(::getpid()));
  // The file actions run in order in the child: the directory first, so that the relative paths are opened in it.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!options.cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, options.cwd.c_str());
  const int write_flags = O_WRONLY | O_CREAT | O_TRUNC;
  if (!options.stdin_path.empty())
    posix_spawn_file_actions_addopen(&actions, 0, options.stdin_path.c_str(), O_RDONLY, 0);
  if (!options.stdout_path.empty())
    posix_spawn_file_actions_addopen(&actions, 1, options.stdout_path.c_str(), write_flags, options.file_mode);
  if (options.stderr_to_stdout)
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  else if (!options.stderr_path.empty())
    posix_spawn_file_actions_addopen(&actions, 2, options.stderr_path.c_str(), write_flags, options.file_mode);

  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  // Our environment, with the overrides replacing variables of the same name.
  char** env = environ;
  std::vector<std::string> overrides;
  std::vector<char*> envp;
  if (!options.env.empty()) {
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      const std::string_view entry(*e);
      const std::string_view name = entry.substr(0, entry.find('='));
      bool replaced = false;
      for (const auto& kv : options.env) replaced = replaced || kv.first == name;
      if (!replaced) envp.push_back(*e);
    }
    for (const auto& [name, value] : options.env) overrides.push_back(name + "=" + value);
    for (std::string& s : overrides) envp.push_back(s.data());
    envp.push_back(nullptr);
    env = envp.data();
  }

  const std::string& program = options.program.empty() ? argv[0] : options.program;
  const int rc = posix_spawnp(&pid, program.c_str(), &actions, nullptr, args.data(), env);
  posix_spawn_file_actions_destroy(&actions);
  return rc;
}

int wait_process(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string find_in_path(const std::string& name) {
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return is_executable_file(name) ? name : "";
  const char* path = std::getenv("PATH");
  const std::string dirs = path != nullptr ? path : "/bin:/usr/bin";  // posix_spawnp's default
  for (size_t start = 0;;) {
    const size_t end = dirs.find(':', start);
    const std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (is_executable_file(candidate)) return candidate;
    if (end == std::string::npos) return "";
    start = end + 1;
  }
}

CommandResult run_command(const std::vector<std::string>& argv, const std::string& stdin_path) {
  check(!argv.empty(), "command", "\"\"", "a program name and its arguments");
  static std::atomic<unsigned> counter{0};
  const fs::path base = fs::temp_directory_path() /
                        ("rotary-cmd." + std::to_string(getpid()) + "." + std::to_string(counter++));
  SpawnOptions options;
  options.stdin_path = stdin_path.empty() ? "/dev/null" : stdin_path;
  options.stdout_path = base.string() + ".out";
  options.stderr_path = base.string() + ".err";
  options.file_mode = 0600;

  CommandResult r;
  pid_t pid = 0;
  const int rc = spawn_process(argv, options, pid);
  if (rc != 0) {
    r.status = 127;
    r.err = std::string("cannot start ") + argv[0] + ": " + std::strerror(rc);
  } else {
    r.status = wait_process(pid);
    r.out = slurp(options.stdout_path);
    r.err = slurp(options.stderr_path);
  }
  std::error_code ignored;
  fs::remove(options.stdout_path, ignored);
  fs::remove(options.stderr_path, ignored);
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
