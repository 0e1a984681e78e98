// core/src/mapped_file.h (internal): the file plumbing of the core's binary formats - safetensors (read), the
// retrieval memory's, page index's, graph's and KV cache's files (read here; written through rotary/files.h's
// write_file_atomic, the one atomic writer):
//   MappedFile    a regular file mapped read-only (files.h's open_regular_file, fstat, mmap), unmapped with it
//   HashingSink   a files.h FileSink that checksums what passes through it
//   ReaderErrors  the errors of a binary file's reader
// (Their checksum is rotary/files.h's fnv1a64.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rotary/error.h"
#include "rotary/files.h"

namespace rotary::detail {

class MappedFile {
 public:
  // Maps the regular file `path` read-only. Errors: open_regular_file's, naming `field` and `allowed` (missing,
  // a directory, a FIFO, ...); then "rotary: <who>: cannot open <path>: <reason>" (fstat) or "rotary: <who>:
  // cannot map <path>: <reason>". An empty file maps to data() == nullptr, size() == 0.
  static MappedFile open(const std::string& path, std::string_view field, std::string_view allowed,
                         std::string_view who);
  // How the pages will be read from here on. Random: in no order (a retrieval memory or a page index read by
  // search, larger than RAM): the kernel is told (MADV_RANDOM) not to read ahead of each fault - by default a fault
  // on a file mapping reads up to 128 KB around it, which turns every scattered row of a search into 32 pages from
  // disk. Sequential: the default read-ahead.
  enum class Access { Sequential, Random };
  void advise(Access access) const;
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// A FileSink that hashes (FNV-1a) what passes through it on the way to `out`, its offsets `out`'s: a checksum of a
// block written as it is written.
class HashingSink final : public FileSink {
 public:
  explicit HashingSink(FileSink& out) : out_(out) { written_ = out.written(); }
  void write(const void* data, size_t n) override {
    hash_ = fnv1a64(data, n, hash_);
    out_.write(data, n);
    written_ += n;
  }
  uint64_t hash() const { return hash_; }

 private:
  FileSink& out_;
  uint64_t hash_ = kFnv1a64Offset;
};

// The errors of a binary file's reader (the memory file, the page index file), all "rotary: <who>: <source>: ...":
// bad(what); damaged(field, value, allowed) for a header field outside what the writer can write, named with its
// value and what is allowed; check_aligned(base) for bytes whose int64 / float views need 8-byte alignment.
struct ReaderErrors {
  std::string who, source;  // "kv_memory.open", the file or "memory bytes"
  Error bad(const std::string& what) const { return Error("rotary: " + who + ": " + source + ": " + what); }
  Error damaged(std::string_view field, int64_t value, const std::string& allowed) const {
    return bad("a damaged header: " + std::string(field) + " = " + std::to_string(value) + " is invalid; allowed: " +
               allowed);
  }
  void check_aligned(const void* base) const {
    if (reinterpret_cast<uintptr_t>(base) % alignof(int64_t) != 0)
      throw bad("bytes at address " + std::to_string(reinterpret_cast<uintptr_t>(base)) +
                " are invalid; allowed: an address aligned to 8 bytes (a mapping or a heap buffer)");
  }
};

}  // namespace rotary::detail
