// lab/tasks/text_cache.cpp: files of the text task's cache, written atomically.
#include "tasks/text_cache.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "rotary/error.h"

namespace rotary::lab {

namespace fs = std::filesystem;

std::string resolve_cache_dir(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return (fs::path(xdg) / "rotary").string();
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return (fs::path(home) / ".cache" / "rotary").string();
  fail("cache_dir", "\"\"", "a directory (neither XDG_CACHE_HOME nor HOME is set)");
}

std::vector<std::string> read_lines(const fs::path& path) {
  std::istringstream in(read_file(path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) out.append(line).push_back('\n');
  return out;
}

namespace {
constexpr char kMagic[8] = {'R', 'T', 'I', 'D', 'S', '0', '0', '1'};
constexpr size_t kHeader = sizeof(kMagic) + 2 * sizeof(uint64_t);
}  // namespace

void write_ids(const fs::path& path, uint64_t model_hash, const std::vector<int32_t>& ids) {
  std::string bytes(kHeader + ids.size() * sizeof(int32_t), '\0');
  const uint64_t count = ids.size();
  std::memcpy(bytes.data(), kMagic, sizeof(kMagic));
  std::memcpy(bytes.data() + 8, &model_hash, 8);
  std::memcpy(bytes.data() + 16, &count, 8);
  if (!ids.empty()) std::memcpy(bytes.data() + kHeader, ids.data(), ids.size() * sizeof(int32_t));
  write_file_atomic(path, bytes, Durability::Cache);
}

bool read_ids(const fs::path& path, uint64_t model_hash, std::vector<int32_t>& ids) {
  return parse_ids(read_file(path), model_hash, ids);
}

bool parse_ids(const std::string& bytes, uint64_t model_hash, std::vector<int32_t>& ids) {
  if (bytes.size() < kHeader || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return false;
  uint64_t hash = 0, count = 0;
  std::memcpy(&hash, bytes.data() + 8, 8);
  std::memcpy(&count, bytes.data() + 16, 8);
  // The count is compared with the bytes there are, not multiplied: count * 4 wraps for counts >= 2^62, and a
  // wrapped size that matched would make us allocate 2^62 ids.
  if (hash != model_hash || count != (bytes.size() - kHeader) / sizeof(int32_t) ||
      (bytes.size() - kHeader) % sizeof(int32_t) != 0)
    return false;
  ids.resize(count);
  if (count > 0) std::memcpy(ids.data(), bytes.data() + kHeader, count * sizeof(int32_t));
  return true;
}

}  // namespace rotary::lab
