// lab/experiments/extrapolate_eval.h: scoring one model (with one encoding override already set) at one test length, as
// seed 004 does: next-token accuracy and loss on the LAST L tokens of each window of T tokens, so every length
// scores the same L tokens and only the context before them grows.
//
// Windows come from base rows of max_len + 1 held-out tokens (the same rows at every length):
//   plain     the last T + 1 tokens of the row: ordinary long text (the seed's "non-repeated")
//   repeated  the row's last L tokens tiled to T + 1 tokens: each scored token's earlier copy sits L back (the
//             seed's "repeated"); at T = L it is ordinary text
// Scoring runs the full forward (prefill through the fused kernels) or, for methods whose frequencies depend on
// the length (dynamic NTK), decode_logits: prefill T - L tokens, then the last L one at a time through the
// KV-cache decoder, so each token is predicted with the frequencies for its own length.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rotary_nn/model.h"
#include "tasks/task.h"

namespace rotary::experiments {

enum class WindowMode { Plain, Repeated };
std::string mode_name(WindowMode m);  // "text", "repeated"

// n base rows of max_len + 1 consecutive held-out tokens (task.heldout_sequence at seq_len max_len, rows 0..n-1).
// rotary::Error naming `windows` if the task has fewer distinct held-out rows of that length.
std::vector<std::vector<int32_t>> heldout_base_rows(const lab::Task& task, int n, int max_len);

// The window of test_len + 1 tokens (inputs [0, T), targets [1, T]) cut from a base row.
std::vector<int32_t> make_window(const std::vector<int32_t>& row, int test_len, int train_len, WindowMode mode);

struct WindowScore {
  double loss = 0;      // mean cross entropy over the last train_len targets of every window
  double accuracy = 0;  // fraction of those targets that are the argmax
  int64_t tokens = 0;   // targets scored
  std::vector<double> loss_by_position;  // [T]: mean over windows of target t's loss (NaN where not computed)
};

// decode: score through decode_logits (prefill T - L, decode the rest) instead of the full forward.
WindowScore score_windows(nn::Transformer& model, const std::vector<std::vector<int32_t>>& rows, int test_len,
                          int train_len, WindowMode mode, bool decode, int batch_size);

struct RetrievalScore {
  double accuracy = 0;  // greedy exact match (answer + stop)
  int problems = 0;
  int kv_pairs = 0;           // pairs per prompt at this length
  double prompt_tokens = 0;   // mean prompt length
  double answer_distance = 0; // mean tokens from the queried pair's value to the end of the prompt
};

// Key-value retrieval at test length T: kv_retrieval problems with as many pairs as fit in T tokens
// ((T - 5) / 14), answers generated greedily through model->generate (prefill through the fused kernels, then the
// KV-cache decoder: for rerope / leaky_rerope the ReRoPE decode path). Same problems for every method.
RetrievalScore score_retrieval(nn::Transformer& model, int test_len, int problems, uint64_t seed);

// Pairs of a kv_retrieval prompt that fits in test_len tokens.
int kv_pairs_for_length(int test_len);

}  // namespace rotary::experiments
