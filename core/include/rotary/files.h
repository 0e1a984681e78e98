// rotary/files.h: opening a file a user named (config.json, safetensors, a memory file, tokenizer files, token ids)
// without blocking on it, and the one atomic writer of every file the project writes.
//
// open() of a FIFO waits for a writer, and a directory opens but fails on the first read; either would be a hang
// or an error that does not say what is wrong. Every reader of a user's file goes through these, which look at the
// file with stat() first and open it non-blocking, and refuse anything but a regular file by name:
// "rotary: <field> = <path> (a directory) is invalid; allowed: <allowed>".
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace rotary {

// rotary::Error naming `field`, `path` and what it is instead (missing, a directory, a FIFO, ...) unless `path`
// is a regular file. `allowed` says what the caller reads there ("a regular file" by default).
void check_regular_file(const std::string& path, std::string_view field,
                        std::string_view allowed = "a readable regular file");

// The whole of the regular file `path` (check_regular_file first, then a non-blocking open and a second check of
// what was opened, so a file swapped for a FIFO in between is refused too).
std::string read_regular_file(const std::string& path, std::string_view field,
                              std::string_view allowed = "a readable regular file");

// A file descriptor (O_RDONLY | O_CLOEXEC) of the regular file `path`, checked as read_regular_file checks it; the
// caller closes it. For readers that map the file instead of reading it.
int open_regular_file(const std::string& path, std::string_view field,
                      std::string_view allowed = "a readable regular file");

// fsync of the directory holding `path` (its parent, "." for a bare name): a file renamed into place is durable
// only once its directory entry is, so write_file_atomic calls this after the rename.
// rotary::Error "rotary: <who>: fsync of directory <dir> (holding <path>): <reason>" if the directory cannot be
// opened or synced; a file system that cannot sync directories at all (EINVAL) is not an error.
void sync_directory_of(const std::string& path, std::string_view who);

// How long a written file must survive. Durable (checkpoints, memory and KV files, metrics, reports): the file and
// its directory entry are fsync'ed before write_file_atomic returns. Cache (files rebuilt when missing - the text
// task's corpus, tokenizer and ids - and temporary inputs of other programs): no fsync, still replaced atomically.
enum class Durability { Durable, Cache };

// What write_file_atomic hands its `fill`: writes the bytes given, in order, to the temporary file.
class FileSink {
 public:
  virtual void write(const void* data, size_t n) = 0;
  // Zero bytes up to `offset` bytes written in all (nothing if there already).
  void pad_to(uint64_t offset);
  uint64_t written() const { return written_; }

 protected:
  ~FileSink() = default;
  uint64_t written_ = 0;
};

// The one atomic writer (core's binary files, the engine's saved contexts, the lab's checkpoints, cells and reports):
// `fill` writes the content to "<path>.tmp.<pid>" beside `path` (one file system, so the rename is atomic), which
// is fsync'ed, renamed over `path`, and the directory synced (sync_directory_of) - the target is the old file or the
// complete new one, never a torn one, and survives a crash once this returns. Cache skips the two fsyncs.
// A failure removes the temporary file, leaves `path` as it was and throws rotary::Error "rotary: <who>: cannot
// create <tmp>: <reason>" / "writing <tmp>" / "fsync <tmp>" / "cannot rename <tmp> to <path>" (or
// sync_directory_of's); whatever `fill` throws passes through after the same clean-up.
// Before it writes, it removes what a killed earlier writer of the same target left: "<path>.tmp.<pid>" (and
// "<path>.tmp.<pid>.<n>", the lab's earlier name) of a process that no longer runs (is_stale_temp_file). Two
// threads of one process writing one target take turns (they would share the temporary file's name).
void write_file_atomic(const std::string& path, std::string_view who, const std::function<void(FileSink&)>& fill,
                       Durability durability = Durability::Durable);
// The same with the content in hand.
void write_file_atomic(const std::string& path, std::string_view who, std::string_view bytes,
                       Durability durability = Durability::Durable);

// Is the file name `name` (no directory) a temporary file of write_file_atomic - "<target>.tmp.<pid>" or
// "<target>.tmp.<pid>.<n>" - whose process no longer runs (kill(pid, 0) says no such process)? A live writer's,
// this process's own, and a name whose suffix is not a pid ("notes.tmp.txt") are not.
bool is_stale_temp_file(std::string_view name);

// FNV-1a, 64 bits, of n bytes, going on from h (kFnv1a64Offset to start): the checksum of the memory and page
// index files, the lab's cache and checkpoint files, and the fingerprint of a saved engine context. Stable across
// builds and machines; not cryptographic.
inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ULL;
inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnv1a64Offset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

}  // namespace rotary
