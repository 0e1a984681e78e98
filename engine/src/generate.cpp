// The sampling loop of rotary_engine/generate.h.
#include "rotary_engine/generate.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "rotary/error.h"

namespace rotary::engine {

std::vector<int64_t> generate(Session& session, const std::vector<int64_t>& prompt, const GenerateOptions& o) {
  const Architecture& a = session.model().arch();
  check(!prompt.empty(), "prompt tokens", 0, ">= 1");
  check(o.max_new >= 0, "max_new", o.max_new, ">= 0");
  check(std::isfinite(o.temperature) && o.temperature >= 0, "temperature", o.temperature, "a finite value >= 0 (0: greedy)");
  check(o.sample_vocab >= 0 && o.sample_vocab <= a.vocab_size, "sample_vocab", o.sample_vocab,
        "in [0, vocab_size = " + std::to_string(a.vocab_size) + "] (0: every id)");
  const int64_t S = int64_t(prompt.size()), held = session.size();
  check(held + S + std::max<int64_t>(o.max_new - 1, 0) <= session.capacity(),
        "tokens held + prompt tokens + max_new - 1", held + S + std::max<int64_t>(o.max_new - 1, 0),
        "<= the session's capacity = " + std::to_string(session.capacity()));
  std::vector<int64_t> out;
  const int64_t V = o.sample_vocab > 0 ? o.sample_vocab : a.vocab_size;
  std::vector<int64_t> positions(static_cast<size_t>(S));
  const int64_t first = session.next_position();  // after the tokens the session holds (a saved context's)
  for (int64_t i = 0; i < S; ++i) positions[size_t(i)] = first + i;
  // With a memory the prompt goes in a chunk per forward() call: activations for one chunk, however long it is.
  const std::optional<MemoryOptions>& memory = session.options().memory;
  const int64_t piece = memory ? std::max<int64_t>(1, memory->chunk_tokens()) : S;
  std::vector<float> hidden(size_t(std::min(S, piece) * a.d_model)), logits(size_t(a.vocab_size));
  std::vector<double> p(static_cast<size_t>(V));
  std::mt19937_64 rng(o.seed);
  int64_t n = 0;
  for (int64_t t0 = 0; t0 < S; t0 += n) {
    n = std::min(piece, S - t0);
    session.forward(prompt.data() + t0, positions.data() + t0, n, hidden.data());
    if (o.on_prompt) o.on_prompt(t0 + n, S);
  }
  if (o.max_new == 0) return out;  // the prompt read (into the caches), nothing generated
  const float* last = hidden.data() + (n - 1) * a.d_model;
  for (int64_t pos = first + S;; ++pos) {
    session.logits(last, 1, logits.data());
    for (int64_t i = 0; i < V; ++i)
      if (!std::isfinite(logits[size_t(i)]))
        fail("logits[" + std::to_string(i) + "] at position " + std::to_string(pos - 1), std::to_string(logits[size_t(i)]),
             "finite values (are the checkpoint's weights finite?)");
    int64_t next = std::max_element(logits.begin(), logits.begin() + V) - logits.begin();
    if (o.temperature > 0) {
      const double top = logits[size_t(next)];
      double sum = 0;
      for (int64_t i = 0; i < V; ++i) sum += p[size_t(i)] = std::exp((double(logits[size_t(i)]) - top) / o.temperature);
      double u = std::uniform_real_distribution<double>(0, sum)(rng);
      for (next = 0; next < V - 1 && u >= p[size_t(next)]; ++next) u -= p[size_t(next)];
    }
    if (next == o.stop_id) break;
    out.push_back(next);
    if (o.on_token) o.on_token(next);
    if (int64_t(out.size()) == o.max_new) break;
    session.forward(&next, &pos, 1, hidden.data());
    last = hidden.data();
  }
  return out;
}

}  // namespace rotary::engine
