// tokenizers/src/tokenizer_parts.h: what the tokenizer files share inside rotary_tokenizers, and the parsers from
// bytes that load_tokenizer calls after reading the files (the fuzz targets and the tests call them directly).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rotary_tokenizers/tokenizer.h"

namespace rotary::tokenizers {

// U+2581 LOWER ONE EIGHTH BLOCK: sentencepiece's visible space.
inline constexpr std::string_view kSpaceMark = "\xe2\x96\x81";

// tokenizer.json text -> its tokenizer. `source` names the file in errors.
std::unique_ptr<Tokenizer> parse_tokenizer_json(std::string_view json_text, const std::string& source);

// What a tokenizer.json tokenizer hands its BPE model for `text` (tests look at pre-tokenization through this):
// the pieces after added tokens, normalizer and pre-tokenizer, as the model sees them (byte-level pieces in GPT-2's
// byte characters), an added token as its own text. rotary::Error for a tokenizer not from parse_tokenizer_json.
std::vector<std::string> json_pre_tokens(const Tokenizer& tokenizer, std::string_view text);

// tokenizer.model bytes (a serialized sentencepiece ModelProto) -> its tokenizer. `source` names the file.
std::unique_ptr<Tokenizer> parse_sentencepiece_model(std::string_view model_bytes, const std::string& source);

// A sentencepiece BPE vocabulary given as arrays, as a GGUF file's "llama" tokenizer holds it (gguf_tokenizer.cpp):
// pieces with their scores and types (sentencepiece's numbering: 1 NORMAL, 2 UNKNOWN, 3 CONTROL, 4 USER_DEFINED,
// 5 UNUSED, 6 BYTE), the normalizer's two switches, byte fallback, and the BOS / EOS ids (-1: none).
struct SentencePieceVocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<int32_t> types;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = false;
  bool byte_fallback = false;
  int64_t bos_id = -1, eos_id = -1;
  // CONTROL and UNKNOWN pieces written in the text are their ids (llama.cpp's parse_special, and what the model's
  // tokenizer.json does with them as added tokens); a tokenizer.model leaves them as text, as sentencepiece does.
  bool special_in_text = false;
};
// The same tokenizer as parse_sentencepiece_model makes of a ModelProto with these pieces and settings, and the
// same checks (an UNKNOWN piece, the 256 byte pieces with byte_fallback, ...). `source` names the vocabulary.
std::unique_ptr<Tokenizer> sentencepiece_from_vocab(const SentencePieceVocab& vocab, const std::string& source);

// tokenizer_config.json text applied to a loaded tokenizer: add_bos_token / add_eos_token (booleans) and
// bos_token / eos_token (a string, an object with "content", or null) looked up with token_id.
void apply_tokenizer_config(Tokenizer& tokenizer, std::string_view json_text, const std::string& source);

// Length in bytes of the well-formed UTF-8 character starting at text[at], or 0 if there is none there
// (a stray continuation byte, a truncated sequence, an overlong form, a surrogate, a value above U+10FFFF).
size_t utf8_char_length(std::string_view text, size_t at);

// rotary::Error naming `field` and the byte offset of the first malformed sequence, unless `text` is UTF-8.
void check_utf8(std::string_view text, std::string_view field);

// The code point of the well-formed character at text[at] of length `length` (utf8_char_length).
char32_t utf8_code_point(std::string_view text, size_t at, size_t length);

// Appends `code_point` (at most U+10FFFF) as UTF-8.
void append_utf8(std::string& out, char32_t code_point);

// "<0xNN>" (upper-case hex, as both libraries name byte tokens) for `byte`.
std::string byte_token_name(unsigned char byte);

// The byte a "<0xNN>" token stands for (either case of hex digit), or -1 for any other token.
int byte_token_value(std::string_view token);

}  // namespace rotary::tokenizers
