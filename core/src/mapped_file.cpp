// core/src/mapped_file.cpp: see mapped_file.h.
#include "mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

}  // namespace rotary::detail
