// fuzz/server_request_fuzzer.cpp: any bytes as the body of a POST to /v1/chat/completions and /v1/completions
// (rotary_server/openai_api.h: parse_completion_request), under the server's default limits and under small ones.
// ApiError is the expected answer to a bad body; its JSON must dump (valid UTF-8 whatever it quotes). A request it
// accepts must hold what the header promises: messages a non-empty array (chat), exactly one prompt (completions),
// every number in its range, the stop strings within their limits - and the reply builders and stop helpers run on
// it. Anything else (another exception, a crash, a hang, undefined behaviour, a broken promise) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "rotary_server/openai_api.h"

namespace {

using rotary::server::CompletionRequest;
using rotary::server::Endpoint;

[[noreturn]] void finding(const char* what, std::string_view body) {
  std::fprintf(stderr, "server request: %s\nbody: %.*s\n", what, int(body.size()), body.data());
  std::abort();
}

void check_accepted(const CompletionRequest& r, Endpoint endpoint, const rotary::server::RequestLimits& limits,
                    std::string_view body) {
  if (r.endpoint != endpoint) finding("endpoint", body);
  if (endpoint == Endpoint::ChatCompletions) {
    if (!r.messages.is_array() || r.messages.empty()) finding("messages not a non-empty array", body);
    for (const auto& m : r.messages)
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || m["role"].get<std::string>().empty())
        finding("a message without a non-empty string role", body);
    if (r.tools && !r.tools->is_array()) finding("tools not an array", body);
    if (r.prompt_text || r.prompt_ids) finding("a chat request with a prompt", body);
  } else {
    if (bool(r.prompt_text) == bool(r.prompt_ids)) finding("not exactly one prompt", body);
    if (r.prompt_ids) {
      if (r.prompt_ids->empty()) finding("no token ids", body);
      for (const int64_t id : *r.prompt_ids)
        if (id < 0) finding("a negative token id", body);
    }
  }
  if (r.max_tokens && *r.max_tokens < 1) finding("max_tokens < 1", body);
  if (!(r.temperature >= 0 && r.temperature <= 2)) finding("temperature outside [0, 2]", body);
  if (!(r.top_p > 0 && r.top_p <= 1)) finding("top_p outside (0, 1]", body);
  if (int64_t(r.stop.size()) > limits.max_stop) finding("too many stop strings", body);
  for (const std::string& s : r.stop)
    if (s.empty() || int64_t(s.size()) > limits.max_stop_bytes) finding("a stop string out of bounds", body);
  if (r.include_usage && !r.stream) finding("include_usage without stream", body);

  // The replies and the stop helpers on what the request holds (its text is valid UTF-8: it came from JSON).
  const std::string text = r.prompt_text ? *r.prompt_text : r.model;
  const rotary::server::ReplyHeader h{"id", r.model, 0, endpoint};
  const rotary::server::Usage usage{1, 2};
  (void)rotary::server::completion_json(h, text, rotary::server::FinishReason::Stop, usage).dump();
  (void)rotary::server::chunk_json(h, text, true, std::nullopt, r.include_usage).dump();
  (void)rotary::server::chunk_json(h, "", false, rotary::server::FinishReason::Length, r.include_usage).dump();
  (void)rotary::server::usage_chunk_json(h, usage).dump();
  size_t length = 0;
  const size_t at = rotary::server::find_stop(text, r.stop, 0, &length);
  if (at != std::string::npos) {
    bool found = false;
    for (const std::string& s : r.stop) found = found || (s.size() == length && text.compare(at, length, s) == 0);
    if (!found) finding("find_stop's answer is not a stop string in the text", body);
  }
  const size_t held = rotary::server::stop_prefix_held(text, r.stop);
  if (held > text.size()) finding("stop_prefix_held past the text", body);
  if (held > 0) {
    bool prefix = false;
    for (const std::string& s : r.stop)
      prefix = prefix || (held < s.size() && text.compare(text.size() - held, held, s, 0, held) == 0);
    if (!prefix) finding("stop_prefix_held holds what is no stop's prefix", body);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  rotary::server::RequestLimits small;
  small.max_body_bytes = 4096, small.max_json_depth = 8, small.max_stop = 2, small.max_stop_bytes = 8;
  for (const rotary::server::RequestLimits& limits : {rotary::server::RequestLimits{}, small}) {
    for (const Endpoint endpoint : {Endpoint::ChatCompletions, Endpoint::Completions}) {
      try {
        check_accepted(rotary::server::parse_completion_request(body, endpoint, limits), endpoint, limits, body);
      } catch (const rotary::server::ApiError& e) {
        if (e.status != 400 && e.status != 413) finding("an error other than 400 or 413", body);
        (void)e.to_json().dump();  // valid UTF-8 whatever the message quotes
      }
    }
  }
  return 0;
}
