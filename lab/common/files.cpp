// lab/common/files.cpp: see files.h.
#include "common/files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "rotary/error.h"
#include "rotary/files.h"

namespace rotary::lab {
namespace {

[[noreturn]] void fail_io(const std::string& what, const std::string& path) {
  throw Error("rotary: cannot " + what + " " + path + ": " + std::strerror(errno));
}

}  // namespace

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return (std::filesystem::path(dir) / name).string();
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void make_dirs(const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) throw Error("rotary: cannot create directory " + path + ": " + ec.message());
}

std::string read_file(const std::filesystem::path& path) { return read_regular_file(path.string(), "file"); }

DirectoryLock::DirectoryLock(const std::string& dir, std::string_view field) {
  make_dirs(dir);
  const std::string path = join_path(dir, ".rotary.lock");
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) fail_io("create the lock file", path);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    char holder[32] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (e != EWOULDBLOCK) {
      errno = e;
      fail_io("lock", path);
    }
    std::string pid(holder, n > 0 ? size_t(n) : 0);
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    fail(field, dir + " (in use by another rotary command, pid " + (pid.empty() ? std::string("unknown") : pid) + ")",
         "a directory no other command is writing to (wait for it to finish, or give another directory)");
  }
  // The holder's pid, for a second command's message. Should the write fail, the lock holds all the same and that
  // message says "pid unknown".
  const std::string pid = std::to_string(::getpid()) + "\n";
  const bool pid_written = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) == ssize_t(pid.size());
  (void)pid_written;
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

uint64_t fnv1a64(std::string_view bytes) { return rotary::fnv1a64(bytes.data(), bytes.size()); }

int remove_stale_temp_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  int removed = 0;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec) || !is_stale_temp_file(it->path().filename().string())) continue;
    std::error_code rm_ec;
    if (fs::remove(it->path(), rm_ec)) ++removed;
  }
  return removed;
}

void write_file_atomic(const std::filesystem::path& target, std::string_view bytes, Durability durability) {
  rotary::write_file_atomic(target.string(), "write", bytes, durability);
}

}  // namespace rotary::lab
