// lab/tasks/passkey.cpp: the pass-key retrieval test of Landmark Attention and InfLLM (issue 9's learnable
// retrieval task): a pass key of passkey_digits distinct random digits hidden at a random depth in repeated
// filler, asked for at the end.
//
//   "...the sun is yellow. here we go. the pass key is:71432. remember it. 71432 is the pass key. there and back
//    again. the grass is green. ... what is the pass key? the pass key is:71432#"
//
// Two changes from the anchors' wording make it a lookup a 2-layer character model learns in minutes: a ':' that
// occurs only before the key (in the needle and at the end of the question), so the first digit is found by the
// one character before it, and distinct digits, so each next digit is found by the one before it. With the
// anchors' " is " the cue shares its last four characters with the filler's "the sky is " and its last three with
// the other sentences, and a 2-layer model trained at 256 stayed at 0% after 1250 steps.
//
// The filler is the anchors' five sentences (lower-cased: one vocabulary of 40 characters) in their cycle, entered
// at a random sentence and cut at the front to the length asked for; the needle sits at a uniformly chosen
// sentence boundary, so its depth is uniform over the context. A training row is one problem of exactly
// seq_len + 1 characters with the loss on every character but the key's first occurrence (random digits, which
// nothing predicts): the filler repeats, so predicting it trains the copying heads a lookup is built from, and the
// key's second occurrence and the answer are lookups. An eval prompt has passkey_eval_len characters and ends at
// "the pass key is:"; the answer is the key, then '#'. One needle per prompt at any length, so the task runs from
// the training length to 512 times it (rotary memory) without the key space running out, as kv_retrieval's does.
#include <algorithm>
#include <string>
#include <vector>

#include "rotary/error.h"
#include "tasks/char_task.h"
#include "tasks/random.h"

namespace rotary::lab {
namespace {

constexpr const char* kSentences[] = {"the grass is green.", "the sky is blue.", "the sun is yellow.",
                                      "here we go.", "there and back again."};
constexpr int kSentenceCount = 5;
constexpr const char* kQuestion = "what is the pass key? the pass key is:";
constexpr const char* kDigits = "0123456789";

class PasskeyTask final : public CharTask {
 public:
  PasskeyTask(int digits, int eval_len)
      : CharTask("abcdefghijklmnopqrstuvwxyz0123456789 .?:#"), digits_(digits), eval_len_(eval_len) {
    check(eval_len >= overhead(), "passkey_eval_len", eval_len,
          "at least the needle and question, " + std::to_string(overhead()) + " characters for passkey_digits = " +
              std::to_string(digits) + ", up to 2^24");
  }
  std::string name() const override { return "passkey"; }
  std::string stop() const override { return "#"; }

  TrainSequence train_sequence(std::mt19937_64& rng, int seq_len) const override {
    check_seq_len(seq_len);
    const int64_t row = int64_t(seq_len) + 1, answer = digits_ + 1;  // the key and '#'
    if (row < overhead() + answer)
      fail("seq_len", std::to_string(seq_len),
           "at least " + std::to_string(overhead() + answer - 1) +
               " for the pass key's needle, question and answer with passkey_digits = " + std::to_string(digits_));
    const std::string key = random_key(rng);
    MaskedText t = problem(rng, key, row - answer);
    t.append(key + "#", true);
    return to_train_sequence(char_vocab(), t, seq_len);
  }

 protected:
  EvalProblem eval_problem(std::mt19937_64& rng) const override {
    const std::string key = random_key(rng);
    return {problem(rng, key, eval_len_).text, key, key};
  }

 private:
  // Needle and question: the characters of a prompt that are not filler.
  int64_t overhead() const { return int64_t(needle("").size()) + 2 * digits_ + int64_t(std::string(kQuestion).size()); }
  static std::string needle(const std::string& key) {
    return "the pass key is:" + key + ". remember it. " + key + " is the pass key. ";
  }
  // passkey_digits distinct digits in random order (a partial Fisher-Yates shuffle).
  std::string random_key(std::mt19937_64& rng) const {
    std::string digits = kDigits;
    for (int i = 0; i < digits_; ++i) std::swap(digits[size_t(i)], digits[size_t(i) + uniform_below(rng, 10 - i)]);
    return digits.substr(0, size_t(digits_));
  }

  // A prompt of `length` characters ending in the question: filler with the needle at a sentence boundary. The
  // key's first occurrence is not a target.
  MaskedText problem(std::mt19937_64& rng, const std::string& key, int64_t length) const {
    const int64_t filler_len = length - overhead();
    std::string filler;
    for (size_t s = uniform_below(rng, kSentenceCount); int64_t(filler.size()) < filler_len; ++s)
      filler += std::string(kSentences[s % kSentenceCount]) + " ";
    filler.erase(0, filler.size() - size_t(filler_len));  // cut at the front: a row may start mid-sentence
    std::vector<size_t> boundaries{0};                      // where a sentence starts, and the end
    for (size_t i = 2; i <= filler.size(); ++i)
      if (filler[i - 2] == '.' && filler[i - 1] == ' ') boundaries.push_back(i);
    if (boundaries.back() != filler.size()) boundaries.push_back(filler.size());
    const size_t at = boundaries[uniform_below(rng, boundaries.size())];
    MaskedText t;
    t.append(filler.substr(0, at) + "the pass key is:", true);
    t.append(key, false);
    t.append(". remember it. " + key + " is the pass key. " + filler.substr(at) + kQuestion, true);
    return t;
  }

  int digits_, eval_len_;
};

}  // namespace

std::unique_ptr<Task> make_passkey_task(const TaskOptions& o) {
  return std::make_unique<PasskeyTask>(o.passkey_digits, o.passkey_eval_len);
}

}  // namespace rotary::lab
