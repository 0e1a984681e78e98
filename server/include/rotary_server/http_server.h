// rotary_server/http_server.h: the HTTP front of `rotary serve` (cpp-httplib): the OpenAI endpoints over a Scheduler
// - POST /v1/chat/completions (the model's chat template), POST /v1/completions, streamed as server-sent events
// ending in `data: [DONE]` or answered whole; GET /v1/models, /health, /metrics (Prometheus text) - with an optional
// API key, a body limit, a per-request time limit, OpenAI-style JSON errors for every refusal, and a drain on stop.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "rotary_chat/chat_template.h"
#include "rotary_server/openai_api.h"
#include "rotary_server/scheduler.h"

namespace rotary::server {

struct ServerOptions {
  std::string host = "127.0.0.1";  // --host: loopback unless asked
  int port = 8080;                 // --port (0: any free port, printed when listening)
  std::string model_id;            // the id /v1/models lists and requests name ("model")
  std::string api_key;             // --api-key: required as "Authorization: Bearer KEY" when set
  RequestLimits limits;            // --max-body, ...
  double timeout_s = 600;          // --timeout: seconds a request may take from its arrival
  double drain_s = 30;             // --drain: seconds SIGTERM waits for running requests before failing them
  void validate() const;           // rotary::Error naming the flag
};

// What turns a request into tokens and ends its turn.
struct PromptSetup {
  std::optional<chat::ChatTemplate> chat_template;  // unset: /v1/chat/completions is refused (400 naming --template)
  std::vector<int64_t> end_of_turn;                 // ids that end an answer (the tokenizer's EOS, the model's eos ids)
  int64_t sample_vocab = 0;                         // ids at or past this are never chosen (0: all)
};

// Serves until `stop` becomes true (a signal handler sets it), then drains: new requests get 503, running ones
// finish within options.drain_s (or fail cleanly), the listener closes; returns 0. `on_listening(port)` is called
// once the socket is bound. rotary::Error naming --host / --port when the address cannot be bound.
int serve(const ServerOptions& options, const ServedModel& model, const PromptSetup& prompts, Scheduler& scheduler,
          const std::atomic<bool>& stop, const std::function<void(int port)>& on_listening);

}  // namespace rotary::server
