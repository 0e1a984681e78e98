// Fuzz target: a tokenizer.json (a checkpoint's file, possibly crafted) parsed by parse_tokenizer_json, then used.
// A file is either refused with a rotary::Error or loaded; a loaded tokenizer encodes a fixed text and the file's
// own bytes (as text where they are UTF-8) and decodes what it made, refusing only with a rotary::Error too.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rotary/error.h"
#include "tokenizer_parts.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const auto tokenizer = rotary::tokenizers::parse_tokenizer_json(bytes, "fuzz");
    for (const std::string_view text : {std::string_view("Hello  world\n\nit's 12345 caf\xc3\xa9 <s>!"), bytes}) {
      try {
        const std::vector<int64_t> ids = tokenizer->encode_for_model(text);
        (void)tokenizer->decode(ids);
      } catch (const rotary::Error&) {
      }
    }
  } catch (const rotary::Error&) {
  }
  return 0;
}
