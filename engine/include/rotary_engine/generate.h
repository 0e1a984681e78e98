// rotary_engine/generate.h: the engine's sampling loop - a prompt through one fused forward, then one token at a
// time through the KV caches, each chosen greedily or sampled at a temperature from the LM head's logits.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "rotary_engine/model.h"

namespace rotary::engine {

struct GenerateOptions {
  int64_t max_new = 16;      // new tokens at most
  double temperature = 0;    // 0: greedy (the lowest id among equal maxima); > 0: softmax(logits / T) sampled
  int64_t stop_id = -1;      // a token that ends generation (not returned); -1: none
  uint64_t seed = 0;         // the sampler's seed (mt19937_64): equal seeds give equal samples
  int64_t sample_vocab = 0;  // > 0: only ids below this are chosen (a checkpoint's embedding rows past its
                             // tokenizer's vocabulary are padding, never a token); 0: the whole vocabulary
  std::function<void(int64_t)> on_token;  // called with each new token as it is chosen (streaming output)
  std::function<void(int64_t done, int64_t total)> on_prompt;  // prompt tokens through (progress; with a memory
                                                                // after each chunk, else once)
};

// Runs `prompt` after the tokens the session holds (positions from Session::next_position(): 0, 1, ... in an empty
// session; after a saved context's tokens) - with a memory a chunk per forward call - and returns the new tokens
// (max_new 0: the prompt read into the caches, none). rotary::Error naming the field when the options or the
// prompt do not fit the session (capacity >= tokens held + prompt + max_new - 1), or when the logits are not
// finite (a model with NaN / Inf weights): never a silent choice.
std::vector<int64_t> generate(Session& session, const std::vector<int64_t>& prompt, const GenerateOptions& options);

}  // namespace rotary::engine
