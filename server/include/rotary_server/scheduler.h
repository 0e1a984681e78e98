// rotary_server/scheduler.h: the slots of `rotary serve` and their continuous batching. Requests (Jobs) wait in a
// bounded queue; each of N slots holds one engine session (its own KV cache, or memory); one scheduler thread runs
// the steps: every step feeds each active slot's next tokens - a decode token, or the next piece of a prompt (one
// prompt piece per step, so a long prompt does not stall the others' streams) - through one
// engine::SessionBatch::forward (one pass over the weights for all of them) and one LM head call, then samples each
// slot's token with its own sampler. A sequence's pieces depend only on its request and --prefill-step, and the batch
// gives each session its own forward's bits, so a request's tokens are the same whatever runs beside it. A finished
// request's session goes to the prefix cache (rotary_server/prefix_cache.h); a new request goes on from the longest
// prefix of its prompt the cache holds and reads only the rest.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rotary_engine/generate.h"
#include "rotary_engine/model.h"
#include "rotary_server/openai_api.h"
#include "rotary_server/prefix_cache.h"
#include "rotary_tokenizers/tokenizer.h"

namespace rotary::server {

// One request as the scheduler runs it, shared by the HTTP thread that waits on it and the scheduler thread that
// fills it.
class Job {
 public:
  // Set before submit().
  std::vector<int64_t> prompt;           // token ids (>= 1)
  engine::GenerateOptions sampling;      // max_new (>= 1), temperature, top_p, seed, stop_ids, sample_vocab
  std::vector<std::string> stop_strings; // text that ends the answer (not included)
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::optional<engine::PositionMethod> positions;  // the request's own (rotary's extension); unset: the server's
  CompletionRequest::Memory memory;                 // the request's own memory settings over the server's (ditto)
  bool own_session() const { return positions.has_value() || memory.any(); }  // a session of its own settings

  // What the waiting side reads: new text since the last call (held back while it could still turn into a stop
  // string or ends inside a UTF-8 character), and once finished the reason, the usage or the error.
  struct Update {
    std::string text;
    bool finished = false;
    FinishReason finish = FinishReason::Stop;
    Usage usage;
    std::optional<ApiError> error;
  };
  // Waits up to `wait` for new text or the end.
  Update next(std::chrono::milliseconds wait);
  // The client is gone (a disconnect): the scheduler frees the slot at its next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // The scheduler's side.
  void publish(const std::string& text);
  void finish(FinishReason reason, const Usage& usage);
  void fail(const ApiError& error);

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::string pending_;
  bool finished_ = false;
  FinishReason finish_ = FinishReason::Stop;
  Usage usage_;
  std::optional<ApiError> error_;
  std::atomic<bool> cancelled_{false};
};

struct SchedulerOptions {
  int slots = 1;               // --parallel: sequences decoded together
  int64_t context = 4096;      // --ctx: tokens per slot (prompt + answer)
  int64_t prefill_step = 512;  // --prefill-step: prompt tokens a piece holds (one slot's piece per step)
  // --prompt-share: while other slots decode, the time a piece of a prompt longer than one piece may add to a step,
  // as a share of a step of their decode tokens alone (measured as steps run): the piece then runs as many of its
  // (token, layer) rows per step as fit (engine::BatchStep::layer_rows), so a long prompt slows the others' streams
  // by about 1 + this at most. A prompt of one piece is read whole (its first token soon). A piece's bits do not
  // depend on how it is split. 0: whole pieces in one step.
  double prompt_share = 0.5;
  int64_t queue_limit = 64;    // --queue: requests waiting with every slot busy; more are refused (503)
  int64_t prefix_cache_bytes = 0;  // --prefix-cache-mib: finished requests' sessions kept for prompts that start with
                                   // their tokens (PrefixCache); 0: none
  std::vector<std::string> saved_contexts;  // --context: directories of `generate --save-context`, opened at start
                                            // (refused there naming the field) and for each prompt that starts with
                                            // all of a context's tokens
  int threads = 0;             // 0: OpenMP's default
  void validate() const;       // rotary::Error naming the flag
};

// What the server runs: the model, sessions with the server's settings, the tokenizer.
struct ServedModel {
  std::shared_ptr<const engine::Model> model;
  // Sessions with the run's settings (KV dtype, memory, positions) for `capacity` tokens; `job` non-null: with its
  // own positions and memory settings over the run's (rotary::Error naming the field where they do not fit).
  std::function<engine::Session(int64_t capacity, const Job* job)> new_session;
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer;
  engine::PositionMethod positions;  // the run's positions, which a request's extension fields start from
};

// Counters for /metrics.
struct SchedulerStats {
  int64_t requests_finished = 0, requests_failed = 0, requests_cancelled = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t queued = 0, slots_busy = 0, slots = 0;
  int64_t kv_bytes = 0;  // bytes the busy slots' caches hold (Session::bytes_needed at their length)
  int64_t prefix_cache_bytes = 0, prefix_cache_entries = 0;  // the prefix cache's entries now
  int64_t prefix_cache_hits = 0, cached_prompt_tokens = 0;   // requests that went on from an entry, and its tokens
  int64_t steps = 0;
  int64_t prompt_layer_steps = 0;  // steps that ran a part of a prompt piece, not its end (--prompt-share)
};

class Scheduler {
 public:
  Scheduler(ServedModel model, const SchedulerOptions& options);
  ~Scheduler();  // stops the thread; jobs still queued or running fail with 503 (shutting_down)

  // Queues `job`: ApiError 503 (queue_full, with the queue's size) when the queue is full, 503 (shutting_down) once
  // draining; 400 (context_length_exceeded, param `param`) when its prompt and max_new do not fit a slot, 400 (param
  // rotary) when its own positions or memory settings do not fit the model.
  void submit(const std::shared_ptr<Job>& job, const std::string& prompt_param);
  // Stops taking jobs and waits until the queued and running ones have finished, or until `deadline`, after which
  // the rest fail (503, shutting_down).
  void drain(std::chrono::steady_clock::time_point deadline);
  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Slot;
  void loop();
  void step(std::vector<Slot*>& active);

  ServedModel model_;
  SchedulerOptions options_;
  engine::SessionBatch batch_;
  PrefixCache prefix_cache_;  // the scheduler thread's
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<float> head_rows_, head_logits_;  // a step's LM head input [slots choosing, d] and output [.., vocab]
  // The scheduler thread's running averages of a step's cost (s; 0 until measured): k decode tokens alone
  // (decode_step_s_[k]), and a prompt token through one layer. They size the part of a prompt piece a step runs
  // beside decoding slots (--prompt-share).
  std::vector<double> decode_step_s_;
  double token_layer_s_ = 0;
  static constexpr size_t kTokenLayerSamples = 31;  // the last steps' samples of it (a ring from next_sample_)
  std::vector<double> token_layer_samples_;
  size_t next_sample_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool draining_ = false, stopping_ = false;
  SchedulerStats stats_;
  std::thread thread_;
};

}  // namespace rotary::server
