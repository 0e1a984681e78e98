// lab/tasks/char_vocab.cpp: character <-> id for the algorithmic tasks.
#include "tasks/char_vocab.h"

#include <cstdio>

#include "rotary/error.h"

namespace rotary::lab {

std::string describe_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f) return std::string("'") + c + "'";
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\x%02x", u);
  return buf;
}

CharVocab::CharVocab(std::string alphabet) : alphabet_(std::move(alphabet)) {
  for (size_t i = 0; i < alphabet_.size(); ++i) {
    int32_t& id = id_of_[static_cast<unsigned char>(alphabet_[i])];
    check(id == 0, "vocabulary character", describe_char(alphabet_[i]), "each character once");
    id = static_cast<int32_t>(i) + 1;
  }
}

std::vector<int32_t> CharVocab::encode(const std::string& text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int32_t id = id_of_[static_cast<unsigned char>(text[i])];
    if (id == 0)
      fail("character", describe_char(text[i]) + " at offset " + std::to_string(i), "one of \"" + alphabet_ + "\"");
    ids[i] = id;
  }
  return ids;
}

std::string CharVocab::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (const int32_t id : ids) {
    check(id >= 0 && id < size(), "token id", id, "[0, " + std::to_string(size()) + ")");
    if (id != pad_id()) text.push_back(alphabet_[static_cast<size_t>(id) - 1]);
  }
  return text;
}

}  // namespace rotary::lab
