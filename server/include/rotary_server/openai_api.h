// rotary_server/openai_api.h: the OpenAI HTTP API as the server speaks it - a request body read into a checked
// CompletionRequest (every field a client sends: its type, its range, fields rotary cannot honour refused by name),
// and the JSON of the replies (a completion, a stream's chunks, usage, errors). Torch-free, no HTTP: the parser is a
// pure function of the bytes, so it is fuzzed (fuzz/server_request_fuzzer.cpp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace rotary::server {

// An answer other than 200: the HTTP status and OpenAI's error object,
// {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}. `param` names the request field at fault
// ("messages[2].role", "max_tokens"); empty for none (null in the JSON). The parser's messages name the field, its
// value (compact JSON, cut to a hundred characters) and what is allowed: "temperature = 3.5: allowed a number in
// [0, 2]".
struct ApiError : std::runtime_error {
  int status;        // 400 bad field, 401 key, 404 unknown model / path, 413 too large, 503 full, 500 internal
  std::string type;  // invalid_request_error, authentication_error, not_found_error, server_error, overloaded_error
  std::string param;
  std::string code;  // machine-readable: invalid_type, invalid_value, missing_field, unsupported_field,
                     // context_length_exceeded, model_not_found, invalid_json, body_too_large, queue_full, ...
  ApiError(int status, std::string type, std::string param, std::string code, const std::string& message)
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  // The body: {"error": {...}}; an empty param or code is null. The message is made valid UTF-8 (each ill-formed
  // sequence a U+FFFD), so the body dumps whatever bytes the message quotes.
  nlohmann::ordered_json to_json() const;
};

// Which endpoint a body was sent to.
enum class Endpoint { ChatCompletions, Completions };

// The limits a request is checked against (the server's flags).
struct RequestLimits {
  int64_t max_body_bytes = 8 << 20;  // --max-body: larger bodies are 413 (checked by the HTTP layer too)
  int64_t max_json_depth = 64;       // deeper JSON is refused (400, invalid_json) before it is parsed
  int64_t max_stop = 4;              // `stop`: at most this many strings (OpenAI's 4)
  int64_t max_stop_bytes = 256;      // each stop string at most this long
};

// A checked request. Absent fields take OpenAI's defaults, as written here.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::ChatCompletions;
  std::string model;  // "model" (required by OpenAI; the server checks it against its model's id; "" if absent)
  // Chat: "messages" (a non-empty array; each an object with a string "role" and a "content" that is a string, null
  // or an array of {"type": "text", "text": ...} parts - checked like chat::check_messages, the param naming the
  // element); "tools" (an array, kept as given for the chat template) or unset.
  nlohmann::ordered_json messages;
  std::optional<nlohmann::ordered_json> tools;
  // Completions: "prompt", a string, or a non-empty array of token ids (integers >= 0) - one prompt; a list of one
  // prompt (["text"], [[1, 2]]: what LangChain sends) is that prompt; a list of several prompts is refused (param
  // "prompt", code unsupported_field). Exactly one of these is set.
  std::optional<std::string> prompt_text;
  std::optional<std::vector<int64_t>> prompt_ids;
  // "max_completion_tokens" (chat) or "max_tokens" (either; both given and different: 400): integer >= 1; unset:
  // up to the context's end.
  std::optional<int64_t> max_tokens;
  double temperature = 1.0;  // "temperature": number in [0, 2]; 0 greedy
  double top_p = 1.0;        // "top_p": number in (0, 1]
  std::optional<uint64_t> seed;  // "seed": integer (negative values taken modulo 2^64, as a client's int64)
  std::vector<std::string> stop;  // "stop": a string or an array of strings, each non-empty; null: none
  bool stream = false;            // "stream": boolean or null
  bool include_usage = false;     // "stream_options": {"include_usage": bool} (only with stream: true)
  // rotary's extension, "rotary": {"positions": "rope" | "rerope" | "leaky_rerope", "window": W, "leaky_k": k} -
  // the seeds' position methods per request (ReRoPE past the trained context; docs/server.md): each key optional,
  // any other key refused (invalid_value naming rotary.<key>); window an integer >= 1, leaky_k a number > 0. Unset:
  // the server's own settings. Whether they fit the model (a window past the slot's context, ...) is the scheduler's
  // check (400 naming the field).
  struct Positions {
    std::optional<std::string> mode;  // "rope", "rerope", "leaky_rerope"
    std::optional<int64_t> window;
    std::optional<double> leaky_k;
    bool any() const { return mode || window || leaky_k; }
  } positions;
  // ... and a retrieval memory per request (seed 001; `rotary generate --memory` for one request), over the server's
  // --memory flags: "memory": "exact" | "rerope" | "none" | "unlimiformer" (the policy), "memory_window": W (integer
  // >= 1), "top_k": k (integer in [0, 65536]), "search": a --search name ("exact", "pages", "pages<P>", ...). Whether
  // they fit the model and the search name is known are the scheduler's checks (400 naming rotary).
  struct Memory {
    std::optional<std::string> policy;
    std::optional<int64_t> window, top_k;
    std::optional<std::string> search;
    bool any() const { return policy || window || top_k || search; }
  } memory;
  // Fields OpenAI defines that change what is generated, accepted only at the value that changes nothing (else 400,
  // code unsupported_field, naming the field): "n" (1), "logprobs" (false/null), "top_logprobs" (null),
  // "presence_penalty" / "frequency_penalty" (0), "logit_bias" (empty/null), "response_format" ({"type": "text"}),
  // "tool_choice" ("none"/"auto"/null), "echo" (false), "best_of" (1), "suffix" (null), "parallel_tool_calls" (any).
  // Fields that change nothing generated ("user", "metadata", "store", "service_tier") are accepted and ignored, as
  // are unknown fields (clients send their own).
};

// Parses and checks `body` sent to `endpoint`. ApiError 400 naming the field (param) for malformed JSON (code
// invalid_json, with the byte offset), a body that is not an object, a missing or mistyped field, a value out of
// range; 413 (body_too_large) for a body past limits.max_body_bytes.
CompletionRequest parse_completion_request(std::string_view body, Endpoint endpoint, const RequestLimits& limits);

// Why a completion ended: "stop" (an end-of-turn token or a stop string), "length" (max_tokens or the context's
// end).
enum class FinishReason { Stop, Length };
const char* finish_reason_name(FinishReason r);

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens not read again: the prefix cache held them
  // {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details": {"cached_tokens"}}
  nlohmann::ordered_json to_json() const;
};

// The reply bodies. `id`: "chatcmpl-..." / "cmpl-..."; `created`: Unix seconds; `model`: the server's model id.
struct ReplyHeader {
  std::string id, model;
  int64_t created = 0;
  Endpoint endpoint = Endpoint::ChatCompletions;
};
// The whole answer (stream: false): object "chat.completion" with choices[0].message {"role": "assistant",
// "content": text} and finish_reason, or "text_completion" with choices[0].text; usage.
nlohmann::ordered_json completion_json(const ReplyHeader& h, const std::string& text, FinishReason finish,
                                       const Usage& usage);
// One chunk of a stream (object "chat.completion.chunk" / "text_completion"): choices[0].delta {"content": text}
// (the first chunk of a chat stream also carries "role": "assistant"), finish_reason null until the last chunk,
// which has an empty delta (chat) / text and the reason. With include_usage every chunk carries "usage": null and a
// final chunk has "choices": [] and the usage.
nlohmann::ordered_json chunk_json(const ReplyHeader& h, const std::string& text, bool first,
                                  std::optional<FinishReason> finish, bool include_usage);
nlohmann::ordered_json usage_chunk_json(const ReplyHeader& h, const Usage& usage);

// Stop strings, byte for byte: where the first of `stops` occurs in `text` at or after byte `from` (npos: none; of
// two starting at the same byte, the longer; `length`, when given, gets its length, 0 for none), and how many bytes
// at the end of `text` could still be the start of one: the longest k such that the last k bytes of `text` are a
// proper prefix of a stop string (held back from a stream until the next token says). Empty stop strings never
// match.
size_t find_stop(const std::string& text, const std::vector<std::string>& stops, size_t from, size_t* length = nullptr);
size_t stop_prefix_held(const std::string& text, const std::vector<std::string>& stops);

}  // namespace rotary::server
