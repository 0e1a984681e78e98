// engine/src/saved_context.cpp: see saved_context.h.
#include "saved_context.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <regex>

#include <nlohmann/json.hpp>

#include "rotary/content_hash.h"
#include "rotary/error.h"
#include "rotary/files.h"
#include "rotary/json_guard.h"

namespace rotary::engine::detail {
namespace {

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// A hash field of the manifest: 16 hex digits.
uint64_t hex_field(const JsonObject& o, const char* key) {
  const std::string text = o.required_text(key);
  uint64_t v = 0;
  bool ok = text.size() == 16;
  for (char c : text) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    ok = ok && d >= 0;
    v = v * 16 + uint64_t(d < 0 ? 0 : d);
  }
  if (!ok) fail(o.path(key), text, "16 lowercase hex digits");
  return v;
}

// The pid written in the lock file by the save that holds it ("unknown" when it cannot be read).
std::string holder_of(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string pid = n > 0 ? std::string(buf, size_t(n)) : std::string();
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid.empty() ? "unknown" : pid;
}

}  // namespace

std::string context_path(const std::string& dir, const std::string& name) { return dir + "/" + name; }

ContextLock::ContextLock(const std::string& dir, Mode mode) {
  const std::string path = context_path(dir, kContextLock);
  const bool save = mode == Mode::Save;
  fd_ = ::open(path.c_str(), (save ? O_RDWR | O_CREAT : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd_ < 0) {
    if (!save) return;  // no lock file (a context copied without it, or a read-only directory): nothing to wait for
    fail("save_context " + path, std::strerror(errno), "a lock file the save can create in the directory");
  }
  if (::flock(fd_, (save ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
    const int e = errno;
    const std::string holder = holder_of(fd_);
    ::close(fd_);
    fd_ = -1;
    if (e == EWOULDBLOCK)
      fail(save ? "save_context " + dir : "open_context " + dir,
           save ? "in use (a save by pid " + holder + " writes it, or a run reads it now)"
                : "being written now by a save (pid " + holder + ")",
           save ? "a directory no other run saves to or reads from at the same time"
                : "a context whose save has finished");
    fail((save ? "save_context " : "open_context ") + path, std::strerror(e), "a lock file that can be locked");
  }
  if (save) {
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
      // (the pid is for messages only; the lock holds without it)
    }
  }
}

ContextLock::~ContextLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

bool is_context_file_name(const std::string& name) {
  static const std::regex pattern(R"((layer\d+\.(kv|memory|window|search)|context\.json|tokens\.ids)(\.tmp\.\d+)?)");
  return std::regex_match(name, pattern);
}

void clear_context(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string manifest = context_path(dir, kContextManifest);
  fs::remove(manifest, ec);
  check(!ec, "save_context " + manifest, ec.message(), "a manifest that can be removed");
  sync_directory_of(manifest, "save_context");  // the manifest is gone before any file it named changes
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (is_context_file_name(it->path().filename().string())) stale.push_back(it->path());
  check(!ec, "save_context " + dir, ec.message(), "a directory that can be listed");
  for (const fs::path& p : stale) {
    fs::remove(p, ec);
    check(!ec, "save_context " + p.string(), ec.message(), "an earlier save's file that can be removed");
  }
}

uint64_t new_save_id() {
  std::random_device random;
  uint64_t id = (uint64_t(random()) << 32) ^ uint64_t(random());
  id = content_hash_mix(id, uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
  id = content_hash_mix(id, uint64_t(std::chrono::system_clock::now().time_since_epoch().count()));
  return content_hash_mix(id, uint64_t(::getpid()));
}

uint64_t layer_fingerprint(uint64_t context, uint64_t save_id, int64_t layer) {
  return content_hash_mix(content_hash_mix(context, save_id), uint64_t(layer));
}

ContextFile describe_context_file(const std::string& dir, const std::string& name) {
  ContextFile f;
  f.name = name;
  f.hash = content_hash_file(context_path(dir, name), "save_context " + context_path(dir, name), &f.bytes);
  return f;
}

void write_manifest(const std::string& dir, const ContextManifest& m) {
  nlohmann::json files = nlohmann::json::array();
  for (const ContextFile& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"hash", hex(f.hash)}});
  const nlohmann::json j{{"format", "rotary saved context"},
                         {"version", kContextFormatVersion},
                         {"save_id", hex(m.save_id)},
                         {"kind", m.kind},
                         {"weights_hash", hex(m.weights_hash)},
                         {"weights", m.weights},
                         {"activations", m.activations},
                         {"settings", hex(m.settings)},
                         {"settings_text", m.settings_text},
                         {"layers", m.layers},
                         {"tokens", m.tokens},
                         {"files", files}};
  write_file_atomic(context_path(dir, kContextManifest), "save_context", j.dump(2) + "\n");
}

ContextManifest read_manifest(const std::string& dir) {
  const std::string path = context_path(dir, kContextManifest);
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
    fail("open_context " + dir, "no " + std::string(kContextManifest),
         "a directory saved by --save-context (Session::save_context) whose save finished: the manifest is written "
         "last, so a save that was killed or is still running has none");
  return parse_manifest(read_regular_file(path, "open_context " + path), path);
}

ContextManifest parse_manifest(std::string_view text, const std::string& path) {
  const nlohmann::json j = parse_json(text, path);
  const JsonObject o = JsonObject::of(j, path, "the manifest's JSON object");
  check(o.required_text("format") == "rotary saved context", o.path("format"), o.required_text("format"),
        "\"rotary saved context\"");
  o.required_integer("version", kContextFormatVersion, kContextFormatVersion);
  ContextManifest m;
  m.save_id = hex_field(o, "save_id");
  m.kind = o.required_text("kind");
  check(m.kind == "kv" || m.kind == "memory", o.path("kind"), m.kind, "kv, memory");
  m.weights_hash = hex_field(o, "weights_hash");
  m.weights = o.required_text("weights");
  m.activations = o.required_text("activations");
  m.settings = hex_field(o, "settings");
  m.settings_text = o.required_text("settings_text");
  m.layers = o.required_integer("layers", 1, 1024);
  m.tokens = o.required_integer("tokens", 1, int64_t(1) << 53);
  const nlohmann::json* files = o.find("files");
  if (!files || !files->is_array()) fail(o.path("files"), files ? json_excerpt(*files) : "(missing)", "a list of files");
  for (size_t i = 0; i < files->size(); ++i) {
    const JsonObject f = JsonObject::of((*files)[i], o.path("files") + "[" + std::to_string(i) + "]");
    ContextFile cf;
    cf.name = f.required_text("name");
    check(is_context_file_name(cf.name) && cf.name != kContextManifest && cf.name.find(".tmp.") == std::string::npos,
          f.path("name"), cf.name, "a context file's name (layer<i>.kv, .memory, .window, .search; tokens.ids)");
    for (const ContextFile& earlier : m.files)
      check(earlier.name != cf.name, f.path("name"), cf.name, "a file the manifest names once");
    cf.bytes = f.required_integer("bytes", 0);
    cf.hash = hex_field(f, "hash");
    m.files.push_back(std::move(cf));
  }
  return m;
}

void check_context_files(const std::string& dir, const ContextManifest& m) {
  for (const ContextFile& f : m.files) {
    const std::string path = context_path(dir, f.name);
    ContextFile now;
    now.hash = content_hash_file(path, "open_context " + path, &now.bytes);
    check(now.bytes == f.bytes, "open_context " + path, std::to_string(now.bytes) + " bytes",
          std::to_string(f.bytes) + " bytes, as " + kContextManifest + " records (the file changed since the save)");
    check(now.hash == f.hash, "open_context " + path, "content hash " + hex(now.hash),
          "content hash " + hex(f.hash) + ", as " + kContextManifest +
              " records (the file was changed, damaged or swapped for another since the save)");
  }
}

int64_t context_bytes(const ContextManifest& m) {
  int64_t total = 0;
  for (const ContextFile& f : m.files) total += f.bytes;
  return total;
}

}  // namespace rotary::engine::detail
