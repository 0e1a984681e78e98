// lab/tasks/char_task.cpp: row packing and the seeded streams shared by the algorithmic tasks.
#include "tasks/char_task.h"

#include <algorithm>

#include "rotary/error.h"
#include "tasks/random.h"

namespace rotary::lab {

void check_seq_len(int seq_len) { check(seq_len >= 1 && seq_len <= (1 << 24), "seq_len", seq_len, "[1, 2^24]"); }

TrainSequence to_train_sequence(const CharVocab& vocab, const MaskedText& text, int seq_len) {
  const size_t row = static_cast<size_t>(seq_len) + 1;
  check(text.text.size() >= row, "packed text length", text.text.size(), ">= seq_len + 1 = " + std::to_string(row));
  TrainSequence seq;
  seq.tokens = vocab.encode(text.text.substr(0, row));
  seq.loss_mask.resize(row - 1);
  for (size_t t = 0; t + 1 < row; ++t) seq.loss_mask[t] = text.target[t + 1] ? 1.0f : 0.0f;
  return seq;
}

TrainSequence pack_problems(std::mt19937_64& rng, const CharVocab& vocab, int seq_len, int64_t max_lead,
                            bool keep_lead_targets, const std::function<MaskedText(std::mt19937_64&)>& problem) {
  check_seq_len(seq_len);
  const size_t row = static_cast<size_t>(seq_len) + 1;
  MaskedText first = problem(rng);
  const int64_t lead_cap = std::max<int64_t>(0, std::min<int64_t>(int64_t(first.text.size()) - 1, max_lead));
  const size_t lead = static_cast<size_t>(uniform_int(rng, 0, lead_cap));
  const size_t from = first.text.size() - lead;
  MaskedText packed;
  packed.text = first.text.substr(from);
  packed.target.assign(first.target.begin() + static_cast<std::ptrdiff_t>(from), first.target.end());
  if (!keep_lead_targets) std::fill(packed.target.begin(), packed.target.end(), 0);
  while (packed.text.size() < row) {
    MaskedText next = problem(rng);
    packed.text += next.text;
    packed.target.insert(packed.target.end(), next.target.begin(), next.target.end());
  }
  return to_train_sequence(vocab, packed, seq_len);
}

TrainSequence CharTask::heldout_sequence(uint64_t seed, int index, int seq_len) const {
  check(index >= 0, "heldout index", index, ">= 0");
  std::mt19937_64 rng = derived_rng(seed, kHeldoutStream, static_cast<uint64_t>(index));
  return train_sequence(rng, seq_len);
}

std::vector<EvalProblem> CharTask::eval_problems(int n, uint64_t seed) const {
  check(n >= 0, "eval problems n", n, ">= 0");
  std::mt19937_64 rng = derived_rng(seed, kEvalStream, 0);
  std::vector<EvalProblem> problems;
  problems.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) problems.push_back(eval_problem(rng));
  return problems;
}

}  // namespace rotary::lab
