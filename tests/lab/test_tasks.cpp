// tests/lab/test_tasks.cpp: the seeds' tasks. Generated text is parsed back by validators written here
// independently of the generators (regexes, 64-bit arithmetic, nlohmann JSON), and the validators are first
// shown to accept the seed documents' own examples, so they check the seeds' formats and not our reading of them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/process.h"
#include "expect_error.h"
#include "rotary/error.h"
#include "tasks/bpe_vocab.h"
#include "tasks/kjv_corpus.h"
#include "tasks/random.h"
#include "tasks/task.h"
#include "tasks/text_cache.h"

namespace rotary::lab {
namespace {

// The examples printed in seed 000 (RoPER), copied from the document.
const char* const kSeedAdditions[] = {
    "?d=77+38446365; 7e0+5e0+0e0==12e0 and 7e1+6e1+1e1==14e1 and 0e2+3e2+1e2==4e2 and 0e3+6e3+0e3==6e3 and "
    "0e4+4e4+0e4==4e4 and 0e5+4e5+0e5==4e5 and 0e6+8e6+0e6==8e6 and 0e7+3e7+0e7==3e7 and d==38446442",
    "?d=66623+401; 3e0+1e0+0e0==4e0 and 2e1+0e1+0e1==2e1 and 6e2+4e2+0e2==10e2 and 6e3+0e3+1e3==7e3 and "
    "6e4+0e4+0e4==6e4 and d==67024"};
const char* const kSeedSubstring = "?s='dyjeofuxvejmg'; s[8:]=='vejmg'";

std::string decode_row(const Task& task, const TrainSequence& s) { return task.vocab().decode(s.tokens); }

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts(1);
  for (const char c : text) {
    if (c == sep)
      parts.emplace_back();
    else
      parts.back().push_back(c);
  }
  return parts;
}

// The problems of a packed row that are whole: between the first and the last '#' (a row starts and ends inside
// problems). Each is returned without its '#'.
std::vector<std::string> whole_problems(const std::string& row) {
  std::vector<std::string> parts = split(row, '#');
  return {parts.begin() + 1, parts.end() - 1};
}

// One step-by-step addition without its '#': the operands' digits, the carries and the sum, recomputed.
// Returns "" when right, else what is wrong.
std::string addition_error(const std::string& problem, int max_digits) {
  static const std::regex whole(R"(\?d=([1-9][0-9]*)\+([1-9][0-9]*); (.*) and d==([1-9][0-9]*))");
  static const std::regex step(R"(([0-9])e([0-9]+)\+([0-9])e([0-9]+)\+([01])e([0-9]+)==([0-9]+)e([0-9]+))");
  std::smatch m;
  if (!std::regex_match(problem, m, whole)) return "shape: " + problem;
  const std::string a = m[1], b = m[2], steps = m[3], sum = m[4];
  if (int(a.size()) > max_digits || int(b.size()) > max_digits) return "too many digits: " + problem;
  const uint64_t a_value = std::stoull(a), b_value = std::stoull(b);  // max_digits <= 18 here
  if (std::stoull(sum) != a_value + b_value) return "sum: " + problem;
  std::vector<std::string> parts(1);
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps.compare(i, 5, " and ") == 0) {
      parts.emplace_back();
      i += 4;
    } else {
      parts.back().push_back(steps[i]);
    }
  // One step per digit of the sum: the columns of the longer operand, plus one when a carry leaves the top.
  if (parts.size() != sum.size()) return "step count: " + problem;
  uint64_t carry = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    std::smatch s;
    if (!std::regex_match(parts[k], s, step)) return "step shape: " + parts[k];
    for (int e : {2, 4, 6, 8})
      if (std::stoull(s[e].str()) != k) return "exponent: " + parts[k];
    uint64_t pow10 = 1;
    for (size_t i = 0; i < k; ++i) pow10 *= 10;
    const uint64_t da = a_value / pow10 % 10, db = b_value / pow10 % 10, total = std::stoull(s[7].str());
    if (std::stoull(s[1].str()) != da || std::stoull(s[3].str()) != db || std::stoull(s[5].str()) != carry ||
        total != da + db + carry)
      return "step arithmetic: " + parts[k];
    carry = total / 10;
  }
  return carry == 0 ? "" : "carry left: " + problem;
}

TEST(tasks, AdditionValidatorAcceptsTheSeedExamplesAndRejectsBrokenOnes) {
  for (const char* example : kSeedAdditions) EXPECT_EQ(addition_error(example, 8), "") << example;
  std::string wrong_sum = kSeedAdditions[1];
  wrong_sum.back() = '5';
  EXPECT_NE(addition_error(wrong_sum, 8), "");
  std::string wrong_carry = kSeedAdditions[0];
  wrong_carry.replace(wrong_carry.find("7e1+6e1+1e1"), 11, "7e1+6e1+0e1");
  EXPECT_NE(addition_error(wrong_carry, 8), "");
}

TEST(tasks, AdditionRowsHoldRightStepByStepSums) {
  for (const int max_digits : {1, 3, 8, 18}) {
    TaskOptions options;
    options.max_digits = max_digits;
    const auto task = make_task("addition", options);
    std::mt19937_64 rng(max_digits);
    int checked = 0;
    for (int row = 0; row < 30; ++row) {
      const TrainSequence s = task->train_sequence(rng, 640);
      ASSERT_EQ(s.tokens.size(), 641u);
      ASSERT_EQ(s.loss_mask.size(), 640u);
      for (const float w : s.loss_mask) ASSERT_EQ(w, 1.0f);  // the seed trains on the whole sequence
      for (const std::string& p : whole_problems(decode_row(*task, s))) {
        ASSERT_EQ(addition_error(p, max_digits), "") << p;
        ++checked;
      }
    }
    EXPECT_GT(checked, 20);
    std::set<size_t> digit_counts;
    for (const EvalProblem& p : task->eval_problems(400, 3)) {
      digit_counts.insert(p.prompt.find('+') - 3);
      digit_counts.insert(p.prompt.size() - 1 - p.prompt.find('+') - 1);
    }
    EXPECT_EQ(digit_counts.size(), size_t(max_digits)) << "every operand length 1..max_digits appears";
    EXPECT_EQ(*digit_counts.rbegin(), size_t(max_digits));
  }
}

TEST(tasks, AdditionEvalProblemsAndScoring) {
  const auto task = make_task("addition");
  ASSERT_EQ(task->stop(), "#");
  for (const EvalProblem& p : task->eval_problems(50, 7)) {
    ASSERT_EQ(p.prompt.back(), ';');
    ASSERT_EQ(p.answer.front(), ' ');
    ASSERT_EQ(addition_error(p.prompt + p.answer, 8), "");
    const std::string sum = p.answer.substr(p.answer.rfind("d==") + 3);
    EXPECT_EQ(p.final_answer, "d==" + sum);
    EXPECT_TRUE(exact_match(p.answer + "#", p, "#"));
    EXPECT_TRUE(exact_match(p.answer + "#?d=1", p, "#"));
    EXPECT_FALSE(exact_match(p.answer, p, "#")) << "the answer must end";
    EXPECT_FALSE(exact_match(p.answer + "0#", p, "#"));
    EXPECT_TRUE(final_answer_match(" 1e0+1e0+0e0==2e0 and d==" + sum + "#", p, "#")) << "wrong steps, right sum";
    EXPECT_FALSE(final_answer_match(" d==1" + sum + "#", p, "#"));
    EXPECT_FALSE(final_answer_match(p.answer, p, "#")) << "no stop";
  }
}

// "?s='...'; s[i:]=='...'" without '#': "" when the suffix is right and the lengths in range.
std::string substring_error(const std::string& problem, int min_len, int max_len) {
  static const std::regex shape(R"(\?s='([a-z]+)'; s\[([0-9]+):\]=='([a-z]+)')");
  std::smatch m;
  if (!std::regex_match(problem, m, shape)) return "shape: " + problem;
  const std::string s = m[1], suffix = m[3];
  const size_t index = std::stoul(m[2].str());
  if (int(s.size()) < min_len || int(s.size()) > max_len) return "length: " + problem;
  if (index >= s.size() || s.substr(index) != suffix) return "suffix: " + problem;
  return "";
}

TEST(tasks, SubstringIndexRowsAndProblems) {
  EXPECT_EQ(substring_error(kSeedSubstring, 4, 16), "");
  EXPECT_NE(substring_error("?s='dyjeofuxvejmg'; s[7:]=='vejmg'", 4, 16), "");
  TaskOptions options;
  options.min_string = 3;
  options.max_string = 12;
  const auto task = make_task("substring_index", options);
  std::mt19937_64 rng(3);
  std::set<size_t> lengths;
  for (int row = 0; row < 20; ++row) {
    const TrainSequence s = task->train_sequence(rng, 300);
    ASSERT_EQ(s.tokens.size(), 301u);
    for (const float w : s.loss_mask) ASSERT_EQ(w, 1.0f);
    for (const std::string& p : whole_problems(decode_row(*task, s))) {
      ASSERT_EQ(substring_error(p, 3, 12), "") << p;
      lengths.insert(p.find("';") - 4);
    }
  }
  EXPECT_EQ(lengths.size(), 10u) << "every length 3..12 appears";
  for (const EvalProblem& p : task->eval_problems(40, 1)) {
    ASSERT_EQ(substring_error(p.prompt + p.answer, 3, 12), "");
    ASSERT_EQ(p.prompt.substr(p.prompt.size() - 2), "==");
    EXPECT_EQ(p.final_answer, p.answer);
    EXPECT_TRUE(exact_match(p.answer + "#", p, task->stop()));
  }
}

// Checks a substring_search row: every '>' is followed by m characters found earlier in the row in a '>'-free
// stretch; random stretches have m..3m letters; the loss mask is on copy characters 2..m and nowhere else.
void check_search_row(const std::string& row, const std::vector<float>& mask, size_t m) {
  std::vector<float> expected(row.size(), 0.0f);  // by character position
  size_t segment_start = 0;
  for (size_t i = 0; i < row.size(); ++i) {
    ASSERT_NE(std::string("abcd>").find(row[i]), std::string::npos) << row;
    if (row[i] != '>') continue;
    const size_t segment = i - segment_start;
    ASSERT_GE(segment, m) << "segment before " << i;
    ASSERT_LE(segment, 3 * m) << "segment before " << i;
    const std::string copy = row.substr(i + 1, m);  // may be cut by the row's end
    bool found = false;
    for (size_t p = 0; p + m <= i && !found; ++p) {
      const std::string source = row.substr(p, m);
      found = source.find('>') == std::string::npos && source.compare(0, copy.size(), copy) == 0;
    }
    ASSERT_TRUE(found) << "copy at " << i << " not found earlier: " << row;
    ASSERT_EQ(copy.find('>'), std::string::npos);
    for (size_t k = 1; k < copy.size(); ++k) expected[i + 1 + k] = 1.0f;
    segment_start = i + 1 + m;
    i += m;
  }
  for (size_t t = 0; t < mask.size(); ++t) ASSERT_EQ(mask[t], expected[t + 1]) << "target " << t + 1;
}

TEST(tasks, SubstringSearchRowsCopyEarlierTextAndMaskTheCopies) {
  for (const int m : {2, 6, 9}) {
    TaskOptions options;
    options.search_substring = m;
    const auto task = make_task("substring_search", options);
    EXPECT_EQ(task->vocab().size(), 6);  // a b c d > and pad
    std::mt19937_64 rng(m);
    for (int row = 0; row < 20; ++row) {
      const TrainSequence s = task->train_sequence(rng, 512);
      ASSERT_EQ(s.tokens.size(), 513u);
      check_search_row(decode_row(*task, s), s.loss_mask, size_t(m));
    }
    EXPECT_THROW(task->train_sequence(rng, 4 * m - 1), Error);
  }
}

TEST(tasks, SubstringSearchEvalAnswersAreTheUniqueContinuation) {
  const size_t m = 6;
  const auto task = make_task("substring_search");
  EXPECT_EQ(task->stop(), "");
  for (const EvalProblem& p : task->eval_problems(30, 5)) {
    const size_t gt = p.prompt.rfind('>');
    const std::string context = p.prompt.substr(0, gt), prefix = p.prompt.substr(gt + 1);
    ASSERT_GE(context.size(), 256u);
    ASSERT_EQ(prefix.size() + p.answer.size(), m);
    // Continuations of the prefix (and of its shorter prefixes) across the context's '>'-free windows.
    auto continuations = [&](size_t k) {
      std::set<std::string> found;
      for (size_t q = 0; q + m <= context.size(); ++q) {
        const std::string w = context.substr(q, m);
        if (w.find('>') == std::string::npos && w.compare(0, k, prefix, 0, k) == 0) found.insert(w.substr(k));
      }
      return found;
    };
    EXPECT_EQ(continuations(prefix.size()), std::set<std::string>{p.answer}) << p.prompt;
    if (prefix.size() > 1) {
      EXPECT_GT(continuations(prefix.size() - 1).size(), 1u) << "prefix is the shortest";
    }
    EXPECT_TRUE(exact_match(p.answer + "abc", p, ""));
    EXPECT_FALSE(exact_match(p.answer.substr(1), p, ""));
  }
}

// '{"k": "v", ...} q=a' without '#': "" when the object is JSON with `pairs` distinct keys and a is q's value.
std::string kv_error(const std::string& problem, int pairs) {
  static const std::regex shape(R"((\{.*\}) ([a-z]{3})=([a-z]{3}))");
  std::smatch m;
  if (!std::regex_match(problem, m, shape)) return "shape: " + problem;
  nlohmann::json object;
  try {
    object = nlohmann::json::parse(m[1].str());
  } catch (const std::exception& e) {
    return std::string("json: ") + e.what();
  }
  // Duplicate keys would collapse in the parsed object, so its size checks distinctness too.
  if (!object.is_object() || int(object.size()) != pairs) return "pairs: " + problem;
  for (const auto& [key, value] : object.items())
    if (!std::regex_match(key, std::regex("[a-z]{3}")) || !value.is_string()) return "pair: " + key;
  if (!object.contains(m[2].str()) || object[m[2].str()] != m[3].str()) return "answer: " + problem;
  return "";
}

TEST(tasks, KvRetrievalRowsAnswerTheQueryAndMaskOnlyTheAnswers) {
  EXPECT_EQ(kv_error(R"({"abc": "xyz", "qrs": "tuv"} qrs=tuv)", 2), "");
  EXPECT_NE(kv_error(R"({"abc": "xyz", "qrs": "tuv"} qrs=xyz)", 2), "");
  EXPECT_NE(kv_error(R"({"abc": "xyz", "abc": "tuv"} abc=tuv)", 2), "");
  for (const int pairs : {1, 8, 40}) {
    TaskOptions options;
    options.kv_pairs = pairs;
    const auto task = make_task("kv_retrieval", options);
    const int problem_len = 14 * pairs + 9;
    std::mt19937_64 rng(pairs);
    for (const int seq_len : {problem_len - 1, 2 * problem_len, 1000}) {
      for (int row = 0; row < 10; ++row) {
        const TrainSequence s = task->train_sequence(rng, seq_len);
        ASSERT_EQ(s.tokens.size(), size_t(seq_len) + 1);
        const std::string text = decode_row(*task, s);
        // Targets: the 3 answer characters and '#' of every problem whose '{' is in the row.
        std::vector<float> expected(text.size(), 0.0f);
        int whole = 0;
        for (size_t open = text.find('{'); open != std::string::npos; open = text.find('{', open + 1)) {
          const size_t close = text.find('}', open);
          if (close == std::string::npos) break;
          for (size_t i = close + 6; i <= close + 9 && i < text.size(); ++i) expected[i] = 1.0f;
          if (close + 9 < text.size()) {
            ASSERT_EQ(kv_error(text.substr(open, close + 9 - open), pairs), "") << text;
            ASSERT_EQ(text[close + 9], '#');
            ++whole;
          }
        }
        EXPECT_GE(whole, 1) << "every row holds a whole problem";
        for (size_t t = 0; t < s.loss_mask.size(); ++t) ASSERT_EQ(s.loss_mask[t], expected[t + 1]) << text;
      }
    }
    EXPECT_THROW(task->train_sequence(rng, problem_len - 2), Error);
    for (const EvalProblem& p : task->eval_problems(20, 2)) {
      ASSERT_EQ(kv_error(p.prompt + p.answer, pairs), "");
      ASSERT_EQ(int(p.prompt.size()), problem_len - 4);
      EXPECT_EQ(p.final_answer, p.answer);
    }
  }
}

// kv_loss = all: the same rows (the same draws), every character from the first whole problem on in the loss, the
// answers-only mask a subset of it; a value other than answers / all is refused naming the field.
TEST(tasks, KvRetrievalLossOnEveryCharacter) {
  TaskOptions answers;
  answers.kv_pairs = 5;
  answers.kv_queries = 3;
  TaskOptions all = answers;
  all.kv_loss = "all";
  std::mt19937_64 rng_a(11), rng_b(11);
  const TrainSequence a = make_task("kv_retrieval", answers)->train_sequence(rng_a, 300);
  const TrainSequence b = make_task("kv_retrieval", all)->train_sequence(rng_b, 300);
  EXPECT_EQ(a.tokens, b.tokens);
  const auto task = make_task("kv_retrieval", all);
  const std::string text = decode_row(*task, b);
  const size_t first = text.find('{');  // the first whole problem (the lead before it gets no loss)
  ASSERT_NE(first, std::string::npos);
  for (size_t t = 0; t < a.loss_mask.size(); ++t) {
    if (a.loss_mask[t] > 0) {
      EXPECT_EQ(b.loss_mask[t], 1.0f) << "answers are targets in both, at " << t;
    }
    if (t + 1 >= first) {
      EXPECT_EQ(b.loss_mask[t], 1.0f) << text << " at " << t;
    }
  }
  TaskOptions bad = answers;
  bad.kv_loss = "keys";
  try {
    make_task("kv_retrieval", bad);
    ADD_FAILURE() << "kv_loss = keys accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv_loss = keys"), std::string::npos) << e.what();
  }
}

// kv_key_len and kv_queries (a form a small model learns faster: more answers per row, shorter keys): every query
// after the object asks one of its keys, no key twice (min(kv_queries, kv_pairs) queries), and is answered with
// that key's value; only the answers and '#' are targets; the problem has kv_pairs * (key_len + 11) +
// min(kv_queries, kv_pairs) * (key_len + 6) characters; eval problems keep the seed's one-query form; the seed's
// settings give the same rows as before the options existed.
TEST(tasks, KvRetrievalWithShortKeysAndSeveralQueries) {
  for (const auto& [key_len, queries] : {std::pair{1, 4}, std::pair{2, 8}, std::pair{4, 2}}) {
    SCOPED_TRACE("key_len " + std::to_string(key_len) + " queries " + std::to_string(queries));
    TaskOptions options;
    options.kv_pairs = 6;
    options.kv_key_len = key_len;
    options.kv_queries = queries;
    const auto task = make_task("kv_retrieval", options);
    const int asked = std::min(queries, 6);  // 8 queries of 6 pairs: each key once
    const int problem_len = 6 * (key_len + 11) + asked * (key_len + 6);
    std::mt19937_64 rng(3);
    const TrainSequence s = task->train_sequence(rng, 3 * problem_len);
    const std::string text = decode_row(*task, s);
    int answered = 0;
    for (size_t open = text.find('{'); open != std::string::npos; open = text.find('{', open + 1)) {
      const size_t close = text.find('}', open);
      if (close == std::string::npos || close + size_t(asked * (key_len + 6)) >= text.size()) break;
      const std::string obj = text.substr(open, close + 1 - open);
      size_t at = close + 1;
      std::set<std::string> asked_keys;
      for (int i = 0; i < asked; ++i) {
        ASSERT_EQ(text[at], ' ') << text;
        const std::string key = text.substr(at + 1, size_t(key_len)), value = text.substr(at + 2 + key_len, 3);
        ASSERT_EQ(text[at + 1 + key_len], '=') << text;
        ASSERT_TRUE(asked_keys.insert(key).second) << "key " << key << " asked twice in " << text;
        ASSERT_NE(obj.find("\"" + key + "\": \"" + value + "\""), std::string::npos) << text;
        for (size_t c = at; c < at + size_t(key_len + 6); ++c) {
          const bool target = c >= at + 2 + size_t(key_len);  // the value and '#'
          if (c >= 1) {
            ASSERT_EQ(s.loss_mask[c - 1], target ? 1.0f : 0.0f) << text << " at " << c;
          }
        }
        at += size_t(key_len + 6);
        ++answered;
      }
      EXPECT_EQ(at - open, size_t(problem_len));
    }
    EXPECT_GE(answered, asked);
    for (const EvalProblem& p : task->eval_problems(5, 1)) {
      EXPECT_EQ(p.prompt.size(), size_t(6 * (key_len + 11) + key_len + 2));
      EXPECT_EQ(p.answer.size(), 3u);
    }
  }
  // The seed's settings: rows as the task made them before the options (key_len 3, one query; the row below is
  // what `rotary task show --task kv_retrieval --seq-len 200 --seed 5` printed before they were added).
  TaskOptions seed;
  std::mt19937_64 a(5);
  const std::string row = decode_row(*make_task("kv_retrieval", seed), make_task("kv_retrieval", seed)->train_sequence(a, 200));
  EXPECT_EQ(row.substr(0, 60), R"(, "ywr": "rwc"} zmr=ufb#{"dvc": "xqu", "yih": "xdd", "vbv": )");
  TaskOptions too_many;
  too_many.kv_key_len = 1;
  too_many.kv_pairs = 27;
  EXPECT_THROW(make_task("kv_retrieval", too_many), Error);
  // An object that does not fit a row: the bound named is the one for this kv_queries (2 queries of 8 characters
  // leave (129 - 16) / 13 = 8 pairs of two-letter keys at seq_len 128).
  TaskOptions two_queries;
  two_queries.kv_key_len = 2;
  two_queries.kv_pairs = 9;
  two_queries.kv_queries = 2;
  std::mt19937_64 r(1);
  test::expect_error([&] { make_task("kv_retrieval", two_queries)->train_sequence(r, 128); },
                     "kv_pairs = 9 is invalid; allowed: at most (seq_len + 1 - kv_queries * 8) / 13 = 8 with "
                     "kv_queries = 2 for seq_len = 128");
  two_queries.kv_pairs = 8;
  EXPECT_NO_THROW(make_task("kv_retrieval", two_queries)->train_sequence(r, 128));
}

// kv_min_pairs (a curriculum by mixing): training objects have every size in [kv_min_pairs, kv_pairs] and no
// other; eval problems keep kv_pairs; 0 leaves the rows as they were; a minimum past kv_pairs is refused by name.
TEST(tasks, KvRetrievalMixesObjectSizesForTraining) {
  TaskOptions options;
  options.kv_pairs = 6;
  options.kv_min_pairs = 2;
  const auto task = make_task("kv_retrieval", options);
  std::set<size_t> sizes;
  std::mt19937_64 rng(9);
  for (int row = 0; row < 40; ++row) {
    const std::string text = decode_row(*task, task->train_sequence(rng, 400));
    for (size_t open = text.find('{'); open != std::string::npos; open = text.find('{', open + 1)) {
      const size_t close = text.find('}', open);
      if (close == std::string::npos) break;
      const std::string obj = text.substr(open, close + 1 - open);
      sizes.insert(size_t(std::count(obj.begin(), obj.end(), ':')));
    }
  }
  EXPECT_EQ(sizes, (std::set<size_t>{2, 3, 4, 5, 6}));
  for (const EvalProblem& p : task->eval_problems(10, 1))
    EXPECT_EQ(std::count(p.prompt.begin(), p.prompt.end(), ':'), 6) << p.prompt;
  TaskOptions none = options, fixed = options;
  none.kv_min_pairs = 0;
  std::mt19937_64 a(4), b(4);
  TaskOptions plain;
  plain.kv_pairs = 6;
  EXPECT_EQ(make_task("kv_retrieval", none)->train_sequence(a, 300).tokens,
            make_task("kv_retrieval", plain)->train_sequence(b, 300).tokens);
  fixed.kv_min_pairs = 7;
  try {
    make_task("kv_retrieval", fixed);
    ADD_FAILURE() << "kv_min_pairs = 7 > kv_pairs accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv_min_pairs = 7"), std::string::npos) << e.what();
  }
}

// kv_near_keys (hard negatives): at chance 1 every key of a training object after its first differs from an
// earlier key of that object in exactly one letter (at chance 0, about 2 in 26 would by accident); the keys stay
// distinct; eval problems keep random keys; 0 leaves the rows as they were; a chance outside [0, 1] is refused.
TEST(tasks, KvRetrievalNearKeysDifferInOneLetter) {
  auto keys_of = [](const std::string& obj) {
    std::vector<std::string> keys;
    for (size_t q = obj.find('"'); q != std::string::npos; q = obj.find('"', q + 1)) {
      const size_t end = obj.find('"', q + 1);
      if (obj.compare(end + 1, 1, ":") == 0) keys.push_back(obj.substr(q + 1, end - q - 1));
      q = end;
    }
    return keys;
  };
  auto near_share = [&](const std::vector<std::string>& objects) {
    int near = 0, later = 0;
    for (const std::string& obj : objects) {
      const std::vector<std::string> keys = keys_of(obj);
      EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), keys.size()) << obj;
      for (size_t i = 1; i < keys.size(); ++i, ++later)
        for (size_t j = 0; j < i; ++j) {
          int differ = 0;
          for (size_t c = 0; c < keys[i].size(); ++c) differ += keys[i][c] != keys[j][c];
          if (differ == 1) {
            ++near;
            break;
          }
        }
    }
    return later ? double(near) / later : 0.0;
  };
  auto objects_of = [](const std::string& text) {
    std::vector<std::string> out;
    for (size_t open = text.find('{'); open != std::string::npos; open = text.find('{', open + 1)) {
      const size_t close = text.find('}', open);
      if (close == std::string::npos) break;
      out.push_back(text.substr(open, close + 1 - open));
    }
    return out;
  };
  TaskOptions options;
  options.kv_pairs = 8;
  options.kv_key_len = 2;
  options.kv_near_keys = 1;
  const auto task = make_task("kv_retrieval", options);
  TaskOptions random_keys = options;
  random_keys.kv_near_keys = 0;
  const auto plain = make_task("kv_retrieval", random_keys);
  std::vector<std::string> near_objects, plain_objects, eval_objects;
  std::mt19937_64 a(2), b(2);
  for (int row = 0; row < 30; ++row) {
    for (const std::string& o : objects_of(decode_row(*task, task->train_sequence(a, 400)))) near_objects.push_back(o);
    for (const std::string& o : objects_of(decode_row(*plain, plain->train_sequence(b, 400)))) plain_objects.push_back(o);
  }
  for (const EvalProblem& p : task->eval_problems(60, 1)) eval_objects.push_back(p.prompt.substr(0, p.prompt.find('}') + 1));
  ASSERT_GE(near_objects.size(), 30u);
  EXPECT_EQ(near_share(near_objects), 1.0);
  EXPECT_LT(near_share(plain_objects), 0.6);
  EXPECT_LT(near_share(eval_objects), 0.6);
  // At 0 no draw is added: the rows are the ones the task made before the option.
  TaskOptions unset;
  unset.kv_pairs = 8;
  unset.kv_key_len = 2;
  std::mt19937_64 c(7), d(7);
  EXPECT_EQ(plain->train_sequence(c, 300).tokens, make_task("kv_retrieval", unset)->train_sequence(d, 300).tokens);
  options.kv_near_keys = 1.5;
  test::expect_error([&] { make_task("kv_retrieval", options); }, "kv_near_keys = 1.5");
}

// passkey: parsed back with a regex written from the anchors' form. A row is one problem of seq_len + 1
// characters: filler sentences, the needle at a sentence boundary, the question, the key and '#'; every character
// is a target but the key's first occurrence. Eval prompts have exactly passkey_eval_len characters, end at the
// question, and hide the key at depths spread over the prompt; too short a row or prompt names the field.
TEST(tasks, PasskeyHidesOneKeyInFillerAndAsksForIt) {
  const std::regex form(R"(^([a-z .]*?)the pass key is:([0-9]+)\. remember it\. ([0-9]+) is the pass key\. ([a-z .]*)what is the pass key\? the pass key is:$)");
  // The filler without the needle: perhaps the cut end of a sentence, then whole sentences of the five.
  const std::regex filler(R"(^([a-z ]*\. )?((the grass is green|the sky is blue|the sun is yellow|here we go|there and back again)\. )*$)");
  for (const int digits : {1, 5, 10}) {
    SCOPED_TRACE("digits " + std::to_string(digits));
    TaskOptions options;
    options.passkey_digits = digits;
    options.passkey_eval_len = 1000;
    const auto task = make_task("passkey", options);
    std::mt19937_64 rng(digits);
    for (const int seq_len : {130, 256, 777}) {
      for (int row = 0; row < 10; ++row) {
        const TrainSequence s = task->train_sequence(rng, seq_len);
        ASSERT_EQ(s.tokens.size(), size_t(seq_len) + 1);
        const std::string text = decode_row(*task, s);
        const size_t hash = text.size() - 1;
        ASSERT_EQ(text[hash], '#') << text;
        const std::string prompt = text.substr(0, hash - size_t(digits)), answer = text.substr(hash - size_t(digits), size_t(digits));
        std::smatch m;
        ASSERT_TRUE(std::regex_match(prompt, m, form)) << text;
        EXPECT_EQ(m[2].str(), answer);
        EXPECT_EQ(m[3].str(), answer);
        EXPECT_EQ(std::set<char>(answer.begin(), answer.end()).size(), answer.size()) << "distinct digits: " << answer;
        EXPECT_TRUE(std::regex_match(m[1].str() + m[4].str(), filler)) << text;
        EXPECT_TRUE(m[1].length() == 0 || m[1].str().ends_with(". ")) << "the needle starts a sentence: " << text;
        const size_t key_at = size_t(m.position(2));
        for (size_t t = 0; t < s.loss_mask.size(); ++t)
          ASSERT_EQ(s.loss_mask[t], t + 1 >= key_at && t + 1 < key_at + size_t(digits) ? 0.0f : 1.0f) << t;
      }
    }
    size_t shallowest = SIZE_MAX, deepest = 0;
    for (const EvalProblem& p : task->eval_problems(100, 3)) {
      ASSERT_EQ(p.prompt.size(), 1000u);
      std::smatch m;
      ASSERT_TRUE(std::regex_match(p.prompt, m, form)) << p.prompt;
      EXPECT_EQ(m[2].str(), p.answer);
      EXPECT_EQ(p.answer.size(), size_t(digits));
      EXPECT_EQ(p.final_answer, p.answer);
      shallowest = std::min(shallowest, size_t(m.position(2))), deepest = std::max(deepest, size_t(m.position(2)));
    }
    EXPECT_LT(shallowest, 200u);
    EXPECT_GT(deepest, 700u);
  }
  auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TaskOptions o;
  EXPECT_NE(error_of([&] {
              std::mt19937_64 rng(1);
              make_task("passkey", o)->train_sequence(rng, 60);
            }).find("seq_len = 60"),
            std::string::npos);
  o.passkey_eval_len = 50;
  EXPECT_NE(error_of([&] { make_task("passkey", o); }).find("passkey_eval_len = 50"), std::string::npos);
  o = {};
  o.passkey_digits = 0;
  EXPECT_NE(error_of([&] { make_task("passkey", o); }).find("passkey_digits"), std::string::npos);
}

TEST(tasks, KvRetrievalQueriesReachEveryPosition) {
  TaskOptions options;
  options.kv_pairs = 16;
  std::set<size_t> positions;
  for (const EvalProblem& p : make_task("kv_retrieval", options)->eval_problems(400, 9))
  {
    std::string quoted_key = "\"";  // appended, not "\"" + ...: GCC 12 warns falsely (-Wrestrict) on that
    quoted_key.append(p.prompt, p.prompt.size() - 4, 3).push_back('"');
    positions.insert(p.prompt.find(quoted_key));
  }
  EXPECT_EQ(positions.size(), 16u);
}

const std::vector<std::string> kCharTasks = {"addition", "substring_index", "substring_search", "kv_retrieval"};

TEST(tasks, SameSeedSameRowsOtherSeedOtherRows) {
  for (const std::string& name : kCharTasks) {
    const auto task = make_task(name);
    std::mt19937_64 a(11), b(11), c(12);
    for (int i = 0; i < 3; ++i) {
      const TrainSequence sa = task->train_sequence(a, 256), sb = task->train_sequence(b, 256),
                          sc = task->train_sequence(c, 256);
      EXPECT_EQ(sa.tokens, sb.tokens) << name;
      EXPECT_EQ(sa.loss_mask, sb.loss_mask) << name;
      EXPECT_NE(sa.tokens, sc.tokens) << name;
    }
    EXPECT_EQ(task->heldout_sequence(5, 2, 200).tokens, task->heldout_sequence(5, 2, 200).tokens) << name;
    EXPECT_NE(task->heldout_sequence(5, 2, 200).tokens, task->heldout_sequence(5, 3, 200).tokens) << name;
    EXPECT_NE(task->heldout_sequence(5, 2, 200).tokens, task->heldout_sequence(6, 2, 200).tokens) << name;
    std::mt19937_64 train_rng(5);
    EXPECT_NE(task->heldout_sequence(5, 0, 200).tokens, task->train_sequence(train_rng, 200).tokens) << name;
    EXPECT_EQ(task->heldout_rows(200), 0) << name;
    const auto p1 = task->eval_problems(5, 1), p1_again = task->eval_problems(5, 1), p2 = task->eval_problems(5, 2);
    ASSERT_EQ(p1.size(), 5u);
    for (size_t i = 0; i < p1.size(); ++i) EXPECT_EQ(p1[i].prompt, p1_again[i].prompt) << name;
    EXPECT_NE(p1[0].prompt + p1[1].prompt, p2[0].prompt + p2[1].prompt) << name;
  }
}

TEST(tasks, RowsNeverHoldPadAndRowsStartAnywhereInAProblem) {
  for (const char* name : {"addition", "substring_index", "kv_retrieval"}) {
    const auto task = make_task(name);
    std::mt19937_64 rng(1);
    std::set<int32_t> first_tokens;
    for (int i = 0; i < 200; ++i) {
      const TrainSequence s = task->train_sequence(rng, 320);
      for (const int32_t id : s.tokens) ASSERT_NE(id, task->vocab().pad_id());
      first_tokens.insert(s.tokens[0]);
    }
    EXPECT_GT(first_tokens.size(), 5u) << name << ": rows must not all start at a problem's '?' or '{'";
  }
}

TEST(tasks, VocabRoundTripAndRejections) {
  for (const std::string& name : kCharTasks) {
    const auto task = make_task(name);
    const Vocab& vocab = task->vocab();
    std::mt19937_64 rng(2);
    const TrainSequence s = task->train_sequence(rng, 200);
    const std::string text = vocab.decode(s.tokens);
    EXPECT_EQ(text.size(), s.tokens.size());
    EXPECT_EQ(vocab.encode(text), s.tokens) << name;
    std::vector<int32_t> with_pad = s.tokens;
    with_pad.insert(with_pad.begin() + 3, vocab.pad_id());
    EXPECT_EQ(vocab.decode(with_pad), text) << "pad decodes to nothing";
    EXPECT_THROW(vocab.decode({vocab.size()}), Error);
    EXPECT_THROW(vocab.decode({-1}), Error);
    try {
      vocab.encode(text.substr(0, 2) + "!");
      ADD_FAILURE() << name << " accepted '!'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'!'"), std::string::npos) << e.what();
    }
  }
}

TEST(tasks, UnknownNamesAndBadOptionsAreRejected) {
  try {
    make_task("multiplication");
    ADD_FAILURE() << "unknown task accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("multiplication"), std::string::npos);
    for (const std::string& name : task_names()) EXPECT_NE(what.find(name), std::string::npos) << what;
  }
  auto rejects = [](const std::string& task, TaskOptions o, const std::string& field) {
    try {
      make_task(task, o);
      ADD_FAILURE() << task << " accepted a bad " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  TaskOptions o;
  o.max_digits = 0;
  rejects("addition", o, "max_digits");
  o = {};
  o.min_string = 5;
  o.max_string = 4;
  rejects("substring_index", o, "max_string");
  o = {};
  o.search_substring = 1;
  rejects("substring_search", o, "search_substring");
  o = {};
  o.kv_pairs = 0;
  rejects("kv_retrieval", o, "kv_pairs");
  o = {};
  o.text_vocab = 10;
  rejects("text", o, "text_vocab");
  o = {};
  o.text_tokenizer = "word";
  rejects("text", o, "text_tokenizer");
  std::mt19937_64 rng(0);
  EXPECT_THROW(make_task("addition")->train_sequence(rng, 0), Error);
  EXPECT_THROW(make_task("addition")->eval_problems(-1, 0), Error);
  EXPECT_THROW(make_task("addition")->heldout_sequence(0, -1, 10), Error);
}

TEST(tasks, BoundedIntegersAreUniformAndInRange) {
  std::mt19937_64 rng(4);
  const uint64_t n = 3;
  std::vector<int> counts(n, 0);
  const int draws = 300000;
  for (int i = 0; i < draws; ++i) {
    const uint64_t v = uniform_below(rng, n);
    ASSERT_LT(v, n);
    ++counts[v];
  }
  // Each count is Binomial(300000, 1/3): standard deviation 258; 6 sigma misses with probability ~1e-9.
  for (const int c : counts) EXPECT_NEAR(c, draws / 3, 6 * 258);
  std::set<int64_t> seen;
  for (int i = 0; i < 1000; ++i) seen.insert(uniform_int(rng, -2, 2));
  EXPECT_EQ(seen, (std::set<int64_t>{-2, -1, 0, 1, 2}));
  EXPECT_THROW(uniform_below(rng, 0), Error);
}

TEST(tasks, KjvParserSplitsEveryTwentiethChapter) {
  std::string text;
  for (int c = 1; c <= 41; ++c) {
    text.append("\n").append(c % 2 ? "Book " : "2 Book ").append(std::to_string(c)).append("\n\n");
    for (int v = 1; v <= 3; ++v)
      text.append("  ").append(std::to_string(v)).append(" c" + std::to_string(c) + "v" + std::to_string(v) + "\n");
  }
  const KjvSplit split = parse_kjv(text);
  EXPECT_EQ(split.chapters, 41);
  EXPECT_EQ(split.heldout, (std::vector<std::string>{"c20v1", "c20v2", "c20v3", "c40v1", "c40v2", "c40v3"}));
  EXPECT_EQ(split.train.size(), 39u * 3);
  EXPECT_EQ(split.train.front(), "c1v1");
  std::string skipped = text;
  skipped.replace(skipped.find("  2 c7v2"), 8, "  3 c7v2");
  EXPECT_THROW(parse_kjv(skipped), Error);
  EXPECT_THROW(parse_kjv("  1 no heading\n"), Error);
}

// The text task's programs run through run_command: output is collected, and a failing or missing program is a
// rotary::Error that names what was being done, the command and its status.
TEST(tasks, RunCommandCollectsOutputAndNamesFailures) {
  const CommandResult ok = run_command({"sh", "-c", "echo out; echo err >&2; exit 0"});
  EXPECT_EQ(ok.status, 0);
  EXPECT_EQ(ok.out, "out\n");
  EXPECT_EQ(ok.err, "err\n");
  EXPECT_EQ(run_command({"sh", "-c", "exit 3"}).status, 3);
  EXPECT_EQ(run_command({"rotary-no-such-program"}).status, 127);
  try {
    run_command_or_fail("text tokenizer", {"sh", "-c", "echo broken model >&2; exit 4"}, "a working tokenizer");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("text tokenizer"), std::string::npos) << m;
    EXPECT_NE(m.find("status 4"), std::string::npos) << m;
    EXPECT_NE(m.find("broken model"), std::string::npos) << m;
    EXPECT_NE(m.find("a working tokenizer"), std::string::npos) << m;
  }
  EXPECT_THROW(run_command_or_fail("x", {"rotary-no-such-program"}, "y"), Error);
  EXPECT_THROW(run_command({}), Error);
}

bool have_bible() { return !find_in_path("bible").empty(); }

TEST(tasks, TextTaskTrainsCachesAndSplits) {
  if (!have_bible()) GTEST_SKIP() << "`bible` (bible-kjv) is not installed";
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("rotary_test_tasks_" + std::to_string(getpid()));
  fs::remove_all(dir);
  TaskOptions options;
  options.text_vocab = 300;
  options.cache_dir = dir.string();
  const auto task = make_task("text", options);
  EXPECT_EQ(task->vocab().size(), 300);
  EXPECT_EQ(task->stop(), "");
  EXPECT_TRUE(task->eval_problems(3, 0).empty());
  const fs::path model = dir / "kjv" / "bpe300.model";
  ASSERT_TRUE(fs::exists(model));
  for (const char* f : {"corpus_train.txt", "corpus_heldout.txt", "bpe300.train.ids", "bpe300.heldout.ids"})
    EXPECT_TRUE(fs::exists(dir / "kjv" / f)) << f;

  std::mt19937_64 rng(1);
  const TrainSequence s = task->train_sequence(rng, 128);
  ASSERT_EQ(s.tokens.size(), 129u);
  EXPECT_EQ(s.loss_mask, std::vector<float>(128, 1.0f));
  for (const int32_t id : s.tokens) ASSERT_TRUE(id >= 0 && id < 300);

  // A held-out window decodes to text of the held-out verses (joined by spaces, as they were tokenized).
  std::ifstream heldout_file(dir / "kjv" / "corpus_heldout.txt");
  std::string heldout_text, line;
  while (std::getline(heldout_file, line)) heldout_text += line + " ";
  // sentencepiece folds runs of spaces (the KJV has "...  And") into one.
  for (size_t at; (at = heldout_text.find("  ")) != std::string::npos;) heldout_text.erase(at, 1);
  const int64_t rows = task->heldout_rows(64);
  ASSERT_GT(rows, 10);
  for (const int index : {0, 5, int(rows) - 1}) {
    const std::string window = task->vocab().decode(task->heldout_sequence(0, index, 64).tokens);
    EXPECT_NE(heldout_text.find(window.substr(0, window.size() - 1)), std::string::npos) << window;
  }
  EXPECT_EQ(task->heldout_sequence(0, int(rows), 64).tokens, task->heldout_sequence(0, 0, 64).tokens);

  // encode (spm_encode, another process) and decode (the piece table, here) are inverse on plain text, and
  // encode gives the ids the cached corpus holds for the same verse.
  const std::string verse = "In the beginning God created the heaven and the earth.";
  const std::vector<int32_t> ids = task->vocab().encode(verse);
  EXPECT_GT(ids.size(), 5u);
  EXPECT_EQ(task->vocab().decode(ids), verse);
  const std::vector<int32_t> two_lines = task->vocab().encode(verse + "\n" + verse);
  EXPECT_EQ(two_lines.size(), 2 * ids.size());
  EXPECT_THROW(task->vocab().decode({300}), Error);

  // A second task reuses the cache (the model file is not rewritten) and gives the same rows; a corrupt ids
  // file is rebuilt.
  const auto written = fs::last_write_time(model);
  std::ofstream(dir / "kjv" / "bpe300.train.ids", std::ios::trunc) << "garbage";
  const auto again = make_task("text", options);
  EXPECT_EQ(fs::last_write_time(model), written);
  std::mt19937_64 rng_again(1);
  EXPECT_EQ(again->train_sequence(rng_again, 128).tokens, s.tokens);
  EXPECT_GT(fs::file_size(dir / "kjv" / "bpe300.train.ids"), 1000u);
  EXPECT_THROW(again->train_sequence(rng_again, 1 << 24), Error);
  fs::remove_all(dir);
}

// The char tokenizer (seed 002's Performer comparison is on characters): one token per character, the same
// verses and split as BPE, its own files in the same cache, decoding back to the held-out text.
TEST(tasks, TextTaskWithCharTokensHasOneTokenPerCharacter) {
  if (!have_bible()) GTEST_SKIP() << "`bible` (bible-kjv) is not installed";
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("rotary_test_chars_" + std::to_string(getpid()));
  fs::remove_all(dir);
  TaskOptions options;
  options.text_tokenizer = "char";
  options.cache_dir = dir.string();
  const auto task = make_task("text", options);
  // The KJV's letters, digits-free verses, punctuation, the word boundary and 4 specials: tens of tokens.
  EXPECT_GT(task->vocab().size(), 4 + 52);
  EXPECT_LT(task->vocab().size(), 128);
  for (const char* f : {"char.model", "char.vocab", "char.train.ids", "char.heldout.ids"})
    EXPECT_TRUE(fs::exists(dir / "kjv" / f)) << f;
  const std::string verse = "In the beginning God created the heaven and the earth.";
  const std::vector<int32_t> ids = task->vocab().encode(verse);
  EXPECT_EQ(ids.size(), verse.size() + 1) << "one per character, spaces included, and the leading word boundary";
  EXPECT_EQ(task->vocab().decode(ids), verse);
  const int64_t rows = task->heldout_rows(256);
  EXPECT_GT(rows, 4 * task->heldout_rows(1024) - 4);
  const std::string window = task->vocab().decode(task->heldout_sequence(0, 1, 256).tokens);
  EXPECT_GE(window.size(), 250u);
  EXPECT_LE(window.size(), 257u);
  fs::remove_all(dir);
}

// Files of the text task's cache read back wrong (found by fuzz/text_cache_fuzzer.cpp and by reading it): a verse
// number too long for an int escaped parse_kjv as std::out_of_range; an ids file whose count times 4 wraps
// around 2^64 to the bytes present was accepted, and read_ids then asked for 2^62 ids; a byte piece with no hex
// digits ("<0xZZ>") threw std::invalid_argument from decode.
TEST(tasks, CacheFilesReadBackOrAreRefusedCleanly) {
  std::string bible;
  for (int c = 1; c <= 20; ++c) bible += "\nGenesis " + std::to_string(c) + "\n\n  1 verse\n";
  EXPECT_EQ(parse_kjv(bible).chapters, 20);
  const std::string long_number = bible + "  99999999999999999999 verse\n";
  try {
    parse_kjv(long_number);
    ADD_FAILURE() << "a 20-digit verse number was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("99999999999999999999"), std::string::npos) << e.what();
  }

  namespace fs = std::filesystem;
  const fs::path path = fs::temp_directory_path() / ("rotary_test_ids_" + std::to_string(getpid()));
  const uint64_t hash = 0x0123456789abcdefULL;
  write_ids(path, hash, {5, 6, 7});
  std::vector<int32_t> ids;
  ASSERT_TRUE(read_ids(path, hash, ids));
  EXPECT_EQ(ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_FALSE(read_ids(path, hash + 1, ids));
  std::string bytes = read_file(path);
  const uint64_t wrapping_count = (uint64_t(1) << 62) + 3;  // times 4: 2^64 + 12, i.e. the 12 bytes there are
  bytes.replace(16, 8, reinterpret_cast<const char*>(&wrapping_count), 8);
  write_file_atomic(path, bytes);
  ids = {1};
  EXPECT_FALSE(read_ids(path, hash, ids));
  EXPECT_EQ(ids, std::vector<int32_t>{1}) << "a refused file leaves the ids alone";
  write_ids(path, hash, {5});
  write_file_atomic(path, read_file(path) + '\x00');  // one id and a stray byte
  EXPECT_FALSE(read_ids(path, hash, ids));
  fs::remove(path);

  const BpeVocab vocab("unused.model", "<unk>\t0\n<s>\t0\n</s>\t0\n<pad>\t0\n<0x41>\t0\n<0xZZ>\t0\n<0x4g>\t0\n");
  EXPECT_EQ(vocab.decode({4}), "A");
  EXPECT_EQ(vocab.decode({5, 6}), "<0xZZ><0x4g>") << "pieces that only look like bytes decode as their text";
  EXPECT_THROW(vocab.decode({7}), Error);
  EXPECT_THROW(BpeVocab("unused.model", "<unk>\t0\nno tab\n"), Error);
  EXPECT_EQ(parse_spm_ids(" 5 17\n0\n", 20), (std::vector<int32_t>{5, 17, 0}));
  EXPECT_THROW(parse_spm_ids("5 20", 20), Error);
  EXPECT_THROW(parse_spm_ids("5 x", 20), Error);
}

}  // namespace
}  // namespace rotary::lab
