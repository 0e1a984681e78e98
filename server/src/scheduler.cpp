// The slots and the continuous batching of rotary_server/scheduler.h.
#include "rotary_server/scheduler.h"

#include <algorithm>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <functional>
#include <random>
#include <string>
#include <string_view>

#include "rotary/error.h"

namespace rotary::server {

// ---- Job ----

Job::Update Job::next(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_for(lock, wait, [&] { return !pending_.empty() || finished_; });
  Update u;
  u.text.swap(pending_);
  u.finished = finished_, u.finish = finish_, u.usage = usage_, u.error = error_;
  return u;
}

void Job::publish(const std::string& text) {
  if (text.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_ += text;
  }
  changed_.notify_all();
}

void Job::finish(FinishReason reason, const Usage& usage) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true, finish_ = reason, usage_ = usage;
  }
  changed_.notify_all();
}

void Job::fail(const ApiError& error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true, error_ = error;
  }
  changed_.notify_all();
}

// ---- Scheduler ----

void SchedulerOptions::validate() const {
  check(slots >= 1 && slots <= 256, "--parallel", slots, "in [1, 256]");
  check(context >= 2, "--ctx", context, ">= 2 tokens");
  check(prefill_step >= 1, "--prefill-step", prefill_step, ">= 1 token");
  check(prompt_share >= 0 && prompt_share <= 1000, "--prompt-share", prompt_share,
        "in [0, 1000] (a share of a decode step's time; 0: whole prompt pieces)");
  check(queue_limit >= 0, "--queue", queue_limit, ">= 0 requests");
  check(prefix_cache_bytes >= 0, "--prefix-cache-mib", prefix_cache_bytes / (1 << 20), ">= 0 MiB (0: none)");
  check(threads >= 0, "--threads", threads, ">= 0 (0: all cores)");
}

namespace {

// Tokens of text before new ones that the decoder reads for their text (its joining rules look a few back).
constexpr int64_t kDecodeContext = 8;

// What a decoder gives for bytes that are not yet a whole character (a character cut between tokens).
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

ApiError shutting_down() {
  return ApiError(503, "server_error", "", "shutting_down", "the server is shutting down (SIGTERM); retry elsewhere");
}

}  // namespace

struct Scheduler::Slot {
  explicit Slot(engine::Session s) : session(std::make_unique<engine::Session>(std::move(s))) {}
  std::unique_ptr<engine::Session> session;
  bool own_settings = false;   // the session runs a request's own settings (rotary's extension), not the server's
  std::shared_ptr<Job> job;
  std::optional<engine::TokenSampler> sampler;
  int64_t max_new = 0;          // tokens this job may still choose in all
  int64_t fed = 0;              // prompt tokens in the session
  int64_t cached = 0;           // of them, from the prefix cache
  int64_t pending_token = -1;   // chosen and not yet fed (-1: none)
  std::vector<int64_t> answer;  // tokens chosen (no stop id)
  // The answer's text, decoded incrementally (a step decodes a few tokens, not the whole answer): `text` holds the
  // text of every answer token but `undecoded`, whose bytes do not yet end a character; `decoded_tail`, the last
  // tokens whose text is in `text` (the prompt's at first), is the decoder's context for them (a sentencepiece
  // decoder's leading space, byte sequences across the boundary).
  std::string text;
  std::vector<int64_t> decoded_tail, undecoded;
  size_t sent = 0;              // bytes of `text` published
  std::vector<int64_t> positions;
  std::vector<float> hidden;
  bool reading_prompt() const { return job && fed < int64_t(job->prompt.size()); }
};

Scheduler::Scheduler(ServedModel model, const SchedulerOptions& options)
    : model_(std::move(model)), options_(options), batch_(model_.model, options.threads),
      prefix_cache_(options.prefix_cache_bytes) {
  options_.validate();
  check(model_.model != nullptr && model_.new_session && model_.tokenizer != nullptr, "served model", "incomplete",
        "a model, a session factory and a tokenizer");
  for (int i = 0; i < options_.slots; ++i)
    slots_.push_back(std::make_unique<Slot>(model_.new_session(options_.context, nullptr)));
  // Each saved context opened once now (the model, the settings and every file checked), its tokens kept.
  for (const std::string& dir : options_.saved_contexts) {
    engine::Session opened = model_.new_session(1, nullptr);
    opened.open_context(dir);
    const int64_t n = opened.size();
    check(n < options_.context, "--context " + dir, std::to_string(n) + " tokens",
          "fewer than --ctx = " + std::to_string(options_.context) + " (a slot holds the context, the rest of a prompt "
          "and its answer)");
    prefix_cache_.keep_saved(dir, opened.tokens(), opened.settings_fingerprint());
  }
  stats_.slots = options_.slots;
  // The steps run on the scheduler thread's OpenMP team; the constructing thread's (it loaded the model) would stay
  // docked and count against the CPUs (engine::end_thread_team).
  engine::end_thread_team();
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::submit(const std::shared_ptr<Job>& job, const std::string& prompt_param) {
  const int64_t n = int64_t(job->prompt.size()), ctx = options_.context;
  if (n < 1)
    throw ApiError(400, "invalid_request_error", prompt_param, "invalid_value",
                   prompt_param + " gives no tokens: allowed a prompt of at least one token");
  if (n >= ctx)
    throw ApiError(400, "invalid_request_error", prompt_param, "context_length_exceeded",
                   prompt_param + " is " + std::to_string(n) + " tokens: allowed at most " + std::to_string(ctx - 1) +
                       " (the context of a slot is " + std::to_string(ctx) + " tokens, --ctx)");
  if (job->sampling.max_new > 0 && n + job->sampling.max_new - 1 > ctx)
    throw ApiError(400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                   "max_tokens = " + std::to_string(job->sampling.max_new) + " after a prompt of " + std::to_string(n) +
                       " tokens: allowed at most " + std::to_string(ctx - n + 1) + " (the context of a slot is " +
                       std::to_string(ctx) + " tokens, --ctx)");
  if (job->own_session()) {  // the request's settings, checked against the model now (a session allocates no cache yet)
    try {
      model_.new_session(ctx, job.get());
    } catch (const Error& e) {
      throw ApiError(400, "invalid_request_error", "rotary", "invalid_value",
                     std::string("rotary's settings do not fit this model: ") + e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (draining_ || stopping_) throw shutting_down();
    // Free slots take requests at once; --queue more may wait.
    const int64_t free_slots = options_.slots - stats_.slots_busy;
    if (int64_t(queue_.size()) >= std::max<int64_t>(free_slots, 0) + options_.queue_limit)
      throw ApiError(503, "server_error", "", "queue_full",
                     "the server is busy: " + std::to_string(queue_.size()) + " requests wait for one of " +
                         std::to_string(options_.slots) + " slots (--queue " + std::to_string(options_.queue_limit) +
                         "); retry later");
    queue_.push_back(job);
    stats_.queued = int64_t(queue_.size());
  }
  wake_.notify_all();
}

void Scheduler::drain(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  draining_ = true;
  wake_.notify_all();
  wake_.wait_until(lock, deadline, [&] { return queue_.empty() && stats_.slots_busy == 0; });
  stopping_ = true;
  lock.unlock();
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void Scheduler::loop() {
  const int64_t slot_bytes = engine::Session::bytes_needed(
      *model_.model, slots_.front()->session->options(), std::min(options_.prefill_step, options_.context));
  std::vector<Slot*> active;
  bool busy = false;  // the last step had work
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      for (;;) {
        for (auto& s : slots_) {
          if (s->job || queue_.empty() || stopping_) continue;
          s->job = queue_.front();
          queue_.pop_front();
        }
        stats_.queued = int64_t(queue_.size());
        active.clear();
        for (auto& s : slots_)
          if (s->job) active.push_back(s.get());
        stats_.slots_busy = int64_t(active.size());
        stats_.kv_bytes = stats_.slots_busy * slot_bytes;
        if (stopping_) break;
        if (!active.empty()) {
          busy = true;
          break;
        }
        if (busy) {  // just idle: the heap's free pages back to the system (glibc keeps them in each thread's arena,
                     // so a server's resident memory would stay at its busiest, not at what it holds)
          busy = false;
#ifdef __GLIBC__
          malloc_trim(0);
#endif
        }
        wake_.notify_all();  // drain() waits for an idle scheduler
        wake_.wait_for(lock, std::chrono::milliseconds(200));
      }
      if (stopping_) {
        for (auto& job : queue_) job->fail(shutting_down());
        queue_.clear();
        for (Slot* s : active) s->job->fail(shutting_down()), s->job.reset(), s->session->clear();
        stats_.queued = stats_.slots_busy = stats_.kv_bytes = 0;
        wake_.notify_all();
        return;
      }
    }
    step(active);
  }
}

void Scheduler::step(std::vector<Slot*>& active) {
  const engine::Architecture& arch = model_.model->arch();
  const int64_t d = arch.d_model, V = arch.vocab_size;
  const auto now = std::chrono::steady_clock::now();
  int64_t finished = 0, failed = 0, cancelled = 0, prompt_tokens = 0, completion_tokens = 0;
  int64_t prefix_hits = 0, cached_tokens = 0, prompt_layer_steps = 0;
  // Ends told to their jobs once the counters hold them (a client reading /metrics after its answer sees it).
  std::vector<std::function<void()>> ends;
  // A slot's session goes to the prefix cache when its rows are whole (every token it ran finished its layers: not
  // after an engine error), and the slot starts the next request with a new one.
  // A session that cannot be cut (a memory's, a length-dependent scaling's) is kept whole, to be continued by a prompt
  // that goes on from all of it - with the server's settings only: its memory's top-k and search are not in the
  // settings a match compares.
  auto release = [&](Slot& s, bool keep_rows = true) {
    s.job.reset(), s.sampler.reset();
    const bool keepable = s.session->can_copy_prefix() ||
                          (!s.own_settings && s.session->options().keep_caches && s.session->piece_rows_done() == 0);
    if (keep_rows && prefix_cache_.budget() > 0 && s.session->size() > 0 && keepable) {
      prefix_cache_.keep(std::move(*s.session));
      s.session = std::make_unique<engine::Session>(model_.new_session(options_.context, nullptr));
      s.own_settings = false;
    } else {
      s.session->clear();
    }
    s.answer.clear(), s.text.clear(), s.decoded_tail.clear(), s.undecoded.clear();
    s.sent = 0;
    s.fed = 0, s.cached = 0, s.pending_token = -1;
  };
  // What each slot feeds this step: its pending token, or one slot's next piece of prompt.
  std::vector<engine::BatchStep> steps;
  std::vector<Slot*> fed;
  bool prompt_piece_taken = false;
  int64_t prompt_step = -1;  // the step of this step's prompt piece in `steps` (-1: none)
  bool split_piece = false;  // whether it may run a part (its prompt has several pieces)
  for (Slot* s : active) {
    Job& job = *s->job;
    if (job.cancelled()) {
      ++cancelled, release(*s);
      continue;
    }
    if (now > job.deadline) {
      ends.push_back([j = s->job] {
        j->fail(ApiError(504, "server_error", "", "request_timeout",
                         "the request ran past the server's time limit per request (--timeout)"));
      });
      ++failed, release(*s);
      continue;
    }
    if (!s->sampler) {  // newly admitted
      const int64_t n = int64_t(job.prompt.size());
      try {
        // A request's own settings get a session of their own (checked at submit); the server's come back after.
        if (job.own_session() || s->own_settings) {
          s->session = std::make_unique<engine::Session>(
              model_.new_session(options_.context, job.own_session() ? &job : nullptr));
          s->own_settings = job.own_session();
        }
        s->sampler.emplace(job.sampling, V);
        // The longest prefix of the prompt a kept session of these settings holds (the last prompt token is always
        // read: its row gives the first answer token): the entry itself when the prompt goes on from all of it and
        // it has the slot's room, else a copy of the prefix.
        const PrefixCache::Match match =
            prefix_cache_.find(job.prompt, s->session->settings_fingerprint(), n - 1, !job.own_session());
        if (match.saved_dir) {
          const std::string dir = *match.saved_dir;
          try {
            s->session->open_context(dir);
          } catch (const Error& e) {  // changed since the start: this request fails, later ones read their prompts
            prefix_cache_.forget_saved(dir);
            ends.push_back([j = s->job, m = "the saved context " + dir + " (--context) could not be opened: " +
                                            std::string(e.what())] {
              j->fail(ApiError(500, "server_error", "", "saved_context_error", m));
            });
            ++failed, release(*s, false);
            continue;
          }
        } else if (match.tokens > 0) {
          if (match.tokens == match.session->size() && match.session->capacity() >= options_.context)
            s->session = std::make_unique<engine::Session>(prefix_cache_.take(match));
          else
            s->session->copy_prefix_from(*match.session, match.tokens);
        }
        if (match.tokens > 0) {
          s->fed = match.tokens, s->cached = match.tokens;
          ++prefix_hits, cached_tokens += match.tokens;
        }
      } catch (const Error& e) {
        ends.push_back([j = s->job, m = std::string(e.what())] {
          j->fail(ApiError(400, "invalid_request_error", "", "invalid_value", m));
        });
        ++failed, release(*s, false);
        continue;
      }
      s->max_new = job.sampling.max_new > 0 ? job.sampling.max_new : options_.context - n + 1;
      s->decoded_tail.assign(job.prompt.end() - std::min<int64_t>(n, kDecodeContext), job.prompt.end());
      prompt_tokens += n;
    }
    int64_t first = 0, count = 0;
    const int64_t* tokens = nullptr;
    if (s->reading_prompt()) {
      if (prompt_piece_taken) continue;  // one prompt piece per step
      prompt_piece_taken = true;
      // (with a memory, whole memory chunks: its chunks then start where a whole prompt's would, as in generate)
      int64_t piece = options_.prefill_step;
      if (const auto& memory = s->session->options().memory) {
        const int64_t chunk = memory->chunk_tokens();
        piece = std::max(chunk, piece / chunk * chunk);
      }
      first = s->fed, count = std::min<int64_t>(piece, int64_t(job.prompt.size()) - s->fed);
      tokens = job.prompt.data() + first;
      prompt_step = int64_t(steps.size());
      // (a prompt of one piece is read whole: a short prompt's first token comes soon; one of several - a document -
      // is read a part per step beside decode tokens, so it does not stall the others' streams for all its pieces)
      split_piece = int64_t(job.prompt.size()) - s->cached > piece;
    } else {
      first = int64_t(job.prompt.size()) + int64_t(s->answer.size()) - 1, count = 1;
      tokens = &s->pending_token;
    }
    s->positions.resize(size_t(count));
    for (int64_t i = 0; i < count; ++i) s->positions[size_t(i)] = first + i;
    s->hidden.resize(size_t(count * d));
    steps.push_back({s->session.get(), tokens, s->positions.data(), count, s->hidden.data()});
    fed.push_back(s);
  }

  // Beside decode tokens, a piece of a prompt of several runs the part of its (token, layer) rows that fits
  // --prompt-share of their step's time.
  const int64_t n_layers = model_.model->arch().n_layers;
  const int64_t decoding = int64_t(steps.size()) - (prompt_step >= 0 ? 1 : 0);
  int64_t piece_done = 0;  // (token, layer) rows of the piece run before this step
  if (prompt_step >= 0) {
    engine::BatchStep& st = steps[size_t(prompt_step)];
    piece_done = st.session->piece_rows_done();
    const int64_t left = st.n * n_layers - piece_done;
    if (split_piece && decoding > 0 && options_.prompt_share > 0) {
      // The step of these decode tokens alone: measured with this many, else the nearest count measured.
      double decode_s = 0;
      for (int64_t k = 0; k < int64_t(decode_step_s_.size()) && decode_s == 0; ++k)
        for (int64_t at : {decoding - k, decoding + k})
          if (decode_s == 0 && at >= 1 && at < int64_t(decode_step_s_.size())) decode_s = decode_step_s_[size_t(at)];
      double fit = double(st.n);  // unmeasured yet: a layer's rows (a step that measures them)
      if (decode_s > 0 && token_layer_s_ > 0) fit = options_.prompt_share * decode_s / token_layer_s_;
      st.layer_rows = int64_t(std::clamp(fit, 1.0, double(left)));
      if (st.layer_rows == left) st.layer_rows = 0;  // (the rest)
    }
  }
  std::vector<Slot*> choosing;  // slots whose next token is chosen after this step
  if (!steps.empty()) {
    try {
      const auto started = std::chrono::steady_clock::now();
      batch_.forward(steps);
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      // A step of k decode tokens alone: a running average (weight 1/4 to the newest). A prompt token through one
      // layer: the median of the last steps' samples - a piece alone's time per row, or beside decode tokens the
      // step's time less theirs per row of the piece (noisy when the part is small: the median drops the spikes).
      if (prompt_step < 0) {
        if (int64_t(decode_step_s_.size()) <= decoding) decode_step_s_.resize(size_t(decoding + 1), 0.0);
        double& avg = decode_step_s_[size_t(decoding)];
        avg = avg > 0 ? 0.75 * avg + 0.25 * took : took;
      } else {
        // (a session the batch runs by its own forward ran the whole piece)
        const engine::BatchStep& st = steps[size_t(prompt_step)];
        const int64_t after = st.session->piece_rows_done();
        const double rows = double(after > 0 ? after - piece_done : st.n * n_layers - piece_done);
        const double decode_s = decoding < int64_t(decode_step_s_.size()) ? decode_step_s_[size_t(decoding)] : 0;
        if (decoding == 0 || decode_s > 0) {
          const double sample = (took - decode_s) / rows;
          if (token_layer_samples_.size() < kTokenLayerSamples) token_layer_samples_.push_back(sample);
          else token_layer_samples_[next_sample_] = sample;
          next_sample_ = (next_sample_ + 1) % kTokenLayerSamples;
          std::vector<double> sorted = token_layer_samples_;
          std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
          if (sorted[sorted.size() / 2] > 0) token_layer_s_ = sorted[sorted.size() / 2];
        }
      }
      for (size_t i = 0; i < fed.size(); ++i) {
        Slot& s = *fed[i];
        if (s.reading_prompt()) {
          if (s.session->piece_rows_done() > 0) {  // the piece goes on next step
            ++prompt_layer_steps;
            continue;
          }
          s.fed += steps[i].n;
          if (!s.reading_prompt()) choosing.push_back(&s);
        } else {
          choosing.push_back(&s);
        }
      }
    } catch (const std::exception& e) {  // a step the engine refused: its jobs fail, the server goes on
      for (Slot* s : fed) {
        ends.push_back([j = s->job, m = std::string(e.what())] {
          j->fail(ApiError(500, "server_error", "", "engine_error", m));
        });
        ++failed, release(*s, false);
      }
    }
  }
  // One LM head call for every slot that chooses a token.
  std::vector<float>& rows = head_rows_;  // (kept between steps: a step allocates no logits)
  std::vector<float>& logits = head_logits_;
  rows.resize(choosing.size() * size_t(d)), logits.resize(choosing.size() * size_t(V));
  for (size_t i = 0; i < choosing.size(); ++i) {
    const Slot& s = *choosing[i];
    const int64_t last = int64_t(s.hidden.size()) / d - 1;
    std::copy_n(s.hidden.data() + last * d, d, rows.data() + i * size_t(d));
  }
  if (!choosing.empty()) model_.model->logits(rows.data(), int64_t(choosing.size()), logits.data(), options_.threads);

  for (size_t i = 0; i < choosing.size(); ++i) {
    Slot& s = *choosing[i];
    Job& job = *s.job;
    const int64_t position = int64_t(job.prompt.size()) + int64_t(s.answer.size());
    try {
      const int64_t token = s.sampler->choose(logits.data() + i * size_t(V), position);
      const bool end_of_turn = s.sampler->is_stop(token);
      if (!end_of_turn) s.answer.push_back(token), ++completion_tokens;
      const bool full = int64_t(s.answer.size()) >= s.max_new ||
                        int64_t(job.prompt.size() + s.answer.size()) >= options_.context + 1;
      if (!end_of_turn) s.undecoded.push_back(token);
      // The new tokens' text, once it ends a character (or the answer ends).
      if (!s.undecoded.empty()) {
        const std::string piece = model_.tokenizer->decode_continuation(s.decoded_tail, s.undecoded);
        if (end_of_turn || full || !std::string_view(piece).ends_with(kReplacement)) {
          s.text += piece;
          s.decoded_tail.insert(s.decoded_tail.end(), s.undecoded.begin(), s.undecoded.end());
          if (int64_t(s.decoded_tail.size()) > kDecodeContext)
            s.decoded_tail.erase(s.decoded_tail.begin(), s.decoded_tail.end() - kDecodeContext);
          s.undecoded.clear();
        }
      }
      // A stop string ends the answer before it (searched where it could begin: after what was published).
      size_t stop_at = std::string::npos;
      if (!job.stop_strings.empty()) {
        size_t longest = 0;
        for (const std::string& st : job.stop_strings) longest = std::max(longest, st.size());
        stop_at = find_stop(s.text, job.stop_strings, s.sent > longest ? s.sent - longest : 0);
      }
      const bool stopped = end_of_turn || stop_at != std::string::npos;
      if (stop_at != std::string::npos) s.text.resize(stop_at);
      if (stopped || full) {
        if (s.text.size() > s.sent) job.publish(s.text.substr(s.sent));
        ends.push_back([j = s.job, reason = stopped ? FinishReason::Stop : FinishReason::Length,
                        usage = Usage{int64_t(job.prompt.size()), int64_t(s.answer.size()), s.cached}] {
          j->finish(reason, usage);
        });
        ++finished, release(s);
        continue;
      }
      // Publish what can no longer change: all but a possible start of a stop string.
      const size_t safe = s.text.size() - stop_prefix_held(s.text, job.stop_strings);
      if (safe > s.sent) {
        job.publish(s.text.substr(s.sent, safe - s.sent));
        s.sent = safe;
      }
      s.pending_token = token;
    } catch (const std::exception& e) {
      ends.push_back([j = s.job, m = std::string(e.what())] {
        j->fail(ApiError(500, "server_error", "", "engine_error", m));
      });
      ++failed, release(s);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.requests_finished += finished, stats_.requests_failed += failed, stats_.requests_cancelled += cancelled;
    stats_.prompt_tokens += prompt_tokens, stats_.completion_tokens += completion_tokens;
    stats_.prefix_cache_hits += prefix_hits, stats_.cached_prompt_tokens += cached_tokens;
    stats_.prefix_cache_bytes = prefix_cache_.bytes(), stats_.prefix_cache_entries = prefix_cache_.entries();
    ++stats_.steps;
    stats_.prompt_layer_steps += prompt_layer_steps;
  }
  for (const auto& end : ends) end();
  if (finished + failed + cancelled > 0) wake_.notify_all();
}

}  // namespace rotary::server
