// Fuzz target: a saved context's manifest (engine/src/saved_context.h parse_manifest, which open_context runs on
// <dir>/context.json before it reads any layer file; a directory a user points `rotary generate --context` at,
// possibly damaged or crafted). Any bytes: a parsed manifest or a rotary::Error naming the field, never a crash, a
// hang or a read past the text. A manifest that parses is checked for what open_context relies on: layer files'
// names only (no path, no temporary file, not the manifest), no negative size.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "rotary/error.h"
#include "saved_context.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const rotary::engine::detail::ContextManifest m = rotary::engine::detail::parse_manifest(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz/context.json");
    for (const rotary::engine::detail::ContextFile& f : m.files)
      if (f.bytes < 0 || f.name.find('/') != std::string::npos || f.name == "context.json" ||
          !rotary::engine::detail::is_context_file_name(f.name))
        __builtin_trap();
    if (m.layers < 1 || m.tokens < 1) __builtin_trap();
  } catch (const rotary::Error&) {
  }
  return 0;
}
