// server/src/openai_api.cpp: the OpenAI request parser and reply JSON (rotary_server/openai_api.h). Bytes in, checked
// values out: the body's size and nesting are bounded before nlohmann parses it (rotary/json_guard.h), then every
// field is read with its type and range checked, each refusal an ApiError naming the field's path (param), its
// value (cut to a hundred characters) and what is allowed: "temperature = 3.5: allowed a number in [0, 2]".
#include "rotary_server/openai_api.h"

#include <algorithm>
#include <utility>

#include "rotary/json_guard.h"

namespace rotary::server {
namespace {

using J = nlohmann::ordered_json;

// `text` as valid UTF-8 (each ill-formed sequence a U+FFFD), so that a message quoting a client's bytes (the
// parser's "last read: ...", a model name cut mid-character) dumps without nlohmann's type_error 316.
std::string valid_utf8(const std::string& text) {
  const std::string dumped = nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return nlohmann::json::parse(dumped).get<std::string>();
}

// A value as an error message shows it: compact JSON, at most a hundred characters (json_guard.h's json_excerpt;
// the copy into nlohmann::json is on the error path only, of a value whose depth is bounded).
std::string excerpt(const J& v) { return json_excerpt(nlohmann::json(v)); }

[[noreturn]] void refuse(const std::string& param, const std::string& code, const std::string& value,
                         const std::string& allowed) {
  throw ApiError(400, "invalid_request_error", param, code, param + " = " + value + ": allowed " + allowed);
}
[[noreturn]] void refuse(const std::string& param, const std::string& code, const J& value,
                         const std::string& allowed) {
  refuse(param, code, excerpt(value), allowed);
}
[[noreturn]] void missing(const std::string& param, const std::string& allowed) {
  refuse(param, "missing_field", std::string("(missing)"), allowed);
}

// The parser's complaint about malformed text, and where: nlohmann's parse_error carries the byte; a number too
// large for a double (1e400) is an out_of_range without one, so the text is read again by a SAX that records the
// position its parse_error is called at.
struct ErrorPosition : nlohmann::json_sax<J> {
  size_t position = 0;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception&) override {
    position = pos;
    return false;
  }
};

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string without_id(const std::string& what) {
  const size_t end = what.rfind("] ", what.find(' '));
  return what.rfind("[json.exception.", 0) == 0 && end != std::string::npos ? what.substr(end + 2) : what;
}

J parse_body(std::string_view body, const RequestLimits& limits) {
  if (int64_t(body.size()) > limits.max_body_bytes)
    throw ApiError(413, "invalid_request_error", "", "body_too_large",
                   "request body = " + std::to_string(body.size()) + " bytes: allowed at most " +
                       std::to_string(limits.max_body_bytes) + " bytes");
  const int depth = json_nesting_depth(body);  // before parsing: what follows a parse recurses once per level
  if (depth > limits.max_json_depth)
    throw ApiError(400, "invalid_request_error", "", "invalid_json",
                   "request body nesting depth = " + std::to_string(depth) + ": allowed at most " +
                       std::to_string(limits.max_json_depth) + " levels of arrays and objects inside each other");
  try {
    return J::parse(body.begin(), body.end());
  } catch (const nlohmann::json::exception& e) {
    size_t byte = 0;
    if (const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&e)) {
      byte = pe->byte;
    } else {
      ErrorPosition where;
      J::sax_parse(body.begin(), body.end(), &where);
      byte = where.position;
    }
    throw ApiError(400, "invalid_request_error", "", "invalid_json",
                   "request body = malformed JSON at byte " + std::to_string(byte) + " (" + without_id(e.what()) +
                       "): allowed JSON text (a JSON object)");
  }
}

// The field `key` of `root`; nullptr when absent or null (null is absent for every field).
const J* field(const J& root, const char* key) {
  const auto it = root.find(key);
  return it == root.end() || it->is_null() ? nullptr : &*it;
}

// json_guard.h's one rule for integers (7 or 7.0, not 7.5) in [lo, hi]; nullopt for any other value.
std::optional<int64_t> integer_of(const J& v, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
  if (!v.is_number()) return std::nullopt;
  return json_integer(nlohmann::json(v), lo, hi);
}

// An integer >= lo; another type is invalid_type, another number invalid_value.
int64_t integer_in(const J& v, const std::string& param, int64_t lo, const std::string& allowed) {
  const std::optional<int64_t> x = integer_of(v, lo);
  if (!x) refuse(param, v.is_number() ? "invalid_value" : "invalid_type", v, allowed);
  return *x;
}

double number_in(const J& v, const std::string& param, double lo, bool lo_open, double hi) {
  const std::string allowed =
      std::string("a number in ") + (lo_open ? "(" : "[") + to_text(lo) + ", " + to_text(hi) + "]";
  if (!v.is_number()) refuse(param, "invalid_type", v, allowed);
  const double x = v.get<double>();
  if (!(lo_open ? x > lo : x >= lo) || !(x <= hi)) refuse(param, "invalid_value", v, allowed);
  return x;
}

bool boolean(const J& v, const std::string& param) {
  if (!v.is_boolean()) refuse(param, "invalid_type", v, "true, false or null");
  return v.get<bool>();
}

// "seed": any integer a client's int64 or uint64 holds; negative ones taken modulo 2^64.
uint64_t seed_of(const J& v) {
  const std::string allowed = "an integer in [-2^63, 2^64 - 1]";
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  const std::optional<int64_t> x = integer_of(v);
  if (!x) refuse("seed", v.is_number() ? "invalid_value" : "invalid_type", v, allowed);
  return uint64_t(*x);
}

void read_messages(J& root, CompletionRequest& r) {
  const std::string kAllowed = "a non-empty array of message objects ({\"role\": ..., \"content\": ...})";
  const J* messages = field(root, "messages");
  if (!messages) missing("messages", kAllowed);
  if (!messages->is_array()) refuse("messages", "invalid_type", *messages, kAllowed);
  if (messages->empty()) refuse("messages", "invalid_value", *messages, kAllowed);
  for (size_t k = 0; k < messages->size(); ++k) {
    const J& m = (*messages)[k];
    const std::string at = "messages[" + std::to_string(k) + "]";
    if (!m.is_object()) refuse(at, "invalid_type", m, "an object with a role and a content");
    const std::string role_allowed = "a non-empty string (system, user, assistant, tool, ...)";
    const auto role = m.find("role");
    if (role == m.end()) missing(at + ".role", role_allowed);
    if (!role->is_string()) refuse(at + ".role", "invalid_type", *role, role_allowed);
    if (role->get_ref<const std::string&>().empty()) refuse(at + ".role", "invalid_value", *role, role_allowed);
    const auto content = m.find("content");
    if (content == m.end() || content->is_null() || content->is_string()) continue;
    if (!content->is_array())
      refuse(at + ".content", "invalid_type", *content, "a string, null or an array of text parts");
    for (size_t j = 0; j < content->size(); ++j) {
      const J& part = (*content)[j];
      const std::string pat = at + ".content[" + std::to_string(j) + "]";
      const std::string part_allowed = "a text part {\"type\": \"text\", \"text\": \"...\"}";
      if (!part.is_object()) refuse(pat, "invalid_type", part, part_allowed);
      const auto type = part.find("type");
      if (type == part.end()) missing(pat + ".type", "\"text\"");
      if (!type->is_string()) refuse(pat + ".type", "invalid_type", *type, "\"text\"");
      if (type->get_ref<const std::string&>() != "text")
        refuse(pat + ".type", "unsupported_field", *type, "\"text\" (rotary serves text parts only)");
      const auto text = part.find("text");
      if (text == part.end()) missing(pat + ".text", "a string");
      if (!text->is_string()) refuse(pat + ".text", "invalid_type", *text, "a string");
    }
  }
  r.messages = std::move(root["messages"]);  // checked: kept as given for the chat template
  if (const J* tools = field(root, "tools")) {
    if (!tools->is_array()) refuse("tools", "invalid_type", *tools, "an array of tool objects or null");
    for (size_t k = 0; k < tools->size(); ++k)
      if (!(*tools)[k].is_object())
        refuse("tools[" + std::to_string(k) + "]", "invalid_type", (*tools)[k],
               "a tool object ({\"type\": \"function\", \"function\": {...}})");
    r.tools = std::move(root["tools"]);
  }
}

// One prompt of token ids: integers >= 0, at least one.
std::vector<int64_t> token_ids(const J& ids, const std::string& param) {
  const std::string allowed = "a non-empty array of token ids (integers >= 0)";
  if (ids.empty()) refuse(param, "invalid_value", ids, allowed);
  std::vector<int64_t> out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    out.push_back(integer_in(ids[i], param + "[" + std::to_string(i) + "]", 0, "a token id (an integer >= 0)"));
  return out;
}

void read_prompt(const J& root, CompletionRequest& r) {
  const std::string kAllowed = "a string or an array of token ids (one prompt)";
  const J* prompt = field(root, "prompt");
  if (!prompt) missing("prompt", kAllowed);
  if (prompt->is_string()) {
    r.prompt_text = prompt->get<std::string>();
    return;
  }
  if (!prompt->is_array()) refuse("prompt", "invalid_type", *prompt, kAllowed);
  if (prompt->empty()) refuse("prompt", "invalid_value", *prompt, kAllowed);
  const J& first = prompt->front();
  if (first.is_string() || first.is_array()) {
    // A list of prompts: one is that prompt (clients such as LangChain send [text]); several are refused.
    if (prompt->size() > 1)
      refuse("prompt", "unsupported_field", *prompt,
             kAllowed + " (rotary answers one prompt per request: send several requests)");
    if (first.is_string())
      r.prompt_text = first.get<std::string>();
    else
      r.prompt_ids = token_ids(first, "prompt[0]");
    return;
  }
  r.prompt_ids = token_ids(*prompt, "prompt");
}

void read_max_tokens(const J& root, CompletionRequest& r) {
  const std::string allowed = "an integer >= 1";
  std::optional<int64_t> max_tokens, max_completion;
  if (const J* v = field(root, "max_tokens")) max_tokens = integer_in(*v, "max_tokens", 1, allowed);
  if (const J* v = field(root, "max_completion_tokens"))
    max_completion = integer_in(*v, "max_completion_tokens", 1, allowed);
  if (max_tokens && max_completion && *max_tokens != *max_completion)
    refuse("max_completion_tokens", "invalid_value", std::to_string(*max_completion),
           "the value of max_tokens (" + std::to_string(*max_tokens) + ") when both are given");
  r.max_tokens = max_completion ? max_completion : max_tokens;
}

void read_stop(const J& root, const RequestLimits& limits, CompletionRequest& r) {
  const std::string each = "a non-empty string of at most " + std::to_string(limits.max_stop_bytes) + " bytes";
  const auto one = [&](const J& v, const std::string& param) {
    if (!v.is_string()) refuse(param, "invalid_type", v, each);
    const std::string& s = v.get_ref<const std::string&>();
    if (s.empty() || int64_t(s.size()) > limits.max_stop_bytes)
      refuse(param, "invalid_value", excerpt(v) + " (" + std::to_string(s.size()) + " bytes)", each);
    r.stop.push_back(s);
  };
  const J* stop = field(root, "stop");
  if (!stop) return;
  if (stop->is_string()) return one(*stop, "stop");
  const std::string allowed = "a string, null or an array of at most " + std::to_string(limits.max_stop) + " strings";
  if (!stop->is_array()) refuse("stop", "invalid_type", *stop, allowed);
  if (int64_t(stop->size()) > limits.max_stop) refuse("stop", "invalid_value", *stop, allowed);
  for (size_t i = 0; i < stop->size(); ++i) one((*stop)[i], "stop[" + std::to_string(i) + "]");
}

// "rotary": the seeds' position methods and retrieval memory per request (CompletionRequest::positions, memory).
void read_positions(const J& root, CompletionRequest& r) {
  const J* ext = field(root, "rotary");
  if (!ext) return;
  if (!ext->is_object())
    refuse("rotary", "invalid_type", *ext,
           "an object {\"positions\", \"window\", \"leaky_k\", \"memory\", \"memory_window\", \"top_k\", \"search\"} or null");
  for (const auto& [key, value] : ext->items()) {
    const std::string param = "rotary." + key;
    if (value.is_null()) continue;
    if (key == "positions") {
      if (!value.is_string()) refuse(param, "invalid_type", value, "\"rope\", \"rerope\" or \"leaky_rerope\"");
      const std::string mode = value.get<std::string>();
      if (mode != "rope" && mode != "rerope" && mode != "leaky_rerope")
        refuse(param, "invalid_value", value, "\"rope\", \"rerope\" or \"leaky_rerope\"");
      r.positions.mode = mode;
    } else if (key == "window") {
      r.positions.window = integer_in(value, param, 1, "an integer >= 1 (the ReRoPE window, tokens)");
    } else if (key == "leaky_k") {
      r.positions.leaky_k = number_in(value, param, 0, true, 1e9);
    } else if (key == "memory") {
      const char* policies = "\"exact\", \"rerope\", \"none\" or \"unlimiformer\" (the retrieval memory's policy)";
      if (!value.is_string()) refuse(param, "invalid_type", value, policies);
      const std::string policy = value.get<std::string>();
      if (policy != "exact" && policy != "rerope" && policy != "none" && policy != "unlimiformer")
        refuse(param, "invalid_value", value, policies);
      r.memory.policy = policy;
    } else if (key == "memory_window") {
      r.memory.window = integer_in(value, param, 1, "an integer >= 1 (tokens kept exact beside the memory)");
    } else if (key == "top_k") {
      r.memory.top_k = integer_in(value, param, 0, "an integer in [0, 65536] (memory rows per query and head)");
      if (*r.memory.top_k > 65536) refuse(param, "invalid_value", value, "an integer in [0, 65536]");
    } else if (key == "search") {
      if (!value.is_string() || value.get<std::string>().empty())
        refuse(param, "invalid_type", value, "a search name: \"exact\", \"pages\", \"pages<P>\", ... (rotary generate --search)");
      r.memory.search = value.get<std::string>();
    } else {
      refuse(param, "invalid_value", value,
             "a key of rotary's extension: positions, window, leaky_k, memory, memory_window, top_k, search");
    }
  }
}

// The fields OpenAI defines that rotary does not implement, each accepted at the value that changes nothing.
void read_unsupported(const J& root) {
  const auto refuse_unless = [&](const char* key, bool harmless, const std::string& allowed) {
    if (!harmless) refuse(key, "unsupported_field", root.at(key), allowed + " (rotary does not implement " + key + ")");
  };
  const auto is_int = [](const J& v, int64_t want) { return integer_of(v) == want; };
  if (const J* v = field(root, "n")) refuse_unless("n", is_int(*v, 1), "1 or null");
  if (const J* v = field(root, "best_of")) refuse_unless("best_of", is_int(*v, 1), "1 or null");
  if (const J* v = field(root, "logprobs")) refuse_unless("logprobs", v->is_boolean() && !v->get<bool>(), "false or null");
  if (field(root, "top_logprobs")) refuse_unless("top_logprobs", false, "null");
  for (const char* key : {"presence_penalty", "frequency_penalty"})
    if (const J* v = field(root, key)) refuse_unless(key, v->is_number() && v->get<double>() == 0, "0 or null");
  if (const J* v = field(root, "logit_bias"))
    refuse_unless("logit_bias", v->is_object() && v->empty(), "{} or null");
  if (const J* v = field(root, "response_format")) {
    const auto type = v->is_object() ? v->find("type") : v->end();
    refuse_unless("response_format", v->is_object() && type != v->end() && *type == "text",
                  "{\"type\": \"text\"} or null");
  }
  if (const J* v = field(root, "tool_choice"))
    refuse_unless("tool_choice", *v == "none" || *v == "auto", "\"none\", \"auto\" or null");
  if (const J* v = field(root, "echo")) refuse_unless("echo", v->is_boolean() && !v->get<bool>(), "false or null");
  if (field(root, "suffix")) refuse_unless("suffix", false, "null");
  // parallel_tool_calls: any value (without tool calls it changes nothing); user, metadata, store, service_tier and
  // fields unknown to rotary: ignored.
}

}  // namespace

nlohmann::ordered_json ApiError::to_json() const {
  J error = J::object();
  error["message"] = valid_utf8(what());
  error["type"] = type;
  error["param"] = param.empty() ? J() : J(valid_utf8(param));
  error["code"] = code.empty() ? J() : J(valid_utf8(code));
  return J{{"error", std::move(error)}};
}

CompletionRequest parse_completion_request(std::string_view body, Endpoint endpoint, const RequestLimits& limits) {
  J root = parse_body(body, limits);
  if (!root.is_object())
    throw ApiError(400, "invalid_request_error", "", "invalid_type",
                   "request body = " + excerpt(root) + ": allowed a JSON object");
  CompletionRequest r;
  r.endpoint = endpoint;
  if (const J* model = field(root, "model")) {
    if (!model->is_string()) refuse("model", "invalid_type", *model, "a string (the model's id)");
    r.model = model->get<std::string>();
  }
  if (endpoint == Endpoint::ChatCompletions)
    read_messages(root, r);
  else
    read_prompt(root, r);
  read_max_tokens(root, r);
  if (const J* v = field(root, "temperature")) r.temperature = number_in(*v, "temperature", 0, false, 2);
  if (const J* v = field(root, "top_p")) r.top_p = number_in(*v, "top_p", 0, true, 1);
  if (const J* v = field(root, "seed")) r.seed = seed_of(*v);
  read_stop(root, limits, r);
  if (const J* v = field(root, "stream")) r.stream = boolean(*v, "stream");
  if (const J* options = field(root, "stream_options")) {
    if (!options->is_object())
      refuse("stream_options", "invalid_type", *options, "an object {\"include_usage\": true or false} or null");
    if (!r.stream) refuse("stream_options", "invalid_value", *options, "only with \"stream\": true");
    if (const J* v = field(*options, "include_usage")) r.include_usage = boolean(*v, "stream_options.include_usage");
  }
  read_positions(root, r);
  read_unsupported(root);
  return r;
}

const char* finish_reason_name(FinishReason r) { return r == FinishReason::Stop ? "stop" : "length"; }

nlohmann::ordered_json Usage::to_json() const {
  return J{{"prompt_tokens", prompt_tokens},
           {"completion_tokens", completion_tokens},
           {"total_tokens", prompt_tokens + completion_tokens},
           {"prompt_tokens_details", J{{"cached_tokens", cached_tokens}}}};
}

namespace {

J reply_head(const ReplyHeader& h, const char* object) {
  J out = J::object();
  out["id"] = h.id;
  out["object"] = object;
  out["created"] = h.created;
  out["model"] = h.model;
  return out;
}

}  // namespace

nlohmann::ordered_json completion_json(const ReplyHeader& h, const std::string& text, FinishReason finish,
                                       const Usage& usage) {
  const bool chat = h.endpoint == Endpoint::ChatCompletions;
  J out = reply_head(h, chat ? "chat.completion" : "text_completion");
  J choice = J::object();
  choice["index"] = 0;
  if (chat)
    choice["message"] = J{{"role", "assistant"}, {"content", text}};
  else
    choice["text"] = text;
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason_name(finish);
  out["choices"] = J::array({std::move(choice)});
  out["usage"] = usage.to_json();
  return out;
}

nlohmann::ordered_json chunk_json(const ReplyHeader& h, const std::string& text, bool first,
                                  std::optional<FinishReason> finish, bool include_usage) {
  const bool chat = h.endpoint == Endpoint::ChatCompletions;
  J out = reply_head(h, chat ? "chat.completion.chunk" : "text_completion");
  J choice = J::object();
  choice["index"] = 0;
  if (chat) {
    J delta = J::object();
    if (first) delta["role"] = "assistant";
    if (first || !text.empty() || !finish) delta["content"] = text;  // the last chunk's delta: {} (when no text)
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish ? J(finish_reason_name(*finish)) : J();
  out["choices"] = J::array({std::move(choice)});
  if (include_usage) out["usage"] = nullptr;
  return out;
}

nlohmann::ordered_json usage_chunk_json(const ReplyHeader& h, const Usage& usage) {
  J out = reply_head(h, h.endpoint == Endpoint::ChatCompletions ? "chat.completion.chunk" : "text_completion");
  out["choices"] = J::array();
  out["usage"] = usage.to_json();
  return out;
}

size_t find_stop(const std::string& text, const std::vector<std::string>& stops, size_t from, size_t* length) {
  size_t best = std::string::npos, best_length = 0;
  if (from <= text.size()) {
    for (const std::string& s : stops) {
      if (s.empty()) continue;
      const size_t at = text.find(s, from);
      if (at == std::string::npos) continue;
      if (at < best || (at == best && s.size() > best_length)) best = at, best_length = s.size();
    }
  }
  if (length) *length = best_length;
  return best;
}

size_t stop_prefix_held(const std::string& text, const std::vector<std::string>& stops) {
  size_t held = 0;
  for (const std::string& s : stops) {
    // The longest k < |s| (and <= |text|) whose last k bytes of text are the first k of s.
    for (size_t k = std::min(s.empty() ? 0 : s.size() - 1, text.size()); k > held; --k) {
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        held = k;
        break;
      }
    }
  }
  return held;
}

}  // namespace rotary::server
