// lab/tasks/text_task.cpp: language modelling on the KJV Bible, tokenized by sentencepiece: BPE (text_tokenizer
// "bpe", text_vocab pieces) or one token per character ("char": sentencepiece's char model, so both share the
// normalization, the cache and the decoding below).
//
// Cache (<cache_dir>/kjv/, every file written under a temporary name and renamed, so a crash or a concurrent
// process never leaves a half-written file behind):
//   corpus_train.txt, corpus_heldout.txt   one verse per line (from `bible`, see kjv_corpus.h)
//   bpe<V>.model, bpe<V>.vocab             sentencepiece BPE trained on the training verses only (`spm_train`)
//   char.model, char.vocab                 the char model: every character of the training verses
//   <stem>.{train,heldout}.ids             the token ids of each split, tagged with a hash of the model they
//                                          came from (a retrained model invalidates them)
// Training rows are random windows of seq_len + 1 tokens of the training split (loss on every token); held-out
// rows are consecutive windows of the held-out split.
//
// sentencepiece runs as the `spm_train` / `spm_encode` programs, never in this process (common/process.h says why);
// decoding needs only the piece table of bpe<V>.vocab (bpe_vocab.h).
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <thread>

#include "common/process.h"
#include "rotary/error.h"
#include "tasks/bpe_vocab.h"
#include "tasks/char_task.h"
#include "tasks/kjv_corpus.h"
#include "tasks/random.h"
#include "tasks/text_cache.h"

namespace rotary::lab {
namespace {

namespace fs = std::filesystem;

// Trains the tokenizer on the training verses with `spm_train` into <dir>/<stem>.{model,vocab}. All verses are
// used (31k lines train in seconds), so no sampling and the model is the same on every run. The two files are
// renamed into place vocab first, model last: the model's presence means both are complete. vocab_size 0: the
// char model, which takes every character it sees (a soft limit far above the KJV's ~70 characters).
void train_tokenizer(const fs::path& train_txt, const fs::path& dir, const std::string& stem, int vocab_size) {
  const unsigned threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  const std::string tmp = (dir / (stem + ".tmp." + std::to_string(getpid()))).string();
  // unk 0, bos 1, eos 2, pad 3.
  run_command_or_fail("text_vocab",
                      {"spm_train", "--input=" + train_txt.string(), "--model_prefix=" + tmp,
                       vocab_size > 0 ? "--model_type=bpe" : "--model_type=char",
                       "--vocab_size=" + std::to_string(vocab_size > 0 ? vocab_size : 4096),
                       vocab_size > 0 ? "--hard_vocab_limit=true" : "--hard_vocab_limit=false",
                       "--character_coverage=1.0", "--pad_id=3",
                       "--num_threads=" + std::to_string(threads), "--input_sentence_size=0",
                       "--max_sentence_length=8192", "--minloglevel=2"},
                      "a vocabulary size sentencepiece can train on the KJV, and " + std::string(kSpmHint));
  std::error_code ec;
  fs::rename(tmp + ".vocab", dir / (stem + ".vocab"), ec);
  if (!ec) fs::rename(tmp + ".model", dir / (stem + ".model"), ec);
  if (ec) {
    fs::remove(tmp + ".vocab", ec);
    fs::remove(tmp + ".model", ec);
    fail("cache_dir", dir.string(), "a directory we can rename files in");
  }
}

class TextTask final : public Task {
 public:
  TextTask(BpeVocab vocab, std::vector<int32_t> train, std::vector<int32_t> heldout)
      : vocab_(std::move(vocab)), train_(std::move(train)), heldout_(std::move(heldout)) {}
  std::string name() const override { return "text"; }
  const Vocab& vocab() const override { return vocab_; }
  std::string stop() const override { return ""; }
  std::vector<EvalProblem> eval_problems(int n, uint64_t) const override {
    check(n >= 0, "eval problems n", n, ">= 0");
    return {};
  }

  TrainSequence train_sequence(std::mt19937_64& rng, int seq_len) const override {
    check_window(seq_len, train_.size(), "training");
    const size_t row = size_t(seq_len) + 1;
    return window(train_, uniform_below(rng, train_.size() - row + 1), row);
  }
  int64_t heldout_rows(int seq_len) const override {
    check_window(seq_len, heldout_.size(), "held-out");
    return int64_t(heldout_.size() / (size_t(seq_len) + 1));
  }
  TrainSequence heldout_sequence(uint64_t, int index, int seq_len) const override {
    check(index >= 0, "heldout index", index, ">= 0");
    const size_t row = size_t(seq_len) + 1;
    return window(heldout_, size_t(index % heldout_rows(seq_len)) * row, row);
  }

 private:
  static void check_window(int seq_len, size_t tokens, const char* split) {
    check_seq_len(seq_len);
    check(size_t(seq_len) + 1 <= tokens, "seq_len", seq_len,
          "< the " + std::string(split) + " split's " + std::to_string(tokens) + " tokens");
  }
  static TrainSequence window(const std::vector<int32_t>& ids, size_t start, size_t row) {
    TrainSequence s;
    s.tokens.assign(ids.begin() + std::ptrdiff_t(start), ids.begin() + std::ptrdiff_t(start + row));
    s.loss_mask.assign(row - 1, 1.0f);
    return s;
  }
  BpeVocab vocab_;
  std::vector<int32_t> train_, heldout_;
};

}  // namespace

std::unique_ptr<Task> make_text_task(const TaskOptions& o) {
  const fs::path dir = fs::path(resolve_cache_dir(o.cache_dir)) / "kjv";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cache_dir", dir.string(), "a directory we can create and write (" + ec.message() + ")");

  const fs::path train_txt = dir / "corpus_train.txt", heldout_txt = dir / "corpus_heldout.txt";
  if (!fs::exists(train_txt) || !fs::exists(heldout_txt)) {
    const KjvSplit corpus = parse_kjv(run_bible());
    write_file_atomic(train_txt, join_lines(corpus.train), Durability::Cache);
    write_file_atomic(heldout_txt, join_lines(corpus.heldout), Durability::Cache);
  }

  const bool chars = o.text_tokenizer == "char";
  if (!chars && o.text_tokenizer != "bpe") fail("text_tokenizer", o.text_tokenizer, "bpe or char");
  const std::string stem = chars ? "char" : "bpe" + std::to_string(o.text_vocab);
  const fs::path model_path = dir / (stem + ".model"), vocab_path = dir / (stem + ".vocab");
  if (!fs::exists(model_path) || !fs::exists(vocab_path))
    train_tokenizer(train_txt, dir, stem, chars ? 0 : o.text_vocab);
  const uint64_t model_hash = fnv1a64(read_file(model_path));
  BpeVocab vocab(model_path, read_file(vocab_path));
  if (chars)
    check(vocab.size() >= 16 && vocab.size() <= 4096, "cached tokenizer " + vocab_path.string(), vocab.size(),
          "16..4096 pieces (delete the cached char files)");
  else
    check(vocab.size() == o.text_vocab, "cached tokenizer " + vocab_path.string(), vocab.size(),
          std::to_string(o.text_vocab) + " pieces (delete the cached bpe files)");

  auto ids_for = [&](const char* split, const fs::path& verses) {
    const fs::path path = dir / (stem + "." + split + ".ids");
    std::vector<int32_t> ids;
    if (fs::exists(path) && read_ids(path, model_hash, ids)) return ids;
    ids = spm_encode_file(model_path, verses, vocab.size());  // each verse starts a word ("\u2581" prefix)
    write_ids(path, model_hash, ids);
    return ids;
  };
  std::vector<int32_t> train = ids_for("train", train_txt);
  std::vector<int32_t> heldout = ids_for("heldout", heldout_txt);
  return std::make_unique<TextTask>(std::move(vocab), std::move(train), std::move(heldout));
}

}  // namespace rotary::lab
