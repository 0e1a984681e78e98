// rotary_server/prefix_cache.h: the prefix cache of `rotary serve`. The sessions of finished requests (a prompt and
// its answer, read once) are kept within a byte budget; a new request whose prompt starts with tokens one of them
// holds goes on from those tokens instead of reading them again - a conversation's next turn, questions about one
// long document. Sessions are matched only under equal settings (engine::Session::settings_fingerprint: positions,
// method, window, cache dtype) of the one model a server runs, so a request never continues rows another method or
// setting made. Sessions with a retrieval memory are kept whole, for prompts that go on from all of their tokens. The
// least recently used go first when the budget is full. Contexts saved with `--save-context` are
// entries too, opened from their directory by the requests that start with all of their tokens. Owned by the
// scheduler's thread.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <vector>

#include "rotary_engine/model.h"

namespace rotary::server {

class PrefixCache {
 public:
  explicit PrefixCache(int64_t budget_bytes);  // 0: keeps nothing

  // The entry holding the longest prefix of `prompt` at most `limit` tokens long, among those of `settings`
  // (marked used: last out); tokens 0 when none holds one. A session that cannot be cut (engine::Session::
  // can_copy_prefix false: a memory's) matches only a prompt that goes on from all of its tokens, and only when
  // `whole_entries` (the request runs the server's own settings, which such an entry was kept with).
  struct Match {
    const engine::Session* session = nullptr;  // a kept session; null for a saved context
    const std::string* saved_dir = nullptr;    // a saved context's directory, opened per use
    int64_t tokens = 0;
  };
  Match find(const std::vector<int64_t>& prompt, uint64_t settings, int64_t limit, bool whole_entries = true);
  // The matched entry itself, out of the cache (when the prompt goes on from all of its tokens, the request takes
  // the session instead of a copy: the entry comes back longer when the request ends).
  engine::Session take(const Match& match);
  // Keeps `session` (its tokens known, at least one): entries of its settings whose tokens it holds as a prefix are
  // dropped when it can be cut (it answers every prompt they would), then the least recently used until the budget
  // holds; a session
  // larger than the whole budget is not kept. The session's scratch is released first (engine::Session::
  // release_scratch): an entry holds its rows only.
  void keep(engine::Session session);

  // A context saved with `generate --save-context` (`rotary serve --context DIR`): matched by the prompts that start
  // with all of its `tokens` (a book and a question about it), opened from `dir` by each request that matches
  // (engine::Session::open_context: a memory's too) - never evicted, not counted in the budget (its bytes are in
  // files, read into the slot's session). forget_saved: after a request could not open it.
  void keep_saved(const std::string& dir, std::vector<int64_t> tokens, uint64_t settings);
  void forget_saved(const std::string& dir);

  int64_t bytes() const { return bytes_; }  // the entries' held_bytes
  int64_t entries() const { return int64_t(entries_.size()); }
  int64_t budget() const { return budget_; }

 private:
  struct Entry {
    engine::Session session;
    uint64_t settings;
    int64_t bytes;
    bool cuttable;  // session.can_copy_prefix(): a prefix of it can be copied
  };
  int64_t budget_, bytes_ = 0;
  std::list<Entry> entries_;  // most recently used first
  struct Saved {
    std::string dir;
    std::vector<int64_t> tokens;
    uint64_t settings;
  };
  std::vector<Saved> saved_;
};

}  // namespace rotary::server
