// core/src/files.cpp: see rotary/files.h.
#include "rotary/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "rotary/error.h"

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
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
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

}  // namespace rotary
