// lab/tasks/text_cache.h: the file cache of the text task (corpus, tokenizer, token ids). Internal.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/files.h"

namespace rotary::lab {

// `configured` if not empty, else $XDG_CACHE_HOME/rotary, else $HOME/.cache/rotary; throws if none is known.
std::string resolve_cache_dir(const std::string& configured);

// Files go through common/files.h (read_file, write_file_atomic with Durability::Cache, fnv1a64).
std::vector<std::string> read_lines(const std::filesystem::path& path);
std::string join_lines(const std::vector<std::string>& lines);  // each line followed by '\n'

// Token ids with a header: magic "RTIDS001", the hash of the model that made them, the count; then int32s
// (little-endian, as the host). read_ids returns false for a missing, truncated or other-model file.
void write_ids(const std::filesystem::path& path, uint64_t model_hash, const std::vector<int32_t>& ids);
bool read_ids(const std::filesystem::path& path, uint64_t model_hash, std::vector<int32_t>& ids);
// read_ids on the file's bytes: false (and `ids` untouched) unless they are exactly a header for `model_hash`
// and the count of ids it announces.
bool parse_ids(const std::string& bytes, uint64_t model_hash, std::vector<int32_t>& ids);

}  // namespace rotary::lab
