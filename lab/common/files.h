// lab/common/files.h: small file helpers of the lab (torch-free).
//
// Checkpoints, summaries and reports are written atomically, by core's one atomic writer (rotary/files.h
// write_file_atomic): the bytes go to a temporary file in the same directory, which is fsync'ed and renamed over
// the target, then the directory is fsync'ed. A crash or a Ctrl-C at any point leaves either the old file or the
// new one, never a torn one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "rotary/files.h"

namespace rotary::lab {

using rotary::Durability;  // Durable: checkpoints, metrics, reports; Cache: the text task's rebuildable files

// rotary::write_file_atomic of `bytes` ("<path>.tmp.<pid>" renamed over `path`); rotary::Error "rotary: write:
// ..." naming the temporary file or the path.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes,
                       Durability durability = Durability::Durable);
// The whole file; throws rotary::Error naming the path if it cannot be read.
std::string read_file(const std::filesystem::path& path);
// FNV-1a 64 of `bytes`: the checksum of checkpoints and the identity of a tokenizer model (not cryptographic).
uint64_t fnv1a64(std::string_view bytes);
bool file_exists(const std::string& path);
// Removes the temporary files ("<name>.tmp.<pid>[.<n>]") that write_file_atomic left under `dir` (recursively) when its
// process was killed mid-write: only those whose process no longer runs (rotary::is_stale_temp_file), so a
// concurrent writer keeps its own. Returns how many were removed; a missing `dir` is not an error. Runs and
// experiments call it when they start (a file that is written again loses its own stale ones on that write).
int remove_stale_temp_files(const std::string& dir);
// An exclusive lock on an output directory (flock on "<dir>/.rotary.lock", which holds the holder's pid), held
// while the object lives: two commands writing one directory at once would run the same work twice and report
// each other's half-written files. A second command is refused at once: rotary::Error naming `field` (the flag
// that gave the directory), the directory and the holder's pid. The kernel drops the lock when its process ends
// however it ends (SIGKILL included), so no stale lock outlives a crash. Creates the directory.
class DirectoryLock {
 public:
  DirectoryLock(const std::string& dir, std::string_view field);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

// mkdir -p; throws rotary::Error naming the path.
void make_dirs(const std::string& path);
std::string join_path(const std::string& dir, const std::string& name);

}  // namespace rotary::lab
