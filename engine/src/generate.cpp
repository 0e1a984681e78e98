// The generation and the one sampling loop of rotary_engine/generate.h.
#include "rotary_engine/generate.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "rotary/error.h"

namespace rotary::engine {
namespace {

// The settings the sampling loop itself reads (check_sampling adds the prompt's).
void check_sampling_settings(const GenerateOptions& o, int64_t vocab_size) {
  check(o.max_new >= 0, "max_new", o.max_new, ">= 0");
  check(std::isfinite(o.temperature) && o.temperature >= 0, "temperature", o.temperature,
        "a finite value >= 0 (0: greedy)");
  check(std::isfinite(o.top_p) && o.top_p > 0 && o.top_p <= 1, "top_p", o.top_p, "in (0, 1] (1: every id)");
  check(o.sample_vocab >= 0 && o.sample_vocab <= vocab_size, "sample_vocab", o.sample_vocab,
        "in [0, vocab_size = " + std::to_string(vocab_size) + "] (0: every id)");
}

}  // namespace

void check_sampling(int64_t prompt_tokens, const GenerateOptions& o, int64_t vocab_size) {
  check(prompt_tokens >= 1, "prompt tokens", prompt_tokens, ">= 1");
  check_sampling_settings(o, vocab_size);
}

TokenSampler::TokenSampler(const GenerateOptions& options, int64_t vocab_size)
    : options_(options), ids_(options.sample_vocab > 0 ? options.sample_vocab : vocab_size), rng_(options.seed) {
  check_sampling_settings(options, vocab_size);
  if (options.temperature > 0) p_.resize(size_t(ids_));
}

bool TokenSampler::is_stop(int64_t token) const {
  return std::find(options_.stop_ids.begin(), options_.stop_ids.end(), token) != options_.stop_ids.end();
}

int64_t TokenSampler::choose(const float* logits, int64_t pos) {
  const int64_t V = ids_;
  for (int64_t i = 0; i < V; ++i)
    if (!std::isfinite(logits[i]))
      fail("logits[" + std::to_string(i) + "] at position " + std::to_string(pos - 1), to_text(logits[i]),
           "finite values (are the model's weights finite? do its position settings overflow float?)");
  int64_t next = std::max_element(logits, logits + V) - logits;
  if (options_.temperature <= 0) return next;
  const double top = logits[next];
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += p_[size_t(i)] = std::exp((double(logits[i]) - top) / options_.temperature);
  if (options_.top_p >= 1) {
    double u = std::uniform_real_distribution<double>(0, sum)(rng_);
    for (next = 0; next < V - 1 && u >= p_[size_t(next)]; ++next) u -= p_[size_t(next)];
    return next;
  }
  // The nucleus: ids by falling probability (ties by id) until their sum first reaches top_p of the whole.
  order_.resize(size_t(V));
  for (int64_t i = 0; i < V; ++i) order_[size_t(i)] = i;
  std::sort(order_.begin(), order_.end(), [&](int64_t a, int64_t b) {
    return p_[size_t(a)] > p_[size_t(b)] || (p_[size_t(a)] == p_[size_t(b)] && a < b);
  });
  double kept = 0;
  int64_t n = 0;
  while (n < V && (n == 0 || kept < options_.top_p * sum)) kept += p_[size_t(order_[size_t(n++)])];
  double u = std::uniform_real_distribution<double>(0, kept)(rng_);
  int64_t i = 0;
  for (; i < n - 1 && u >= p_[size_t(order_[size_t(i)])]; ++i) u -= p_[size_t(order_[size_t(i)])];
  return order_[size_t(i)];
}

std::vector<int64_t> sample_tokens(const GenerateOptions& o, int64_t vocab_size, const float* logits,
                                   int64_t position, const FeedToken& feed) {
  TokenSampler sampler(o, vocab_size);
  std::vector<int64_t> out;
  if (o.max_new == 0) return out;
  for (int64_t pos = position;; ++pos) {
    const int64_t next = sampler.choose(logits, pos);
    if (sampler.is_stop(next)) break;
    out.push_back(next);
    if (o.on_token) o.on_token(next);
    if (int64_t(out.size()) == o.max_new) break;
    logits = feed(next, pos);
  }
  return out;
}

std::vector<int64_t> generate(Session& session, const std::vector<int64_t>& prompt, const GenerateOptions& o) {
  const Architecture& a = session.model().arch();
  check_sampling(int64_t(prompt.size()), o, a.vocab_size);
  const int64_t S = int64_t(prompt.size()), held = session.size();
  check(held + S + std::max<int64_t>(o.max_new - 1, 0) <= session.capacity(),
        "tokens held + prompt tokens + max_new - 1", held + S + std::max<int64_t>(o.max_new - 1, 0),
        "<= the session's capacity = " + std::to_string(session.capacity()));
  std::vector<int64_t> positions(static_cast<size_t>(S));
  const int64_t first = session.next_position();  // after the tokens the session holds (a saved context's)
  for (int64_t i = 0; i < S; ++i) positions[size_t(i)] = first + i;
  // With a memory the prompt goes in a chunk per forward() call: activations for one chunk, however long it is.
  const std::optional<MemoryOptions>& memory = session.options().memory;
  const int64_t piece = memory ? std::max<int64_t>(1, memory->chunk_tokens()) : S;
  std::vector<float> hidden(size_t(std::min(S, piece) * a.d_model)), logits(size_t(a.vocab_size));
  int64_t n = 0;
  for (int64_t t0 = 0; t0 < S; t0 += n) {
    n = std::min(piece, S - t0);
    session.forward(prompt.data() + t0, positions.data() + t0, n, hidden.data());
    if (o.on_prompt) o.on_prompt(t0 + n, S);
  }
  if (o.max_new == 0) return {};  // the prompt read (into the caches), nothing generated
  session.logits(hidden.data() + (n - 1) * a.d_model, 1, logits.data());
  return sample_tokens(o, a.vocab_size, logits.data(), first + S, [&](int64_t token, int64_t pos) {
    session.forward(&token, &pos, 1, hidden.data());
    session.logits(hidden.data(), 1, logits.data());
    return static_cast<const float*>(logits.data());
  });
}

}  // namespace rotary::engine
