// lab/tasks/substring_index.cpp: seed 000's suffix by index, "?s='dyjeofuxvejmg'; s[8:]=='vejmg'#".
// Lowercase strings of min_string..max_string letters, index uniform in [0, len) (so the suffix is never empty).
#include <cstdint>
#include <string>

#include "rotary/error.h"
#include "tasks/char_task.h"
#include "tasks/random.h"

namespace rotary::lab {
namespace {

constexpr const char* kLetters = "abcdefghijklmnopqrstuvwxyz";

class SubstringIndexTask final : public CharTask {
 public:
  SubstringIndexTask(int min_len, int max_len)
      : CharTask(std::string(kLetters) + "0123456789?'; []:=#"), min_len_(min_len), max_len_(max_len) {}
  std::string name() const override { return "substring_index"; }
  std::string stop() const override { return "#"; }

  // Loss on every character, as the seed (the random string and index are a constant floor).
  TrainSequence train_sequence(std::mt19937_64& rng, int seq_len) const override {
    return pack_problems(rng, char_vocab(), seq_len, INT64_MAX, true, [this](std::mt19937_64& r) {
      const EvalProblem p = eval_problem(r);
      MaskedText t;
      t.append(p.prompt + p.answer + "#", true);
      return t;
    });
  }

 protected:
  EvalProblem eval_problem(std::mt19937_64& rng) const override {
    const std::string s = random_string(rng, kLetters, uniform_int(rng, min_len_, max_len_));
    const size_t index = uniform_below(rng, s.size());
    std::string answer = "'";  // appended, not "'" + ...: GCC 12 warns falsely (-Wrestrict) on that
    answer.append(s, index).push_back('\'');
    return {"?s='" + s + "'; s[" + std::to_string(index) + ":]==", answer, answer};
  }

 private:
  int min_len_, max_len_;
};

}  // namespace

std::unique_ptr<Task> make_substring_index_task(const TaskOptions& o) {
  // Each option's own range is checked by make_task (task_option_settings); here, how they relate.
  check(o.max_string >= o.min_string, "max_string", o.max_string,
        "[min_string = " + std::to_string(o.min_string) + ", 1000]");
  return std::make_unique<SubstringIndexTask>(o.min_string, o.max_string);
}

}  // namespace rotary::lab
