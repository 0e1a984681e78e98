// rotary/files.h: opening a file a user named (config.json, safetensors, a memory file, tokenizer files, token ids)
// without blocking on it.
//
// open() of a FIFO waits for a writer, and a directory opens but fails on the first read; either would be a hang
// or an error that does not say what is wrong. Every reader of a user's file goes through these, which look at the
// file with stat() first and open it non-blocking, and refuse anything but a regular file by name:
// "rotary: <field> = <path> (a directory) is invalid; allowed: <allowed>".
#pragma once

#include <cstddef>
#include <cstdint>
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
// only once its directory entry is, so an atomic write (temporary file, fsync, rename) calls this after the rename.
// rotary::Error "rotary: <who>: fsync of directory <dir> (holding <path>): <reason>" if the directory cannot be
// opened or synced; a file system that cannot sync directories at all (EINVAL) is not an error.
void sync_directory_of(const std::string& path, std::string_view who);

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
