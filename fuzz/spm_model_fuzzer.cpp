// Fuzz target: a tokenizer.model (a serialized sentencepiece ModelProto, possibly truncated or crafted) parsed by
// parse_sentencepiece_model: every length and varint must be checked against the buffer (ASan sees a read past
// it). A model that loads encodes and decodes a fixed text.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "rotary/error.h"
#include "tokenizer_parts.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto tokenizer =
        rotary::tokenizers::parse_sentencepiece_model(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    const std::vector<int64_t> ids = tokenizer->encode("  Hello  world\n caf\xc3\xa9 \xf0\x9f\x98\x80 ");
    (void)tokenizer->decode(ids);
  } catch (const rotary::Error&) {
  }
  return 0;
}
