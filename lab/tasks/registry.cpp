// lab/tasks/registry.cpp: task names -> tasks, and the exact-match scoring shared by the trainer and tests.
#include <string>

#include "rotary/error.h"
#include "rotary/settings.h"
#include "tasks/char_task.h"

namespace rotary::lab {

std::vector<std::string> task_names() {
  return {"addition", "substring_index", "substring_search", "kv_retrieval", "passkey", "text"};
}

const settings::Table<TaskOptions>& task_option_settings() {
  using namespace settings;
  static const Table<TaskOptions> table = [] {
    using O = TaskOptions;
    Table<O> t;
    t.push_back(field<O>("max_digits", "--max-digits", "addition: operands have up to this many digits",
                         [](auto& o) -> auto& { return o.max_digits; }, integers(1, 200)));
    t.push_back(field<O>("min_string", "--min-string", "substring_index: shortest string",
                         [](auto& o) -> auto& { return o.min_string; }, integers(1, 1000)));
    t.push_back(field<O>("max_string", "--max-string", "substring_index: longest string (>= min_string)",
                         [](auto& o) -> auto& { return o.max_string; }, integers(1, 1000)));
    t.push_back(field<O>("search_substring", "--search-substring", "substring_search: copied substring length",
                         [](auto& o) -> auto& { return o.search_substring; }, integers(2, 64)));
    t.push_back(field<O>("search_eval_len", "--search-eval-len",
                         "substring_search: context before an eval problem's '>' (>= search_substring)",
                         [](auto& o) -> auto& { return o.search_eval_len; }, integers(2, 1 << 20)));
    t.push_back(field<O>("kv_pairs", "--kv-pairs", "kv_retrieval: pairs per object (at most 26^kv_key_len)",
                         [](auto& o) -> auto& { return o.kv_pairs; }, integers(1, 456976)));
    // Added later: written only when not the seed's value, so earlier runs' stored configs keep their form.
    t.push_back(field<O>("kv_key_len", "--kv-key-len", "kv_retrieval: letters per key",
                         [](auto& o) -> auto& { return o.kv_key_len; }, integers(1, 4)));
    t.back().written = [](const O& o) { return o.kv_key_len != 3; };
    t.push_back(field<O>("kv_queries", "--kv-queries", "kv_retrieval: queries after each object in training rows (distinct keys, at most one per pair)",
                         [](auto& o) -> auto& { return o.kv_queries; }, integers(1, 64)));
    t.back().written = [](const O& o) { return o.kv_queries != 1; };
    t.push_back(field<O>("kv_min_pairs", "--kv-min-pairs",
                         "kv_retrieval: > 0: training objects have a uniform number of pairs in [kv_min_pairs, "
                         "kv_pairs] (a curriculum by mixing; eval keeps kv_pairs); 0: always kv_pairs",
                         [](auto& o) -> auto& { return o.kv_min_pairs; }, integers(0, 456976)));
    t.back().written = [](const O& o) { return o.kv_min_pairs != 0; };
    t.push_back(field<O>("kv_loss", "--kv-loss",
                         "kv_retrieval: which characters of a training row are in the loss: answers (the values after "
                         "'=' and their '#') or all (every character, as a language model)",
                         [](auto& o) -> auto& { return o.kv_loss; },
                         names([] { return std::vector<std::string>{"answers", "all"}; })));
    t.back().written = [](const O& o) { return o.kv_loss != "answers"; };
    t.push_back(field<O>("kv_near_keys", "--kv-near-keys",
                         "kv_retrieval: chance that a training object's key is an earlier key with one letter changed "
                         "(hard negatives; eval keeps random keys)",
                         [](auto& o) -> auto& { return o.kv_near_keys; }, reals(0, 1)));
    t.back().written = [](const O& o) { return o.kv_near_keys != 0; };
    t.push_back(field<O>("passkey_digits", "--passkey-digits", "passkey: distinct digits of the hidden key",
                         [](auto& o) -> auto& { return o.passkey_digits; }, integers(1, 10)));
    t.back().written = [](const O& o) { return o.passkey_digits != 5; };
    t.push_back(field<O>("passkey_eval_len", "--passkey-eval-len",
                         "passkey: characters of an eval prompt (filler, needle and question)",
                         [](auto& o) -> auto& { return o.passkey_eval_len; }, integers(1, 1 << 24)));
    t.back().written = [](const O& o) { return o.passkey_eval_len != 256; };
    t.push_back(field<O>("text_tokenizer", "--text-tokenizer",
                         "text: bpe (sentencepiece BPE, --text-vocab pieces) or char (one token per character)",
                         [](auto& o) -> auto& { return o.text_tokenizer; },
                         names([] { return std::vector<std::string>{"bpe", "char"}; })));
    // Added later: written only when it is not the default, so the stored configs of earlier runs keep their form
    // (a resumed run compares them field by field).
    t.back().written = [](const O& o) { return o.text_tokenizer != "bpe"; };
    t.push_back(field<O>("text_vocab", "--text-vocab", "text: sentencepiece BPE vocabulary size (bpe only)",
                         [](auto& o) -> auto& { return o.text_vocab; }, integers(128, 32000)));
    t.push_back(field<O>("cache_dir", "--cache-dir", "text: corpus and tokenizer cache",
                         [](auto& o) -> auto& { return o.cache_dir; },
                         text(false, "empty = $XDG_CACHE_HOME/rotary or ~/.cache/rotary")));
    return t;
  }();
  return table;
}

std::unique_ptr<Task> make_task(const std::string& name, const TaskOptions& options) {
  settings::check(task_option_settings(), options);  // each option in its range; the tasks check the rest
  if (name == "addition") return make_addition_task(options);
  if (name == "substring_index") return make_substring_index_task(options);
  if (name == "substring_search") return make_substring_search_task(options);
  if (name == "kv_retrieval") return make_kv_retrieval_task(options);
  if (name == "passkey") return make_passkey_task(options);
  if (name == "text") return make_text_task(options);
  std::string allowed;
  for (const std::string& n : task_names()) allowed += (allowed.empty() ? "" : ", ") + n;
  fail("task", name, allowed);
}

bool exact_match(const std::string& generated, const EvalProblem& problem, const std::string& stop) {
  return generated.compare(0, problem.answer.size() + stop.size(), problem.answer + stop) == 0;
}

bool final_answer_match(const std::string& generated, const EvalProblem& problem, const std::string& stop) {
  std::string before_stop = generated.substr(0, problem.answer.size());
  if (!stop.empty()) {
    const size_t at = generated.find(stop);
    if (at == std::string::npos) return false;  // the answer never ended
    before_stop = generated.substr(0, at);
  }
  const std::string& want = problem.final_answer;
  return before_stop.size() >= want.size() &&
         before_stop.compare(before_stop.size() - want.size(), want.size(), want) == 0;
}

}  // namespace rotary::lab
