// The prefix cache of rotary_server/prefix_cache.h.
#include "rotary_server/prefix_cache.h"

#include <algorithm>
#include <utility>

#include "rotary/error.h"

namespace rotary::server {

PrefixCache::PrefixCache(int64_t budget_bytes) : budget_(budget_bytes) {
  check(budget_bytes >= 0, "prefix cache budget", budget_bytes, ">= 0 bytes");
}

PrefixCache::Match PrefixCache::find(const std::vector<int64_t>& prompt, uint64_t settings, int64_t limit,
                                     bool whole_entries) {
  auto best = entries_.end();
  int64_t best_tokens = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->settings != settings || (!it->cuttable && !whole_entries)) continue;
    const std::vector<int64_t>& held = it->session.tokens();
    const int64_t most = std::min({int64_t(held.size()), int64_t(prompt.size()), limit});
    int64_t same = 0;
    while (same < most && held[size_t(same)] == prompt[size_t(same)]) ++same;
    if (!it->cuttable && same < int64_t(held.size())) continue;  // all of it or nothing
    if (same > best_tokens) best = it, best_tokens = same;
  }
  const Saved* best_saved = nullptr;
  for (const Saved& c : saved_) {
    const int64_t n = int64_t(c.tokens.size());
    if (c.settings == settings && n > best_tokens && n <= std::min(int64_t(prompt.size()), limit) &&
        std::equal(c.tokens.begin(), c.tokens.end(), prompt.begin()))
      best_saved = &c, best_tokens = n;
  }
  if (best_saved) return {nullptr, &best_saved->dir, best_tokens};
  if (best == entries_.end()) return {};
  entries_.splice(entries_.begin(), entries_, best);  // used: last out
  return {&entries_.front().session, nullptr, best_tokens};
}

void PrefixCache::keep_saved(const std::string& dir, std::vector<int64_t> tokens, uint64_t settings) {
  check(!tokens.empty(), "saved context " + dir, "no token ids",
        "a context saved with its tokens' ids (saved by this version: save it again)");
  saved_.push_back(Saved{dir, std::move(tokens), settings});
}

void PrefixCache::forget_saved(const std::string& dir) {
  std::erase_if(saved_, [&](const Saved& c) { return c.dir == dir; });
}

engine::Session PrefixCache::take(const Match& match) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (&it->session == match.session) {
      engine::Session s = std::move(it->session);
      bytes_ -= it->bytes;
      entries_.erase(it);
      return s;
    }
  fail("prefix cache take", "an entry not in the cache", "a match find() returned, before any other change");
}

void PrefixCache::keep(engine::Session session) {
  const std::vector<int64_t>& held = session.tokens();
  if (budget_ == 0 || held.empty() || int64_t(held.size()) != session.size()) return;
  session.release_scratch();
  const int64_t bytes = session.held_bytes();
  if (bytes > budget_) return;
  const uint64_t settings = session.settings_fingerprint();
  const bool cuttable = session.can_copy_prefix();
  for (auto it = entries_.begin(); it != entries_.end();) {
    const std::vector<int64_t>& other = it->session.tokens();
    const bool covered = cuttable && it->settings == settings && other.size() <= held.size() &&
                         std::equal(other.begin(), other.end(), held.begin());
    if (covered) {
      bytes_ -= it->bytes;
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  while (!entries_.empty() && bytes_ + bytes > budget_) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
  entries_.push_front(Entry{std::move(session), settings, bytes, cuttable});
  bytes_ += bytes;
}

}  // namespace rotary::server
