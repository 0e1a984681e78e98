// engine/src/saved_context.h (internal): a saved context as one unit (Session::save_context / open_context).
//
// A context directory holds each layer's files (layer<i>.kv, or layer<i>.memory / .window, and layer<i>.search
// where the search keeps what it built), the tokens' ids (tokens.ids) and the manifest `context.json`, written last: the save's id, the model by
// content (Model::weights_hash, its matrix format and activations), the settings that shaped the rows, and every
// file with its size and content hash. Each layer file's own fingerprint binds it to its save and its layer, so a
// file of another save or another layer is refused by the file's check as well as by the manifest's. A save holds
// `context.lock` (flock) for its whole length, removes the manifest before it changes anything and every file of an
// earlier save after that: a save killed half-way leaves a directory without a manifest, which open refuses.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rotary::engine::detail {

inline constexpr const char* kContextManifest = "context.json";
inline constexpr const char* kContextLock = "context.lock";
// The tokens' ids (Session::tokens): the save's fingerprint for them (layer_fingerprint at layer -1), then the ids,
// int64 little-endian.
inline constexpr const char* kContextTokens = "tokens.ids";
inline constexpr int kContextFormatVersion = 1;

struct ContextFile {
  std::string name;  // in the directory: "layer3.kv"
  int64_t bytes = 0;
  uint64_t hash = 0;  // content_hash64 of the file's bytes
};

struct ContextManifest {
  uint64_t save_id = 0;
  std::string kind;             // "kv" (KV caches) or "memory" (a retrieval memory and its window)
  uint64_t weights_hash = 0;    // Model::weights_hash
  std::string weights, activations;  // the matrices' format and the activations' as run
  uint64_t settings = 0;        // the positions', caches' and memory's settings (Session's settings fingerprint)
  std::string settings_text;    // the same, for messages
  int64_t layers = 0, tokens = 0;
  std::vector<ContextFile> files;
};

// The lock a save holds (exclusive) and an open takes (shared) on <dir>/context.lock; both refuse at once, naming the
// holder's pid, when the other kind holds it. An open of a directory where the lock file cannot be made (read-only)
// goes without: a save cannot run there either.
class ContextLock {
 public:
  enum class Mode { Save, Open };
  ContextLock(const std::string& dir, Mode mode);
  ~ContextLock();
  ContextLock(const ContextLock&) = delete;
  ContextLock& operator=(const ContextLock&) = delete;

 private:
  int fd_ = -1;
};

// "<dir>/<name>"
std::string context_path(const std::string& dir, const std::string& name);
// Is `name` a file a save writes (layer<i>.kv / .memory / .window / .search, the manifest) or a temporary file a
// killed writer left of one (<that>.tmp.<pid>)?
bool is_context_file_name(const std::string& name);
// Removes the manifest (made durable first), then every other file is_context_file_name names.
void clear_context(const std::string& dir);
// An id no other save shares (random bits, the time and the pid).
uint64_t new_save_id();
// The fingerprint the file of `layer` carries: the model and settings (`context`), the save, the layer.
uint64_t layer_fingerprint(uint64_t context, uint64_t save_id, int64_t layer);
// The file's size and content hash, as the manifest records it.
ContextFile describe_context_file(const std::string& dir, const std::string& name);
void write_manifest(const std::string& dir, const ContextManifest& m);
// The manifest, every field checked (rotary::Error naming <dir>/context.json and the field); a directory without one
// is refused as "not a saved context, or a save that did not finish".
ContextManifest read_manifest(const std::string& dir);
// The checks of read_manifest on the manifest's text (`path` names it in messages): the one parser, fuzzed
// (fuzz/context_manifest_fuzzer.cpp).
ContextManifest parse_manifest(std::string_view text, const std::string& path);
// Every file the manifest names: a regular file of the recorded size and content hash (rotary::Error naming it).
void check_context_files(const std::string& dir, const ContextManifest& m);
// The bytes of the files the manifest names (what opening the context reads into RAM).
int64_t context_bytes(const ContextManifest& m);

}  // namespace rotary::engine::detail
