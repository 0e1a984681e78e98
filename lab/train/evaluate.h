// lab/train/evaluate.h: batches from task rows, the masked next-token loss, held-out loss (overall and by
// position) and exact-match accuracy through the KV-cache decoder.
#pragma once

#include <functional>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "rotary_nn/model.h"
#include "tasks/task.h"

namespace rotary::train {

struct Batch {
  torch::Tensor inputs;   // [B, S] int64: tokens[0, S)
  torch::Tensor targets;  // [B, S] int64: tokens[1, S]
  torch::Tensor mask;     // [B, S] float32: loss weight of each target
};

// Rows [first, first + count) of `rows` (each seq_len + 1 tokens) as a batch; rotary::Error if a row has the
// wrong length (a task bug would otherwise show up as a shape error deep in torch).
Batch make_batch(const std::vector<lab::TrainSequence>& rows, int seq_len, size_t first, size_t count);

// Per-target cross entropy [B, S] (float32, not yet masked) of the model on a batch.
torch::Tensor token_losses(nn::Transformer& model, const Batch& batch);

struct HeldoutLoss {
  double loss = 0;                       // sum(mask * ce) / sum(mask) over all rows
  double weight = 0;                     // sum(mask)
  std::vector<double> loss_by_position;  // [S]: mean ce of target t over rows where it is weighted (NaN if none)
  std::vector<double> weight_by_position;  // [S]
};

// Held-out rows 0 .. rows-1 of task.heldout_sequence(seed, i, seq_len), in batches of batch_size; no grad, eval
// mode.
HeldoutLoss heldout_loss(nn::Transformer& model, const lab::Task& task, int seq_len, int rows, int batch_size,
                         uint64_t seed);

struct ProblemResult {
  std::string prompt, answer, generated;  // generated ends with the stop string if the model produced it
  bool correct = false;
};
struct Accuracy {
  int correct = 0, total = 0;
  double value() const { return total ? static_cast<double>(correct) / total : 0.0; }
  std::vector<ProblemResult> results;
};

// Exact match on task.eval_problems(n, seed), scored by lab::exact_match: generate from each prompt (temperature
// 0 = greedy; otherwise sampling with seed sample_seed + i) at most the answer's tokens + the stop token.
Accuracy exact_match(nn::Transformer& model, const lab::Task& task, int n, uint64_t seed, double temperature,
                     uint64_t sample_seed);
// The same with another decoder (a retrieval memory's, rotary memory): generate(prompt, max_new, stop_id, seed)
// returns the generated ids without the stop, as TransformerImpl::generate does.
using GenerateFn = std::function<std::vector<int64_t>(const std::vector<int64_t>& prompt, int max_new,
                                                      int64_t stop_id, uint64_t seed)>;
Accuracy exact_match(nn::Transformer& model, const lab::Task& task, int n, uint64_t seed, uint64_t sample_seed,
                     const GenerateFn& generate);

// The token id of the task's stop string, or -1 if it is not a single token (then generation runs to max_new).
int64_t stop_token(const lab::Task& task);

// Before any training: rotary::Error naming the field if a row of seq_len tokens or the longest of the n eval
// problems (prompt + answer + stop, as exact_match generates it) needs more positions than the model has (learned
// absolute positions: model.max_seq_len), so a run cannot fail at its first evaluation after its steps are done.
void check_positions_suffice(const nn::ModelConfig& model, const lab::Task& task, int seq_len, int n, uint64_t seed);

}  // namespace rotary::train
