// lab/tasks/char_vocab.h: the character vocabulary of the algorithmic tasks (one token per character).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tasks/task.h"

namespace rotary::lab {

// Id 0 is the pad token; the alphabet's characters are ids 1..n in the order given.
class CharVocab final : public Vocab {
 public:
  explicit CharVocab(std::string alphabet);  // distinct characters; throws rotary::Error on a repeat
  int size() const override { return static_cast<int>(alphabet_.size()) + 1; }
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t pad_id() const override { return 0; }
  const std::string& alphabet() const { return alphabet_; }

 private:
  std::string alphabet_;
  std::array<int32_t, 256> id_of_{};  // 0 = not in the alphabet
};

// How an error message shows a character: 'x' when printable, else "\xNN".
std::string describe_char(char c);

}  // namespace rotary::lab
