// tokenizers/src/tokenizer.cpp: load_tokenizer (which file of a model directory is read, and tokenizer_config.json
// on top of it), encode_for_model, and the UTF-8 helpers both tokenizers use.
#include <iterator>
#include <nlohmann/json.hpp>

#include "rotary/error.h"
#include "rotary/gguf.h"
#include "rotary/hf_config.h"
#include "rotary/files.h"
#include "rotary/json_guard.h"
#include "tokenizer_parts.h"

namespace rotary::tokenizers {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_whole_file(const fs::path& path) { return read_regular_file(path.string(), "tokenizer file"); }

}  // namespace

std::vector<int64_t> Tokenizer::encode_for_model(std::string_view text) const {
  std::vector<int64_t> ids;
  if (add_bos) {
    check(bos_id.has_value(), "add_bos", "true without a bos_id", "a BOS token (tokenizer_config.json bos_token)");
    ids.push_back(*bos_id);
  }
  const std::vector<int64_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  if (add_eos) {
    check(eos_id.has_value(), "add_eos", "true without an eos_id", "an EOS token (tokenizer_config.json eos_token)");
    ids.push_back(*eos_id);
  }
  return ids;
}

void apply_tokenizer_config(Tokenizer& tokenizer, std::string_view json_text, const std::string& source) {
  const json config = parse_json(json_text, source);
  if (!config.is_object()) fail(source, json_excerpt(config), "a JSON object");
  for (const char* key : {"add_bos_token", "add_eos_token"}) {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_boolean()) fail(source + ": " + key, json_excerpt(*it), "true or false");
    (std::string(key) == "add_bos_token" ? tokenizer.add_bos : tokenizer.add_eos) = it->get<bool>();
  }
  for (const char* key : {"bos_token", "eos_token"}) {
    const std::optional<std::string> text = hf_special_token(config, key, source);
    if (!text) continue;
    const std::optional<int64_t> id = tokenizer.token_id(*text);
    if (!id) fail(source + ": " + key, "\"" + *text + "\"", "a token of the vocabulary or an added token");
    (std::string(key) == "bos_token" ? tokenizer.bos_id : tokenizer.eos_id) = id;
  }
}

std::string Tokenizer::decode_continuation(const std::vector<int64_t>& prefix,
                                           const std::vector<int64_t>& continuation) const {
  std::vector<int64_t> all = prefix;
  all.insert(all.end(), continuation.begin(), continuation.end());
  const std::string whole = decode(all), head = decode(prefix);
  if (whole.compare(0, head.size(), head) == 0) return whole.substr(head.size());
  return decode(continuation);
}

std::unique_ptr<Tokenizer> load_tokenizer(const fs::path& model_dir) {
  std::error_code ec;
  if (model_dir.extension() == ".gguf" && !fs::is_directory(model_dir, ec))
    return gguf_tokenizer(GgufFile::open(model_dir.string()));
  const fs::path json_path = model_dir / "tokenizer.json";
  const fs::path model_path = model_dir / "tokenizer.model";
  const fs::path config_path = model_dir / "tokenizer_config.json";
  std::unique_ptr<Tokenizer> tokenizer;
  // A name that is there but is not a regular file (a directory, a FIFO) is refused by read_whole_file, not
  // passed over for the next file.
  const auto present = [](const fs::path& p) {
    std::error_code ec;
    return fs::exists(p, ec);
  };
  if (present(json_path)) {
    tokenizer = parse_tokenizer_json(read_whole_file(json_path), json_path.string());
  } else if (present(model_path)) {
    tokenizer = parse_sentencepiece_model(read_whole_file(model_path), model_path.string());
  } else {
    fail("tokenizer directory", model_dir.string(), "a directory with tokenizer.json or tokenizer.model (no "
                                                    "tokenizer.json or tokenizer.model in it)");
  }
  if (present(config_path))
    apply_tokenizer_config(*tokenizer, read_whole_file(config_path), config_path.string());
  return tokenizer;
}

size_t utf8_char_length(std::string_view text, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  size_t length;
  char32_t min_value;
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, min_value = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, min_value = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, min_value = 0x10000;
  } else {
    return 0;
  }
  if (text.size() - at < length) return 0;
  for (size_t i = 1; i < length; ++i)
    if ((byte(at + i) & 0xC0) != 0x80) return 0;
  const char32_t value = utf8_code_point(text, at, length);
  if (value < min_value || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return 0;
  return length;
}

char32_t utf8_code_point(std::string_view text, size_t at, size_t length) {
  const auto byte = [&](size_t i) { return char32_t(static_cast<unsigned char>(text[at + i])); };
  switch (length) {
    case 1: return byte(0);
    case 2: return (byte(0) & 0x1F) << 6 | (byte(1) & 0x3F);
    case 3: return (byte(0) & 0x0F) << 12 | (byte(1) & 0x3F) << 6 | (byte(2) & 0x3F);
    default: return (byte(0) & 0x07) << 18 | (byte(1) & 0x3F) << 12 | (byte(2) & 0x3F) << 6 | (byte(3) & 0x3F);
  }
}

void check_utf8(std::string_view text, std::string_view field) {
  for (size_t at = 0; at < text.size();) {
    const size_t length = utf8_char_length(text, at);
    if (length == 0) fail(field, "text with a malformed UTF-8 sequence at byte " + std::to_string(at), "UTF-8 text");
    at += length;
  }
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(char(c));
  } else if (c < 0x800) {
    out.push_back(char(0xC0 | (c >> 6)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(char(0xE0 | (c >> 12)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (c >> 18)));
    out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  }
}

std::string byte_token_name(unsigned char byte) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string("<0x") + kHex[byte >> 4] + kHex[byte & 15] + ">";
}

int byte_token_value(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  const auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int high = hex(token[3]), low = hex(token[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

}  // namespace rotary::tokenizers
