// lab/tasks/bpe_vocab.cpp: the text task's BPE vocabulary: the piece table read from the cached .vocab file,
// encoding through `spm_encode`, decoding here.
#include "tasks/bpe_vocab.h"

#include <unistd.h>

#include <atomic>
#include <sstream>

#include "common/process.h"
#include "rotary/error.h"
#include "tasks/text_cache.h"

namespace rotary::lab {
namespace {

namespace fs = std::filesystem;

constexpr const char* kWordMark = "\xe2\x96\x81";  // U+2581, sentencepiece's space

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte a sentencepiece byte piece "<0xNN>" stands for; -1 for any other piece, which decodes as its text.
int byte_piece_value(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  const int high = hex_digit(piece[3]), low = hex_digit(piece[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

}  // namespace

std::vector<int32_t> parse_spm_ids(const std::string& spm_output, int vocab_size) {
  std::vector<int32_t> ids;
  std::istringstream in(spm_output);
  for (long long id; in >> id;) {
    check(id >= 0 && id < vocab_size, "spm_encode output id", id, "[0, " + std::to_string(vocab_size) + ")");
    ids.push_back(int32_t(id));
  }
  check(in.eof(), "spm_encode output", "a non-numeric token", "space-separated token ids");
  return ids;
}

std::vector<int32_t> spm_encode_file(const fs::path& model, const fs::path& input, int vocab_size) {
  const std::string out = run_command_or_fail(
      "text tokenizer", {"spm_encode", "--model=" + model.string(), "--output_format=id", "--minloglevel=2"}, kSpmHint,
      input.string());
  return parse_spm_ids(out, vocab_size);
}

BpeVocab::BpeVocab(fs::path model, const std::string& vocab_text) : model_(std::move(model)) {
  std::istringstream in(vocab_text);
  for (std::string line; std::getline(in, line);) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) fail("text tokenizer vocabulary", line.substr(0, 40), "\"piece<TAB>score\" lines");
    pieces_.push_back(line.substr(0, tab));
    byte_of_.push_back(byte_piece_value(pieces_.back()));
  }
  check(pieces_.size() > 4 && pieces_[0] == "<unk>" && pieces_[3] == "<pad>", "text tokenizer vocabulary",
        std::to_string(pieces_.size()) + " pieces", "<unk> <s> </s> <pad> first (delete the cached bpe files)");
}

std::vector<int32_t> BpeVocab::encode(const std::string& text) const {
  static std::atomic<unsigned> counter{0};
  const fs::path tmp = fs::temp_directory_path() /
                       ("rotary-encode." + std::to_string(getpid()) + "." + std::to_string(counter++) + ".txt");
  write_file_atomic(tmp, text + "\n", Durability::Cache);
  std::vector<int32_t> ids;
  try {
    ids = spm_encode_file(model_, tmp, size());
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
  std::error_code ignored;
  fs::remove(tmp, ignored);
  return ids;
}

std::string BpeVocab::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (const int32_t id : ids) {
    check(id >= 0 && id < size(), "token id", id, "[0, " + std::to_string(size()) + ")");
    const std::string& piece = pieces_[size_t(id)];
    if (id == 1 || id == 2 || id == pad_id()) continue;
    if (id == 0) {
      text += " \xe2\x81\x87 ";
    } else if (byte_of_[size_t(id)] >= 0) {
      text.push_back(char(byte_of_[size_t(id)]));
    } else {
      for (size_t at = 0; at < piece.size();) {
        if (piece.compare(at, 3, kWordMark) == 0) {
          text.push_back(' ');
          at += 3;
        } else {
          text.push_back(piece[at++]);
        }
      }
    }
  }
  if (!ids.empty() && !text.empty() && text[0] == ' ' && ids[0] > 3 &&
      pieces_[size_t(ids[0])].rfind(kWordMark, 0) == 0)
    text.erase(0, 1);
  return text;
}

}  // namespace rotary::lab
