// lab/tasks/kv_retrieval.cpp: seed 001's JSON key-value retrieval,
//   '{"kfu": "qpz", "abd": "mmr"} abd=mmr#'.
// kv_pairs distinct keys of kv_key_len letters (3 in the seed) with 3-letter values (repeats allowed) in a JSON
// object, then kv_queries queries (1 in the seed), each a space, a key (uniform over the pairs, so the answer can sit
// anywhere back in the object), '=', its value, '#'. Queries ask distinct keys (at most one per pair): a repeated
// key could be answered by copying its earlier answer, a shortcut a small model learns instead of the lookup into
// the object (docs/tasks.md). Every problem has kv_pairs * (kv_key_len + 11) + min(kv_queries, kv_pairs) *
// (kv_key_len + 6) characters. An eval problem is the seed's form:
// one query, its prompt ending at '='. kv_min_pairs > 0: each training object has a uniform number of pairs in
// [kv_min_pairs, kv_pairs] (a curriculum by mixing: the lookup forms on the small objects, docs/memory.md).
//
// Loss only on the values after '=' and the '#'s: the keys and values are random, so predicting them teaches
// nothing and would bury the few answer characters under noise (more queries per object: more of the row is
// signal). A row may start inside a problem; that lead problem gets no loss, since the pair it asks about may lie
// before the row's start. kv_loss = all puts every character of the whole problems in the loss (a language model's
// objective: the JSON's structure trains the positional heads a lookup is built from).
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
constexpr int kValueLen = 3;

class KvRetrievalTask final : public CharTask {
 public:
  KvRetrievalTask(int pairs, int min_pairs, int key_len, int queries, bool loss_on_all, double near_keys)
      : CharTask(std::string(kLetters) + "{}\": ,=#"),
        pairs_(pairs), min_pairs_(min_pairs > 0 ? min_pairs : pairs), key_len_(key_len), queries_(queries),
        loss_on_all_(loss_on_all), near_keys_(near_keys) {
    check(near_keys >= 0 && near_keys <= 1, "kv_near_keys", near_keys, "in [0, 1]");
    check(min_pairs >= 0 && min_pairs <= pairs, "kv_min_pairs", min_pairs,
          "in [0, kv_pairs = " + std::to_string(pairs) + "] (0: every object has kv_pairs)");
    key_space_ = 1;
    for (int i = 0; i < key_len; ++i) key_space_ *= 26;
    check(uint64_t(pairs) <= key_space_, "kv_pairs", pairs,
          "at most 26^kv_key_len = " + std::to_string(key_space_) + " distinct keys");
  }
  std::string name() const override { return "kv_retrieval"; }
  std::string stop() const override { return "#"; }

  TrainSequence train_sequence(std::mt19937_64& rng, int seq_len) const override {
    check_seq_len(seq_len);
    const int64_t per_pair = key_len_ + 11, per_query = key_len_ + 6;
    const int64_t problem_len = per_pair * int64_t(pairs_) + per_query * std::min(queries_, pairs_);
    const int64_t row = int64_t(seq_len) + 1;
    if (problem_len > row)
      fail("kv_pairs", std::to_string(pairs_),
           fmt_at_most(row, per_pair, per_query, queries_) + " for seq_len = " + std::to_string(seq_len) +
               " (a row must hold one whole problem of kv_pairs * " + std::to_string(per_pair) +
               " + min(kv_queries, kv_pairs) * " + std::to_string(per_query) + " characters)");
    // The lead is at most row - problem_len characters, so one whole problem always follows it.
    return pack_problems(rng, char_vocab(), seq_len, row - problem_len, false, [this](std::mt19937_64& r) {
      std::vector<std::string> keys, values;
      MaskedText t;
      // (no draw at one size: the seed's rows stay as they were)
      const int pairs =
          min_pairs_ == pairs_ ? pairs_ : min_pairs_ + int(uniform_below(r, uint64_t(pairs_ - min_pairs_ + 1)));
      t.append(object(r, keys, values, pairs, near_keys_), loss_on_all_);
      // Distinct keys in a random order (a partial Fisher-Yates; one query draws as the seed's form did).
      std::vector<size_t> order(keys.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      const size_t asked = std::min(size_t(queries_), keys.size());
      for (size_t i = 0; i < asked; ++i) {
        std::swap(order[i], order[i + (i == 0 ? query(r, keys.size()) : uniform_below(r, keys.size() - i))]);
        const size_t q = order[i];
        t.append(" " + keys[q] + "=", loss_on_all_);
        t.append(values[q] + "#", true);
      }
      return t;
    });
  }

 protected:
  EvalProblem eval_problem(std::mt19937_64& rng) const override {
    std::vector<std::string> keys, values;
    const std::string obj = object(rng, keys, values, pairs_, 0);
    const size_t q = query(rng, keys.size());
    return {obj + " " + keys[q] + "=", values[q], values[q]};
  }

 private:
  // The bound with this task's kv_queries (fewer pairs than queries ask one query per pair, so a smaller object
  // may still fit: the check above is the exact one).
  static std::string fmt_at_most(int64_t row, int64_t per_pair, int64_t per_query, int queries) {
    return "at most (seq_len + 1 - kv_queries * " + std::to_string(per_query) + ") / " + std::to_string(per_pair) +
           " = " + std::to_string(std::max<int64_t>(0, row - per_query * queries) / per_pair) +
           " with kv_queries = " + std::to_string(queries);
  }
  static size_t query(std::mt19937_64& rng, size_t pairs) { return uniform_below(rng, pairs); }

  // The JSON object of `pairs` distinct keys and their values (the draws of the seed's form, in its order). With
  // near > 0 each key after the first is, with that chance, an earlier key with one letter changed (no draw at 0,
  // so the seed's rows stay as they were); when every such neighbour is taken the key is drawn at random.
  std::string object(std::mt19937_64& rng, std::vector<std::string>& keys, std::vector<std::string>& values,
                     int pairs, double near) const {
    keys.clear(), values.clear();
    keys.reserve(size_t(pairs));
    std::vector<bool> taken(key_space_, false);
    std::vector<uint64_t> codes;
    std::vector<uint64_t> place(size_t(key_len_), 1);  // place[i] = 26^i: letter i's digit
    for (size_t i = 1; i < place.size(); ++i) place[i] = place[i - 1] * 26;
    while (keys.size() < size_t(pairs)) {  // distinct keys (rejection: fine while pairs is not near the space)
      uint64_t code = 0;
      bool drawn = false;
      if (near > 0 && !codes.empty() && std::uniform_real_distribution<double>(0, 1)(rng) < near) {
        const uint64_t base = codes[uniform_below(rng, codes.size())];
        for (int tries = 0; tries < 4 * key_len_ && !drawn; ++tries) {
          const uint64_t at = place[uniform_below(rng, uint64_t(key_len_))];
          const uint64_t digit = (base / at) % 26, other = (digit + 1 + uniform_below(rng, 25)) % 26;
          code = base - digit * at + other * at;
          drawn = !taken[code];
        }
      }
      if (!drawn) code = uniform_below(rng, key_space_);
      if (taken[code]) continue;
      taken[code] = true;
      codes.push_back(code);
      std::string key(size_t(key_len_), 'a');
      for (char& c : key) {
        c = kLetters[code % 26];
        code /= 26;
      }
      keys.push_back(std::move(key));
    }
    std::string obj = "{";
    for (size_t i = 0; i < keys.size(); ++i) {
      values.push_back(random_string(rng, kLetters, kValueLen));
      if (i > 0) obj += ", ";
      obj += "\"" + keys[i] + "\": \"" + values.back() + "\"";
    }
    return obj + "}";
  }

  int pairs_, min_pairs_, key_len_, queries_;
  bool loss_on_all_;
  double near_keys_;
  uint64_t key_space_ = 0;
};

}  // namespace

std::unique_ptr<Task> make_kv_retrieval_task(const TaskOptions& o) {
  check(o.kv_loss == "answers" || o.kv_loss == "all", "kv_loss", o.kv_loss, "answers or all");
  return std::make_unique<KvRetrievalTask>(o.kv_pairs, o.kv_min_pairs, o.kv_key_len, o.kv_queries, o.kv_loss == "all",
                                           o.kv_near_keys);
}

}  // namespace rotary::lab
