// core/src/files.cpp: see rotary/files.h.
#include "rotary/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <set>

#include "rotary/error.h"
#include "rotary/parse_number.h"

namespace rotary {
namespace {

// What a path is when it is not a regular file, for the message.
std::string kind_of(const struct stat& st) {
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  return "not a regular file";
}

[[noreturn]] void refuse(const std::string& path, std::string_view field, const std::string& why,
                         std::string_view allowed) {
  fail(field, path + " (" + why + ")", allowed);
}

// The pid in the part of a temporary file's name after ".tmp.": "<pid>" or "<pid>.<n>".
std::optional<pid_t> temp_file_pid(std::string_view suffix) {
  const size_t dot = suffix.find('.');
  if (dot != std::string_view::npos && !read_unsigned(suffix.substr(dot + 1))) return std::nullopt;
  const std::optional<int64_t> pid = read_integer(suffix.substr(0, dot), 1, std::numeric_limits<pid_t>::max());
  if (!pid) return std::nullopt;
  return pid_t(*pid);
}

// kill(pid, 0) probes without signalling: ESRCH means no such process; EPERM means it runs (as someone else).
bool process_is_gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// "<dir>", "<name>" of a path ("." for a bare name).
std::pair<std::string, std::string> split_path(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

// Removes "<path>.tmp.<pid>[.<n>]" of processes that are gone. Best effort: a directory that cannot be listed, or
// a file another process removes first, leaves the write to go on (and to report its own error, if any).
void remove_stale_temp_files_of(const std::string& path) {
  const auto [dir, name] = split_path(path);
  const std::string prefix = name + ".tmp.";
  DIR* listing = ::opendir(dir.c_str());
  if (!listing) return;
  while (const dirent* entry = ::readdir(listing)) {
    const std::string_view entry_name = entry->d_name;
    if (entry_name.size() <= prefix.size() || entry_name.substr(0, prefix.size()) != prefix) continue;
    const std::optional<pid_t> pid = temp_file_pid(entry_name.substr(prefix.size()));
    if (pid && process_is_gone(*pid)) ::unlinkat(::dirfd(listing), entry->d_name, 0);
  }
  ::closedir(listing);
}

// Two threads of one process writing one target would share "<path>.tmp.<pid>": the second waits for the first.
class TargetTurn {
 public:
  explicit TargetTurn(const std::string& path) : path_(path) {
    std::unique_lock lock(mutex_);
    turn_.wait(lock, [&] { return !busy_.count(path_); });
    busy_.insert(path_);
  }
  ~TargetTurn() {
    {
      std::lock_guard lock(mutex_);
      busy_.erase(path_);
    }
    turn_.notify_all();
  }
  TargetTurn(const TargetTurn&) = delete;
  TargetTurn& operator=(const TargetTurn&) = delete;

 private:
  const std::string& path_;
  static inline std::mutex mutex_;
  static inline std::condition_variable turn_;
  static inline std::set<std::string> busy_;
};

class FdSink final : public FileSink {
 public:
  FdSink(int fd, const std::string& tmp, std::string_view who) : fd_(fd), tmp_(tmp), who_(who) {}
  void write(const void* data, size_t n) override {
    const auto* p = static_cast<const char*>(data);
    written_ += n;
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;  // Ctrl-C arrives as a flag, the write goes on
      if (w <= 0) throw Error("rotary: " + std::string(who_) + ": writing " + tmp_ + ": " + std::strerror(errno));
      p += w, n -= size_t(w);
    }
  }

 private:
  int fd_;
  const std::string& tmp_;
  std::string_view who_;
};

}  // namespace

void check_regular_file(const std::string& path, std::string_view field, std::string_view allowed) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) refuse(path, field, std::strerror(errno), allowed);
  if (!S_ISREG(st.st_mode)) refuse(path, field, kind_of(st), allowed);
}

int open_regular_file(const std::string& path, std::string_view field, std::string_view allowed) {
  check_regular_file(path, field, allowed);
  // O_NONBLOCK: should the path have become a FIFO since the stat, open() returns instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) refuse(path, field, std::strerror(errno), allowed);
  struct stat st {};
  const bool known = ::fstat(fd, &st) == 0;
  if (!known || !S_ISREG(st.st_mode)) {
    const std::string why = known ? kind_of(st) : std::string(std::strerror(errno));
    ::close(fd);
    refuse(path, field, why, allowed);
  }
  // Reads of a regular file never block; clear the flag all the same so the descriptor is an ordinary one.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string read_regular_file(const std::string& path, std::string_view field, std::string_view allowed) {
  const int fd = open_regular_file(path, field, allowed);
  std::string bytes;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      ::close(fd);
      refuse(path, field, why, allowed);
    }
    bytes.append(buf, size_t(n));
  }
  ::close(fd);
  return bytes;
}

void sync_directory_of(const std::string& path, std::string_view who) {
  const std::string dir = split_path(path).first;
  auto failed = [&](int e) {
    throw Error("rotary: " + std::string(who) + ": fsync of directory " + dir + " (holding " + path +
                "): " + std::strerror(e));
  };
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) failed(errno);
  int rc = 0;
  while ((rc = ::fsync(fd)) != 0 && errno == EINTR) {
  }
  const int e = errno;
  ::close(fd);
  if (rc != 0 && e != EINVAL) failed(e);
}

void FileSink::pad_to(uint64_t offset) {
  static const char zeros[256] = {};
  while (written_ < offset) write(zeros, size_t(std::min<uint64_t>(offset - written_, sizeof zeros)));
}

void write_file_atomic(const std::string& path, std::string_view who, const std::function<void(FileSink&)>& fill,
                       Durability durability) {
  const std::string w(who);
  const bool durable = durability == Durability::Durable;
  const TargetTurn turn(path);
  remove_stale_temp_files_of(path);
  // In the target's directory, so that rename() stays on one file system and is atomic.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("rotary: " + w + ": cannot create " + tmp + ": " + std::strerror(errno));
  try {
    FdSink sink(fd, tmp, who);
    fill(sink);
    if (durable && ::fsync(fd) != 0) throw Error("rotary: " + w + ": fsync " + tmp + ": " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error("rotary: " + w + ": cannot rename " + tmp + " to " + path + ": " + std::strerror(e));
  }
  // The rename is durable only once the directory entry is on disk: without this a crash right after the write
  // returns can leave the old file (or none) in place.
  if (durable) sync_directory_of(path, who);
}

void write_file_atomic(const std::string& path, std::string_view who, std::string_view bytes,
                       Durability durability) {
  write_file_atomic(path, who, [&](FileSink& out) { out.write(bytes.data(), bytes.size()); }, durability);
}

bool is_stale_temp_file(std::string_view name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string_view::npos || at == 0) return false;
  const std::optional<pid_t> pid = temp_file_pid(name.substr(at + 5));
  return pid && process_is_gone(*pid);
}

}  // namespace rotary
