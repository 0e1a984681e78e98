// rotary_engine/generate.h: the engine's generation - a prompt through one fused forward, then one token at a
// time through the KV caches - and the one sampling loop of every generate in rotary (this one and the nn model's,
// nn/src/generate.cpp), each token chosen greedily or sampled at a temperature from the LM head's logits.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "rotary_engine/model.h"

namespace rotary::engine {

// The sampling settings of every generate (the engine's and the nn model's: one rule, one check, one seed).
struct GenerateOptions {
  int64_t max_new = 16;      // new tokens at most
  double temperature = 0;    // 0: greedy (the lowest id among equal maxima); > 0: softmax(logits / T) sampled
  double top_p = 1;          // in (0, 1]; < 1 (with temperature > 0): only the most probable ids whose probabilities
                             // first reach top_p of the whole are drawn from (nucleus sampling); 1: every id
  std::vector<int64_t> stop_ids;  // tokens that end generation (not returned): a model's end of text, a chat
                                  // template's end of turn; empty: none
  uint64_t seed = 0;         // the sampler's seed (mt19937_64): equal seeds give equal samples on either engine
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

// The checks every generate makes on its sampling settings before it runs: rotary::Error naming the argument
// (prompt tokens >= 1, max_new >= 0, a finite temperature >= 0, sample_vocab in [0, vocab_size]).
void check_sampling(int64_t prompt_tokens, const GenerateOptions& options, int64_t vocab_size);

// The sampling rule of sample_tokens one choice at a time, for callers that hold several sequences and choose each
// one's next token when its logits are ready (the server's slots). One mt19937_64(seed) per sequence: the same
// options give the same tokens as sample_tokens on the same logits. The options are checked at construction
// (check_sampling, prompt aside).
class TokenSampler {
 public:
  TokenSampler(const GenerateOptions& options, int64_t vocab_size);
  // The next token after `logits` (vocab_size floats, the ones after the token at `position` - 1); rotary::Error
  // naming the id and the position for a non-finite logit among those considered.
  int64_t choose(const float* logits, int64_t position);
  bool is_stop(int64_t token) const;  // one of options.stop_ids

 private:
  GenerateOptions options_;
  int64_t ids_;  // ids considered: sample_vocab, else vocab_size
  std::mt19937_64 rng_;
  std::vector<double> p_;
  std::vector<int64_t> order_;  // top_p: ids by probability
};

// Feeds `token` at `position` to the model and returns the logits after it: vocab_size floats, valid until the
// next call.
using FeedToken = std::function<const float*(int64_t token, int64_t position)>;

// The one sampling loop of every generate - the engine's above and the nn model's (a checkpoint under
// `rotary generate --engine torch`, a lab run's model, decoding through a memory) - so the same seed gives the
// same tokens on either wherever their logits agree. `logits`: the vocab_size floats after the tokens before
// `position`. Each step chooses among ids [0, sample_vocab) (0: [0, vocab_size)): the first maximum at temperature
// 0, else a draw from softmax(logits / temperature) computed in double (one uniform of mt19937_64(seed) per draw);
// the loop ends at one of stop_ids (not returned) or after max_new tokens, and otherwise feeds the chosen token at
// position, position + 1, ... (the last token chosen is never fed), calling on_token with each token returned.
// Non-finite logits among the ids considered are a rotary::Error naming the id and the position, never a choice.
// The options are checked here as by check_sampling (prompt tokens aside); max_new 0 reads no logits.
std::vector<int64_t> sample_tokens(const GenerateOptions& options, int64_t vocab_size, const float* logits,
                                   int64_t position, const FeedToken& feed);

}  // namespace rotary::engine
