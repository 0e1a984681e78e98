// lab/tasks/substring_search.cpp: seed 000's substring by search, "[random]>[copy][random]>[copy]...", over the
// alphabet "abcd" plus '>'.
//
// Random segments have m..3m letters (m = search_substring); each copy is m characters taken from a uniformly
// chosen position of the row so far whose m characters hold no '>'. The loss is on copy characters 2..m only:
// which substring is copied is a fresh random choice, so the first copied character cannot be predicted (its
// loss would be a floor of about ln 4 for every model), the '>' comes at a random place, and the random
// segments are noise. From the second character on, the model can search the row for the prefix seen so far.
#include <string>
#include <vector>

#include "rotary/error.h"
#include "tasks/char_task.h"
#include "tasks/random.h"

namespace rotary::lab {
namespace {

constexpr const char* kAlphabet = "abcd";

// The positions p where text[p, p + m) holds no '>'.
std::vector<size_t> copy_sources(const std::string& text, size_t m) {
  std::vector<size_t> starts;
  size_t run = 0;  // letters since the last '>'
  for (size_t i = 0; i < text.size(); ++i) {
    run = text[i] == '>' ? 0 : run + 1;
    if (run >= m) starts.push_back(i + 1 - m);
  }
  return starts;
}

class SubstringSearchTask final : public CharTask {
 public:
  SubstringSearchTask(int m, int eval_len)
      : CharTask(std::string(kAlphabet) + ">"), m_(size_t(m)), eval_len_(eval_len) {}
  std::string name() const override { return "substring_search"; }
  std::string stop() const override { return ""; }

  TrainSequence train_sequence(std::mt19937_64& rng, int seq_len) const override {
    check_seq_len(seq_len);
    // The first copy must fit whole: a 3m segment, '>', m characters.
    check(size_t(seq_len) + 1 >= 4 * m_ + 1, "seq_len", seq_len,
          ">= 4 * search_substring = " + std::to_string(4 * m_) + " (a row must hold its first copy)");
    MaskedText row;
    while (row.text.size() < size_t(seq_len) + 1) {
      append_segment(rng, row);
      append_copy(rng, row, draw_source(rng, row.text));
    }
    return to_train_sequence(char_vocab(), row, seq_len);
  }

 protected:
  // A context of about search_eval_len characters ending in a random segment, then '>' and the shortest prefix
  // of a copy after which the rest is unambiguous: every place in the context where that prefix starts a
  // '>'-free run of m characters continues the same way. The answer is that rest (stop ""; it is followed by
  // random text in training).
  EvalProblem eval_problem(std::mt19937_64& rng) const override {
    for (int context_try = 0; context_try < 64; ++context_try) {
      MaskedText context;
      append_segment(rng, context);
      while (context.text.size() < size_t(eval_len_)) {
        append_copy(rng, context, draw_source(rng, context.text));
        append_segment(rng, context);
      }
      const std::string& text = context.text;
      const std::vector<size_t> sources = copy_sources(text, m_);
      for (int attempt = 0; attempt < 16; ++attempt) {
        const size_t p = sources[uniform_below(rng, sources.size())];
        for (size_t k = 1; k < m_; ++k) {
          bool unique = true;
          for (const size_t q : sources)
            if (text.compare(q, k, text, p, k) == 0 && text.compare(q + k, m_ - k, text, p + k, m_ - k) != 0) {
              unique = false;
              break;
            }
          if (unique) {
            const std::string answer = text.substr(p + k, m_ - k);
            return {text + ">" + text.substr(p, k), answer, answer};
          }
        }
      }
    }
    // With a long context and a short copy, every prefix recurs with different continuations.
    fail("search_eval_len", std::to_string(eval_len_),
         "short enough that a copy's prefix can be unambiguous (well below 4^(search_substring - 1) = 4^" +
             std::to_string(m_ - 1) + ")");
  }

 private:
  void append_segment(std::mt19937_64& rng, MaskedText& row) const {
    row.append(random_string(rng, kAlphabet, uniform_int(rng, int64_t(m_), 3 * int64_t(m_))), false);
  }
  size_t draw_source(std::mt19937_64& rng, const std::string& text) const {
    const std::vector<size_t> sources = copy_sources(text, m_);
    return sources[uniform_below(rng, sources.size())];  // never empty: every segment has >= m letters
  }
  void append_copy(std::mt19937_64& rng, MaskedText& row, size_t source) const {
    const std::string copy = row.text.substr(source, m_);
    row.append(std::string{'>', copy[0]}, false);
    row.append(copy.substr(1), true);
  }
  size_t m_;
  int eval_len_;
};

}  // namespace

std::unique_ptr<Task> make_substring_search_task(const TaskOptions& o) {
  // Each option's own range is checked by make_task (task_option_settings); here, how they relate.
  check(o.search_eval_len >= o.search_substring, "search_eval_len",
        o.search_eval_len, "[search_substring = " + std::to_string(o.search_substring) + ", 2^20]");
  return std::make_unique<SubstringSearchTask>(o.search_substring, o.search_eval_len);
}

}  // namespace rotary::lab
