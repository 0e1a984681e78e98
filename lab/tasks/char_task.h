// lab/tasks/char_task.h: what the algorithmic tasks share: a character vocabulary, rows packed from problems,
// held-out rows and eval problems drawn from streams derived from a seed. Internal to rotary_tasks and its tests.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tasks/char_vocab.h"
#include "tasks/task.h"

namespace rotary::lab {

// Text with a flag per character: 1 where predicting that character counts in the loss.
struct MaskedText {
  std::string text;
  std::vector<uint8_t> target;  // [text.size()]

  void append(const std::string& s, bool is_target) {
    text += s;
    target.insert(target.end(), s.size(), is_target ? 1 : 0);
  }
};

// Tokens of the first seq_len + 1 characters; loss_mask[t] = target[t + 1] (the first character is never a
// target). Throws if the text is shorter.
TrainSequence to_train_sequence(const CharVocab& vocab, const MaskedText& text, int seq_len);

// A row of seq_len + 1 characters packed from problems back to back: the last `lead` characters of a first
// problem (lead uniform in [0, min(size - 1, max_lead)], so rows start anywhere inside a problem), then whole
// problems, the last one cut. keep_lead_targets = false drops the loss on the lead (its beginning is not in the
// row, so its answer may be unknowable).
TrainSequence pack_problems(std::mt19937_64& rng, const CharVocab& vocab, int seq_len, int64_t max_lead,
                            bool keep_lead_targets, const std::function<MaskedText(std::mt19937_64&)>& problem);

class CharTask : public Task {
 public:
  explicit CharTask(std::string alphabet) : vocab_(std::move(alphabet)) {}
  const Vocab& vocab() const override { return vocab_; }
  TrainSequence heldout_sequence(uint64_t seed, int index, int seq_len) const override;
  std::vector<EvalProblem> eval_problems(int n, uint64_t seed) const override;

 protected:
  virtual EvalProblem eval_problem(std::mt19937_64& rng) const = 0;
  const CharVocab& char_vocab() const { return vocab_; }

 private:
  CharVocab vocab_;
};

void check_seq_len(int seq_len);

std::unique_ptr<Task> make_addition_task(const TaskOptions& options);
std::unique_ptr<Task> make_substring_index_task(const TaskOptions& options);
std::unique_ptr<Task> make_substring_search_task(const TaskOptions& options);
std::unique_ptr<Task> make_kv_retrieval_task(const TaskOptions& options);
std::unique_ptr<Task> make_passkey_task(const TaskOptions& options);
std::unique_ptr<Task> make_text_task(const TaskOptions& options);

}  // namespace rotary::lab
