// lab/tasks/task.h: the seeds' tasks as deterministic generators of training sequences and evaluation problems.
// Torch-free: the trainer turns token ids into tensors. Formats, loss masks and splits: docs/tasks.md.
//
//   addition          seed 000: "?d=77+38446365; 7e0+5e0+0e0==12e0 and ... and d==38446442#", problems packed
//   substring_index   seed 000: "?s='dyjeofuxvejmg'; s[8:]=='vejmg'#"
//   substring_search  seed 000: 4-letter alphabet + '>': random text, then '>' and a substring copied from earlier;
//                     loss only on the copied characters after the first
//   kv_retrieval      seed 001: '{"abc": "xyz", "qrs": "tuv"} qrs=tuv#': a JSON object of key/value pairs, then a
//                     query for one key; loss only on the answer and '#'
//   passkey           Landmark / InfLLM: "the grass is green. ... the pass key is:71432. remember it. ... what is
//                     the pass key? the pass key is:71432#": a key hidden in repeated filler (issue 9's memory test)
//   text              the KJV Bible (`bible` from bible-kjv), sentencepiece BPE (or characters) trained once and
//                     cached; every 20th chapter held out
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "rotary/settings.h"

namespace rotary::lab {

// Maps text to token ids and back. Character vocabularies for the algorithmic tasks; BPE for text.
class Vocab {
 public:
  virtual ~Vocab() = default;
  virtual int size() const = 0;
  // Character vocabularies throw rotary::Error naming an unknown character; BPE maps it to <unk>.
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // Pad ids decode to nothing; an id outside [0, size()) throws rotary::Error.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int32_t pad_id() const = 0;
};

// One training row: inputs tokens[0, L), targets tokens[1, L]; loss_mask[t] weights target t, i.e. the
// prediction of tokens[t + 1] (size L). Values are 0 or 1.
struct TrainSequence {
  std::vector<int32_t> tokens;  // [L + 1]
  std::vector<float> loss_mask;  // [L]
};

// An exact-match problem: feed `prompt`, generate greedily answer.size() + stop.size() tokens (the character
// tasks have one token per character), then score with exact_match / final_answer_match below.
struct EvalProblem {
  std::string prompt;
  std::string answer;        // what must follow the prompt, without the stop string
  std::string final_answer;  // a suffix of `answer` that is the result alone (addition: "d==<sum>"); else answer
};

// Correct iff `generated` (the continuation of the prompt) starts with answer + stop: the model must also end
// the answer where it ends. With an empty stop, iff it starts with answer.
bool exact_match(const std::string& generated, const EvalProblem& problem, const std::string& stop);
// Correct iff the generation holds the stop and the text before it ends with final_answer (addition: the right
// sum, whatever the steps; give a model room for longer steps when scoring this). With an empty stop, the first
// answer.size() characters are taken.
bool final_answer_match(const std::string& generated, const EvalProblem& problem, const std::string& stop);

struct TaskOptions {
  int max_digits = 8;                   // addition: operands have 1..max_digits digits, in [1, 200]
  int min_string = 4, max_string = 16;  // substring_index: string length range, 1 <= min <= max <= 1000
  int search_substring = 6;             // substring_search: copied substring length, in [2, 64]
  int search_eval_len = 256;            // substring_search: characters of context before an eval problem's '>'
  int kv_pairs = 8;                     // kv_retrieval: pairs per object, in [1, 26^4] (<= 26^kv_key_len)
  int kv_min_pairs = 0;                 // kv_retrieval: > 0: each training object has a uniform number of pairs in
                                        // [kv_min_pairs, kv_pairs] (easy objects among hard ones: the lookup forms on
                                        // the easy ones); eval problems keep kv_pairs; 0: always kv_pairs
  int kv_key_len = 3;                   // kv_retrieval: letters per key, in [1, 4] (3 in the seed)
  int kv_queries = 1;                   // kv_retrieval: queries (distinct keys, at most kv_pairs) after each object in training rows, in [1, 64]
  std::string kv_loss = "answers";      // kv_retrieval: loss on the answers only, or on every character ("all")
  double kv_near_keys = 0;               // kv_retrieval: chance that a training object's key (after its first) is an
                                        // earlier key with one letter changed (hard negatives: a lookup that matches
                                        // one letter of two picks the wrong pair); eval keeps the seed's draws; in [0, 1]
  int passkey_digits = 5;               // passkey: distinct digits of the key, in [1, 10]
  int passkey_eval_len = 256;           // passkey: characters of an eval prompt, in [needle + question, 2^24]
  std::string text_tokenizer = "bpe";   // text: bpe (sentencepiece BPE of text_vocab pieces) | char (one token per
                                        // character of the training verses: seed 002's enwik8-style char models)
  int text_vocab = 2000;                // text: sentencepiece BPE vocabulary size, in [128, 32000] (bpe only)
  std::string cache_dir;  // text: corpus and tokenizer cache ("" = $XDG_CACHE_HOME/rotary or ~/.cache/rotary)
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  virtual const Vocab& vocab() const = 0;
  // A training row of seq_len + 1 tokens; deterministic for the generator's state.
  virtual TrainSequence train_sequence(std::mt19937_64& rng, int seq_len) const = 0;
  // Held-out rows, deterministic for (seed, index). Algorithmic tasks: train_sequence on a generator derived from
  // (seed, index) in a stream apart from eval problems. Text: consecutive windows of the held-out chapters,
  // index taken modulo heldout_rows(seq_len); the seed is not used.
  virtual TrainSequence heldout_sequence(uint64_t seed, int index, int seq_len) const = 0;
  // Distinct held-out rows of this length: 0 = unbounded (generated tasks), else the number of text windows.
  virtual int64_t heldout_rows(int seq_len) const { return 0; }
  // N fresh problems for exact-match accuracy (empty for text). Deterministic for `seed`.
  virtual std::vector<EvalProblem> eval_problems(int n, uint64_t seed) const = 0;
  // The stop string that ends an answer ("#" for addition, substring_index and kv_retrieval; "" for
  // substring_search, whose copies are followed by random text, and text).
  virtual std::string stop() const = 0;
};

// Every task option declared once (JSON path, flag, help, allowed values): the run config, its flags and TOML
// files and make_task's checks all use it.
const settings::Table<TaskOptions>& task_option_settings();

// The task names, for error messages and --help.
std::vector<std::string> task_names();
// Throws rotary::Error("rotary: task = foo is invalid; allowed: addition, ...") for an unknown name, and names
// the option and its range for an option out of range. "text" trains its tokenizer on first use (seconds).
std::unique_ptr<Task> make_task(const std::string& name, const TaskOptions& options = {});

}  // namespace rotary::lab
