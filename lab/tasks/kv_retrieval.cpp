// lab/tasks/kv_retrieval.cpp: seed 001's JSON key-value retrieval,
//   '{"kfu": "qpz", "abd": "mmr"} abd=mmr#'.
// kv_pairs distinct 3-letter keys with 3-letter values (repeats allowed) in a JSON object, a space, the queried
// key (uniform over the pairs, so the answer can sit anywhere back in the object), '=', its value, '#'. Every
// problem has 14 * kv_pairs + 9 characters.
//
// Loss only on the value after '=' and the '#': the keys and values are random, so predicting them teaches
// nothing and would bury the few answer characters under noise. A row may start inside a problem; that lead
// problem gets no loss, since the pair it asks about may lie before the row's start.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "rotary/error.h"
#include "tasks/char_task.h"
#include "tasks/random.h"

namespace rotary::lab {
namespace {

constexpr const char* kLetters = "abcdefghijklmnopqrstuvwxyz";
constexpr int kKeyLen = 3, kValueLen = 3;
constexpr uint64_t kKeySpace = 26 * 26 * 26;

class KvRetrievalTask final : public CharTask {
 public:
  explicit KvRetrievalTask(int pairs) : CharTask(std::string(kLetters) + "{}\": ,=#"), pairs_(pairs) {}
  std::string name() const override { return "kv_retrieval"; }
  std::string stop() const override { return "#"; }

  TrainSequence train_sequence(std::mt19937_64& rng, int seq_len) const override {
    check_seq_len(seq_len);
    const int64_t problem_len = 14 * int64_t(pairs_) + 9;
    const int64_t row = int64_t(seq_len) + 1;
    if (problem_len > row)
      fail("kv_pairs", std::to_string(pairs_),
           "at most (seq_len + 1 - 9) / 14 = " + std::to_string(std::max<int64_t>(0, (row - 9) / 14)) +
               " for seq_len = " + std::to_string(seq_len) +
               " (a row must hold one whole problem of 14 * kv_pairs + 9 characters)");
    // The lead is at most row - problem_len characters, so one whole problem always follows it.
    return pack_problems(rng, char_vocab(), seq_len, row - problem_len, false, [this](std::mt19937_64& r) {
      const EvalProblem p = eval_problem(r);
      MaskedText t;
      t.append(p.prompt, false);
      t.append(p.answer + "#", true);
      return t;
    });
  }

 protected:
  EvalProblem eval_problem(std::mt19937_64& rng) const override {
    std::vector<std::string> keys;
    keys.reserve(size_t(pairs_));
    std::vector<bool> taken(kKeySpace, false);
    while (keys.size() < size_t(pairs_)) {  // distinct keys; pairs <= 8192 < 26^3 / 2 keeps rejections rare
      uint64_t code = uniform_below(rng, kKeySpace);
      if (taken[code]) continue;
      taken[code] = true;
      std::string key(kKeyLen, 'a');
      for (char& c : key) {
        c = kLetters[code % 26];
        code /= 26;
      }
      keys.push_back(std::move(key));
    }
    std::string object = "{";
    std::vector<std::string> values;
    for (size_t i = 0; i < keys.size(); ++i) {
      values.push_back(random_string(rng, kLetters, kValueLen));
      if (i > 0) object += ", ";
      object += "\"" + keys[i] + "\": \"" + values.back() + "\"";
    }
    object += "}";
    const size_t query = uniform_below(rng, keys.size());
    return {object + " " + keys[query] + "=", values[query], values[query]};
  }

 private:
  int pairs_;
};

}  // namespace

std::unique_ptr<Task> make_kv_retrieval_task(const TaskOptions& o) {
  return std::make_unique<KvRetrievalTask>(o.kv_pairs);
}

}  // namespace rotary::lab
