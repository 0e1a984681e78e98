// lab/tasks/bpe_vocab.h: the text task's vocabulary, a sentencepiece BPE model kept in the task's cache.
// Internal to rotary_tasks, its tests and fuzz targets: the parts that read bytes (the .vocab file, spm_encode's
// output) are here, apart from the cache logic, so they can be checked on any input.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tasks/task.h"

namespace rotary::lab {

// What encoding hints at when the sentencepiece programs are missing.
inline constexpr const char* kSpmHint =
    "the sentencepiece programs spm_train and spm_encode (apt-get install sentencepiece)";

// `spm_encode --output_format=id` of a file (run as a program): one line of ids per input line, concatenated.
std::vector<int32_t> spm_encode_file(const std::filesystem::path& model, const std::filesystem::path& input,
                                     int vocab_size);

// The ids printed by `spm_encode --output_format=id` (whitespace-separated decimal numbers), each checked to be
// in [0, vocab_size); anything else is a rotary::Error naming it.
std::vector<int32_t> parse_spm_ids(const std::string& spm_output, int vocab_size);

class BpeVocab final : public Vocab {
 public:
  // model: the .model file (for encoding); vocab_text: the .vocab file ("piece<TAB>score" per id, in id order,
  // <unk> <s> </s> <pad> first). A malformed table is a rotary::Error.
  BpeVocab(std::filesystem::path model, const std::string& vocab_text);
  int size() const override { return int(pieces_.size()); }
  // Runs `spm_encode`; each line is encoded on its own (as the corpus verses are) and the ids are concatenated.
  std::vector<int32_t> encode(const std::string& text) const override;
  // As sentencepiece decodes: pieces joined, U+2581 -> ' ', <0xNN> byte pieces -> that byte, <unk> -> " \u2047 ",
  // control pieces (<s>, </s>, <pad>) dropped, and the space sentencepiece put before the first word removed.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t pad_id() const override { return 3; }

 private:
  std::filesystem::path model_;
  std::vector<std::string> pieces_;
  std::vector<int> byte_of_;  // per id: the byte a <0xNN> piece stands for, or -1 for a text piece
};

}  // namespace rotary::lab
