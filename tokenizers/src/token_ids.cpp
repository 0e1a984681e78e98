// tokenizers/src/token_ids.cpp: read_token_id_file, the way in for users whose checkpoint has no tokenizer we
// support: they tokenize elsewhere and hand us the ids as text.
#include <cctype>

#include "rotary/error.h"
#include "rotary/files.h"
#include "rotary/parse_number.h"
#include "rotary_tokenizers/tokenizer.h"

namespace rotary::tokenizers {

std::vector<int64_t> read_token_id_file(const std::filesystem::path& path, int64_t vocab_size) {
  check(vocab_size > 0, "vocab_size", vocab_size, "at least 1");
  const std::string text = read_regular_file(path.string(), "token id file");
  const std::string allowed = "decimal token ids in [0, " + std::to_string(vocab_size) + ") separated by whitespace";
  std::vector<int64_t> ids;
  size_t line = 1;
  for (size_t at = 0; at < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[at]);
    if (std::isspace(c)) {
      line += c == '\n';
      ++at;
      continue;
    }
    size_t end = at;
    while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
    const std::string where = path.string() + ": token " + std::to_string(ids.size() + 1) + " (line " +
                              std::to_string(line) + ")";
    // A token ends at whitespace only: "3<NUL>" is one token, refused whole (its NUL escaped in the message).
    ids.push_back(parse_integer(std::string_view(text).substr(at, end - at), where, 0, vocab_size - 1, allowed));
    at = end;
  }
  return ids;
}

}  // namespace rotary::tokenizers
