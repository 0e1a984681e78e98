// core/src/mapped_file.cpp: see mapped_file.h.
#include "mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "rotary/error.h"
#include "rotary/files.h"

namespace rotary::detail {

MappedFile MappedFile::open(const std::string& path, std::string_view field, std::string_view allowed,
                            std::string_view who) {
  const int fd = open_regular_file(path, field, allowed);
  auto failed = [&](const char* what, int e) {
    return Error("rotary: " + std::string(who) + ": cannot " + what + " " + path + ": " + std::strerror(e));
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw failed("open", e);
  }
  MappedFile f;
  if (st.st_size > 0) {
    void* data = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    const int e = errno;
    ::close(fd);
    if (data == MAP_FAILED) throw failed("map", e);
    f.data_ = data, f.size_ = size_t(st.st_size);
  } else {
    ::close(fd);
  }
  return f;
}

void MappedFile::advise(Access access) const {
  // A hint only: where it is refused the mapping works as before.
  if (data_) ::madvise(data_, size_, access == Access::Random ? MADV_RANDOM : MADV_NORMAL);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void FileSink::pad_to(uint64_t offset) {
  static const char zeros[256] = {};
  while (written_ < offset) write(zeros, size_t(std::min<uint64_t>(offset - written_, sizeof zeros)));
}

namespace {

class FdSink final : public FileSink {
 public:
  FdSink(int fd, const std::string& tmp, std::string_view who) : fd_(fd), tmp_(tmp), who_(who) {}
  void write(const void* data, size_t n) override {
    const auto* p = static_cast<const char*>(data);
    written_ += n;
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
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

void write_file_atomic(const std::string& path, std::string_view who, const std::function<void(FileSink&)>& fill) {
  const std::string w(who);
  // In the target's directory, so that rename() stays on one file system and is atomic.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("rotary: " + w + ": cannot create " + tmp + ": " + std::strerror(errno));
  try {
    FdSink sink(fd, tmp, who);
    fill(sink);
    if (::fsync(fd) != 0) throw Error("rotary: " + w + ": fsync " + tmp + ": " + std::strerror(errno));
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
  sync_directory_of(path, who);
}

}  // namespace rotary::detail
