// lab/tasks/text_task.cpp: language modelling on the KJV Bible with a sentencepiece BPE vocabulary.
//
// Cache (<cache_dir>/kjv/, every file written under a temporary name and renamed, so a crash or a concurrent
// process never leaves a half-written file behind):
//   corpus_train.txt, corpus_heldout.txt   one verse per line (from `bible`, see kjv_corpus.h)
//   bpe<V>.model                           sentencepiece BPE trained on the training verses only
//   bpe<V>.{train,heldout}.ids             the token ids of each split, tagged with a hash of the model they
//                                          came from (a retrained model invalidates them)
// Training rows are random windows of seq_len + 1 tokens of the training split (loss on every token); held-out
// rows are consecutive windows of the held-out split.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <thread>
#include <unordered_map>

#include "rotary/error.h"
#include "tasks/char_task.h"
#include "tasks/kjv_corpus.h"
#include "tasks/random.h"
#include "tasks/text_cache.h"

namespace rotary::lab {
namespace {

namespace fs = std::filesystem;

class BpeVocab final : public Vocab {
 public:
  explicit BpeVocab(const std::string& serialized_model) {
    const auto status = processor_.LoadFromSerializedProto(serialized_model);
    if (!status.ok()) fail("text tokenizer", status.ToString(), "a sentencepiece model (delete the cached one)");
  }
  int size() const override { return processor_.GetPieceSize(); }
  std::vector<int32_t> encode(const std::string& text) const override {
    const std::vector<int> ids = processor_.EncodeAsIds(text);
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> kept;
    kept.reserve(ids.size());
    for (const int32_t id : ids) {
      check(id >= 0 && id < size(), "token id", id, "[0, " + std::to_string(size()) + ")");
      if (id != pad_id()) kept.push_back(id);
    }
    return processor_.DecodeIds(kept);
  }
  int32_t pad_id() const override { return processor_.pad_id(); }

 private:
  sentencepiece::SentencePieceProcessor processor_;
};

// Feeds the training verses to the trainer from memory.
class VerseIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit VerseIterator(const std::vector<std::string>& verses) : verses_(verses) {}
  bool done() const override { return i_ >= verses_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return verses_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& verses_;
  size_t i_ = 0;
};

std::string train_bpe(const std::vector<std::string>& verses, int vocab_size) {
  const unsigned threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  // unk 0, bos 1, eos 2, pad 3; all verses are used (31k lines train in seconds), so no sampling and the model
  // is the same on every run.
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},          {"vocab_size", std::to_string(vocab_size)},
      {"character_coverage", "1.0"},  {"pad_id", "3"},
      {"num_threads", std::to_string(threads)}, {"minloglevel", "2"},
      {"input_sentence_size", "0"},   {"max_sentence_length", "8192"}};
  VerseIterator it(verses);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  if (!status.ok())
    fail("text_vocab", std::to_string(vocab_size), "a size sentencepiece can train on the KJV (" +
                                                       status.ToString() + ")");
  return model;
}

std::vector<int32_t> tokenize(const Vocab& vocab, const std::vector<std::string>& verses) {
  std::vector<int32_t> ids;
  for (const std::string& verse : verses) {
    const std::vector<int32_t> v = vocab.encode(verse);  // each verse starts a word ("▁" prefix)
    ids.insert(ids.end(), v.begin(), v.end());
  }
  return ids;
}

class TextTask final : public Task {
 public:
  TextTask(const std::string& model, std::vector<int32_t> train, std::vector<int32_t> heldout)
      : vocab_(model), train_(std::move(train)), heldout_(std::move(heldout)) {}
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
  check(o.text_vocab >= 128 && o.text_vocab <= 32000, "text_vocab", o.text_vocab, "[128, 32000]");
  const fs::path dir = fs::path(resolve_cache_dir(o.cache_dir)) / "kjv";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cache_dir", dir.string(), "a directory we can create and write (" + ec.message() + ")");

  KjvSplit corpus;
  const fs::path train_txt = dir / "corpus_train.txt", heldout_txt = dir / "corpus_heldout.txt";
  if (fs::exists(train_txt) && fs::exists(heldout_txt)) {
    corpus.train = read_lines(train_txt);
    corpus.heldout = read_lines(heldout_txt);
  } else {
    corpus = parse_kjv(run_bible());
    write_atomically(train_txt, join_lines(corpus.train));
    write_atomically(heldout_txt, join_lines(corpus.heldout));
  }

  const std::string stem = "bpe" + std::to_string(o.text_vocab);
  const fs::path model_path = dir / (stem + ".model");
  std::string model;
  if (fs::exists(model_path)) {
    model = read_file(model_path);
  } else {
    model = train_bpe(corpus.train, o.text_vocab);
    write_atomically(model_path, model);
  }
  const uint64_t model_hash = fnv1a64(model);

  BpeVocab vocab(model);
  auto ids_for = [&](const char* split, const std::vector<std::string>& verses) {
    const fs::path path = dir / (stem + "." + split + ".ids");
    std::vector<int32_t> ids;
    if (fs::exists(path) && read_ids(path, model_hash, ids)) return ids;
    ids = tokenize(vocab, verses);
    write_ids(path, model_hash, ids);
    return ids;
  };
  std::vector<int32_t> train = ids_for("train", corpus.train);
  std::vector<int32_t> heldout = ids_for("heldout", corpus.heldout);
  return std::make_unique<TextTask>(model, std::move(train), std::move(heldout));
}

}  // namespace rotary::lab
