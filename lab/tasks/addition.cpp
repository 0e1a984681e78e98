// lab/tasks/addition.cpp: seed 000's step-by-step addition,
//   "?d=77+38446365; 7e0+5e0+0e0==12e0 and 7e1+6e1+1e1==14e1 and ... and d==38446442#".
// Step k adds digit k of each operand (0 past the shorter one's end) and the carry into column k; the steps run
// while either operand has digits left or a carry remains (as the authors' generator, `while x or y or carry`),
// so 99+1 ends "... and 0e2+0e2+1e2==1e2 and d==100#". Operands are strings, so max_digits is not bound by
// 64-bit integers.
#include <algorithm>
#include <cstdint>
#include <string>

#include "rotary/error.h"
#include "tasks/char_task.h"
#include "tasks/random.h"

namespace rotary::lab {
namespace {

// A number with exactly `digits` digits, uniform over them (no leading zero).
std::string random_number(std::mt19937_64& rng, int digits) {
  std::string n(static_cast<size_t>(digits), '0');
  n[0] = static_cast<char>('1' + uniform_below(rng, 9));
  for (size_t i = 1; i < n.size(); ++i) n[i] = static_cast<char>('0' + uniform_below(rng, 10));
  return n;
}

struct Worked {
  std::string steps;  // "7e0+5e0+0e0==12e0 and ..."
  std::string sum;    // decimal, no leading zero
};

Worked work_addition(const std::string& a, const std::string& b) {
  Worked w;
  std::string reversed_sum;
  int carry = 0;
  for (size_t k = 0; k < a.size() || k < b.size() || carry > 0; ++k) {
    const int da = k < a.size() ? a[a.size() - 1 - k] - '0' : 0;
    const int db = k < b.size() ? b[b.size() - 1 - k] - '0' : 0;
    const int total = da + db + carry;
    std::string e = "e";  // appended, not "e" + ...: GCC 12 warns falsely (-Wrestrict) on that
    e += std::to_string(k);
    if (k > 0) w.steps += " and ";
    w.steps += std::to_string(da) + e + "+" + std::to_string(db) + e + "+" + std::to_string(carry) + e + "==" +
               std::to_string(total) + e;
    reversed_sum.push_back(static_cast<char>('0' + total % 10));
    carry = total / 10;
  }
  w.sum.assign(reversed_sum.rbegin(), reversed_sum.rend());
  return w;
}

class AdditionTask final : public CharTask {
 public:
  explicit AdditionTask(int max_digits) : CharTask("0123456789?d=+; ean#"), max_digits_(max_digits) {}
  std::string name() const override { return "addition"; }
  std::string stop() const override { return "#"; }

  // Loss on every character, as the seed trains on the whole sequence: the operands are random (their loss is
  // a constant floor, the same for every model) and the rest is determined by them.
  TrainSequence train_sequence(std::mt19937_64& rng, int seq_len) const override {
    return pack_problems(rng, char_vocab(), seq_len, INT64_MAX, true, [this](std::mt19937_64& r) {
      const Parts p = draw(r);
      MaskedText t;
      t.append(p.prompt + p.answer + "#", true);
      return t;
    });
  }

 protected:
  EvalProblem eval_problem(std::mt19937_64& rng) const override {
    const Parts p = draw(rng);
    return {p.prompt, p.answer, p.final_answer};
  }

 private:
  struct Parts {
    std::string prompt, answer, final_answer;
  };
  Parts draw(std::mt19937_64& rng) const {
    const std::string a = random_number(rng, static_cast<int>(uniform_int(rng, 1, max_digits_)));
    const std::string b = random_number(rng, static_cast<int>(uniform_int(rng, 1, max_digits_)));
    const Worked w = work_addition(a, b);
    return {"?d=" + a + "+" + b + ";", " " + w.steps + " and d==" + w.sum, "d==" + w.sum};
  }
  int max_digits_;
};

}  // namespace

std::unique_ptr<Task> make_addition_task(const TaskOptions& o) {
  return std::make_unique<AdditionTask>(o.max_digits);
}

}  // namespace rotary::lab
