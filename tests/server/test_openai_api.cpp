// tests/server/test_openai_api.cpp: the OpenAI request parser and reply JSON (rotary_server/openai_api.h). Every
// refusal's status, code, param and message (the field, its value, what is allowed); the defaults; both endpoints;
// the bounds checked before parsing (a body past --max-body, nesting past the depth limit); the replies' shapes as
// OpenAI's; the stop-string helpers a stream holds text back by.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "rotary_server/openai_api.h"

namespace rotary::server {
namespace {

using J = nlohmann::ordered_json;
constexpr Endpoint kChat = Endpoint::ChatCompletions;
constexpr Endpoint kText = Endpoint::Completions;

const std::string kMessages = R"("messages": [{"role": "user", "content": "Hi"}])";

CompletionRequest parse(const std::string& body, Endpoint e = kChat, const RequestLimits& limits = {}) {
  return parse_completion_request(body, e, limits);
}
// A chat body: the one user message and `fields` ("" or `"key": value, ...`).
std::string chat(const std::string& fields) { return "{" + kMessages + (fields.empty() ? "" : ", " + fields) + "}"; }
std::string text(const std::string& fields) {
  return R"({"prompt": "Once")" + (fields.empty() ? "" : ", " + fields) + "}";
}

// The ApiError `body` gets: status, code, param and a message holding each of `message_parts`.
void expect_error(const std::string& body, Endpoint e, int status, const std::string& code, const std::string& param,
                  const std::vector<std::string>& message_parts, const RequestLimits& limits = {}) {
  SCOPED_TRACE(body.substr(0, 300));
  try {
    parse(body, e, limits);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& err) {
    EXPECT_EQ(err.status, status) << err.what();
    EXPECT_EQ(err.code, code) << err.what();
    EXPECT_EQ(err.param, param) << err.what();
    EXPECT_EQ(err.type, "invalid_request_error");
    for (const std::string& part : message_parts)
      EXPECT_NE(std::string(err.what()).find(part), std::string::npos) << "'" << part << "' not in: " << err.what();
    // The body always dumps (valid UTF-8) and has OpenAI's shape.
    const J j = err.to_json();
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["param"], param.empty() ? J() : J(param));
    EXPECT_EQ(j["error"]["code"], code);
    EXPECT_NO_THROW((void)j.dump());
  }
}
void chat_error(const std::string& fields, const std::string& code, const std::string& param,
                const std::vector<std::string>& parts) {
  expect_error(chat(fields), kChat, 400, code, param, parts);
}

// --- defaults and the fields read -------------------------------------------------------------------------------

TEST(OpenAiRequest, ChatDefaults) {
  const CompletionRequest r = parse(chat(""));
  EXPECT_EQ(r.endpoint, kChat);
  EXPECT_EQ(r.model, "");
  EXPECT_EQ(r.messages, J::parse(R"([{"role": "user", "content": "Hi"}])"));
  EXPECT_FALSE(r.tools);
  EXPECT_FALSE(r.prompt_text);
  EXPECT_FALSE(r.prompt_ids);
  EXPECT_FALSE(r.max_tokens);
  EXPECT_EQ(r.temperature, 1.0);
  EXPECT_EQ(r.top_p, 1.0);
  EXPECT_FALSE(r.seed);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
}

TEST(OpenAiRequest, CompletionDefaults) {
  const CompletionRequest r = parse(text(""), kText);
  EXPECT_EQ(r.endpoint, kText);
  ASSERT_TRUE(r.prompt_text);
  EXPECT_EQ(*r.prompt_text, "Once");
  EXPECT_FALSE(r.prompt_ids);
  EXPECT_TRUE(r.messages.is_null());
  EXPECT_FALSE(r.max_tokens);
  EXPECT_EQ(r.temperature, 1.0);
  EXPECT_EQ(r.top_p, 1.0);
  EXPECT_FALSE(r.stream);
}

TEST(OpenAiRequest, ChatReadsEveryField) {
  const CompletionRequest r = parse(R"({"model": "llama", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]},
      {"role": "tool", "tool_call_id": "1"},
      {"role": "my_role", "content": ""}],
    "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto", "parallel_tool_calls": false,
    "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "seed": 42, "stop": ["\n\n", "END"],
    "stream": true, "stream_options": {"include_usage": true}, "user": "u", "metadata": {"a": "b"}, "store": false,
    "service_tier": "auto", "some_client_field": [1, 2]})");
  EXPECT_EQ(r.model, "llama");
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[1]["content"][1]["text"], "b");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["id"], "1");  // kept as given
  EXPECT_EQ(r.messages[4]["role"], "my_role");
  ASSERT_TRUE(r.tools);
  EXPECT_EQ((*r.tools)[0]["function"]["name"], "f");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.temperature, 0.0);
  EXPECT_EQ(r.top_p, 0.5);
  EXPECT_EQ(r.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(OpenAiRequest, MessageKeyOrderIsKept) {
  const CompletionRequest r = parse(R"({"messages": [{"content": "x", "role": "user", "name": "n"}]})");
  EXPECT_EQ(r.messages.dump(), R"([{"content":"x","role":"user","name":"n"}])");
}

TEST(OpenAiRequest, NullIsAbsent) {
  const CompletionRequest r = parse(chat(R"("model": null, "tools": null, "max_tokens": null,
      "max_completion_tokens": null, "temperature": null, "top_p": null, "seed": null, "stop": null, "stream": null,
      "stream_options": null, "n": null, "logprobs": null, "top_logprobs": null, "presence_penalty": null,
      "frequency_penalty": null, "logit_bias": null, "response_format": null, "tool_choice": null, "echo": null,
      "best_of": null, "suffix": null)"));
  EXPECT_EQ(r.model, "");
  EXPECT_FALSE(r.tools);
  EXPECT_FALSE(r.max_tokens);
  EXPECT_EQ(r.temperature, 1.0);
  EXPECT_EQ(r.top_p, 1.0);
  EXPECT_FALSE(r.seed);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.stream);
  const CompletionRequest s = parse(chat(R"("stream": true, "stream_options": {"include_usage": null})"));
  EXPECT_TRUE(s.stream);
  EXPECT_FALSE(s.include_usage);
}

TEST(OpenAiRequest, CompletionPrompts) {
  EXPECT_EQ(*parse(R"({"prompt": ""})", kText).prompt_text, "");
  const CompletionRequest ids = parse(R"({"prompt": [1, 0, 128000, 5.0]})", kText);
  ASSERT_TRUE(ids.prompt_ids);
  EXPECT_FALSE(ids.prompt_text);
  EXPECT_EQ(*ids.prompt_ids, (std::vector<int64_t>{1, 0, 128000, 5}));
  // A list of one prompt is that prompt.
  EXPECT_EQ(*parse(R"({"prompt": ["Hello"]})", kText).prompt_text, "Hello");
  EXPECT_EQ(*parse(R"({"prompt": [[3, 4]]})", kText).prompt_ids, (std::vector<int64_t>{3, 4}));
  // Completions take max_tokens, and max_completion_tokens as chat does.
  EXPECT_EQ(parse(text(R"("max_tokens": 16)"), kText).max_tokens, 16);
  EXPECT_EQ(parse(text(R"("max_completion_tokens": 9)"), kText).max_tokens, 9);
  EXPECT_EQ(parse(text(R"("max_tokens": 9, "max_completion_tokens": 9)"), kText).max_tokens, 9);
  // Each endpoint ignores the other's input field.
  EXPECT_FALSE(parse(R"({"prompt": 5, "messages": [{"role": "user"}]})", kChat).prompt_text);
  EXPECT_TRUE(parse(R"({"prompt": "p", "messages": 5})", kText).messages.is_null());
}

TEST(OpenAiRequest, Numbers) {
  EXPECT_EQ(parse(chat(R"("max_tokens": 1)")).max_tokens, 1);
  EXPECT_EQ(parse(chat(R"("max_tokens": 64.0)")).max_tokens, 64);  // the project's integer rule (json_guard.h)
  EXPECT_EQ(parse(chat(R"("max_tokens": 9223372036854775807)")).max_tokens, INT64_MAX);
  EXPECT_EQ(parse(chat(R"("max_tokens": 5, "max_completion_tokens": 5)")).max_tokens, 5);
  EXPECT_EQ(parse(chat(R"("temperature": 2)")).temperature, 2.0);
  EXPECT_EQ(parse(chat(R"("temperature": 0.7)")).temperature, 0.7);
  EXPECT_EQ(parse(chat(R"("top_p": 1)")).top_p, 1.0);
  EXPECT_EQ(parse(chat(R"("top_p": 1e-9)")).top_p, 1e-9);
  EXPECT_EQ(parse(chat(R"("seed": 0)")).seed, 0u);
  EXPECT_EQ(parse(chat(R"("seed": -1)")).seed, UINT64_MAX);  // a client's int64, modulo 2^64
  EXPECT_EQ(parse(chat(R"("seed": -9223372036854775808)")).seed, uint64_t(1) << 63);
  EXPECT_EQ(parse(chat(R"("seed": 18446744073709551615)")).seed, UINT64_MAX);
  EXPECT_EQ(parse(chat(R"("seed": 7.0)")).seed, 7u);
}

TEST(OpenAiRequest, Stop) {
  EXPECT_EQ(parse(chat(R"("stop": "###")")).stop, std::vector<std::string>{"###"});
  EXPECT_TRUE(parse(chat(R"("stop": [])")).stop.empty());
  EXPECT_EQ(parse(chat(R"("stop": ["a", "b", "c", "d"])")).stop.size(), 4u);
  const std::string longest(256, 'x');
  EXPECT_EQ(parse(chat(R"("stop": ")" + longest + "\"")).stop[0], longest);
  RequestLimits limits;
  limits.max_stop = 6;
  EXPECT_EQ(parse(chat(R"("stop": ["1", "2", "3", "4", "5", "6"])"), kChat, limits).stop.size(), 6u);
}

TEST(OpenAiRequest, HarmlessValuesOfUnsupportedFields) {
  const CompletionRequest r = parse(chat(R"("n": 1, "logprobs": false, "presence_penalty": 0,
      "frequency_penalty": 0.0, "logit_bias": {}, "response_format": {"type": "text"}, "tool_choice": "none",
      "echo": false, "best_of": 1, "parallel_tool_calls": true, "temperature": 0.5)"));
  EXPECT_EQ(r.temperature, 0.5);
  EXPECT_NO_THROW(parse(text(R"("n": 1.0, "tool_choice": "auto", "echo": false, "best_of": 1, "logprobs": null)"),
                        kText));
}

// --- refusals ---------------------------------------------------------------------------------------------------

TEST(OpenAiRequestErrors, BodyTooLarge) {
  RequestLimits limits;
  limits.max_body_bytes = 100;
  const std::string body = chat(R"("user": ")" + std::string(200, 'u') + "\"");
  expect_error(body, kChat, 413, "body_too_large", "",
               {"request body = " + std::to_string(body.size()) + " bytes", "at most 100 bytes"}, limits);
  // Exactly at the limit is accepted.
  const std::string fits = chat("");
  limits.max_body_bytes = int64_t(fits.size());
  EXPECT_NO_THROW(parse(fits, kChat, limits));
  // Checked before anything else: a huge body that is not even JSON is 413, not 400.
  RequestLimits small;
  small.max_body_bytes = 1 << 20;
  expect_error(std::string(2 << 20, '['), kText, 413, "body_too_large", "", {"at most 1048576 bytes"}, small);
}

TEST(OpenAiRequestErrors, DeepNestingRefusedBeforeParsing) {
  // A million '[' would overflow a recursive walk of the parsed value; it is refused from a byte scan.
  const std::string deep = R"({"messages": [{"role": "user", "content": "x"}], "user": )" + std::string(1000000, '[') +
                           std::string(1000000, ']') + "}";
  expect_error(deep, kChat, 400, "invalid_json", "", {"nesting depth = 1000001", "at most 64 levels"});
  // Unbalanced, too: the scan does not need the text to be JSON.
  expect_error(std::string(100000, '{'), kText, 400, "invalid_json", "", {"nesting depth = 100000"});
  // Brackets inside strings do not count.
  EXPECT_NO_THROW(parse(chat(R"("user": ")" + std::string(1000, '[') + "\"")));
  // At the limit: accepted; one more: refused.
  RequestLimits limits;
  limits.max_json_depth = 3;
  EXPECT_NO_THROW(parse(chat(R"("metadata": {"a": [1]})"), kChat, limits));  // body, metadata, a: 3 levels
  expect_error(chat(R"("metadata": {"a": [[1]]})"), kChat, 400, "invalid_json", "",
               {"nesting depth = 4", "at most 3"}, limits);
}

TEST(OpenAiRequestErrors, MalformedJson) {
  expect_error("", kChat, 400, "invalid_json", "", {"malformed JSON at byte 1"});
  expect_error(R"({"messages": [}])", kChat, 400, "invalid_json", "", {"malformed JSON at byte 15"});
  expect_error(R"({"a": 1} x)", kText, 400, "invalid_json", "", {"malformed JSON at byte 10"});
  expect_error("{\"a\": \"\xff\xfe\"}", kText, 400, "invalid_json", "", {"malformed JSON at byte"});
  expect_error(R"({"a": 1, // comment
               })", kChat, 400, "invalid_json", "", {"malformed JSON"});
  // A number past a double's range is not a parse_error to nlohmann; the byte is found all the same.
  expect_error(R"({"temperature": 1e400})", kChat, 400, "invalid_json", "", {"malformed JSON at byte 21", "1e400"});
}

TEST(OpenAiRequestErrors, BodyNotAnObject) {
  expect_error("[1, 2]", kChat, 400, "invalid_type", "", {"request body = [1,2]: allowed a JSON object"});
  expect_error("\"hi\"", kText, 400, "invalid_type", "", {"request body = \"hi\""});
  expect_error("null", kText, 400, "invalid_type", "", {"request body = null"});
}

TEST(OpenAiRequestErrors, Messages) {
  expect_error("{}", kChat, 400, "missing_field", "messages", {"messages = (missing): allowed a non-empty array"});
  expect_error(R"({"messages": null})", kChat, 400, "missing_field", "messages", {"(missing)"});
  expect_error(R"({"messages": "hi"})", kChat, 400, "invalid_type", "messages", {"messages = \"hi\""});
  expect_error(R"({"messages": []})", kChat, 400, "invalid_value", "messages", {"messages = []", "non-empty"});
  expect_error(R"({"messages": [{"role": "user", "content": "a"}, 3]})", kChat, 400, "invalid_type", "messages[1]",
               {"messages[1] = 3: allowed an object"});
  expect_error(R"({"messages": [{"content": "a"}]})", kChat, 400, "missing_field", "messages[0].role",
               {"messages[0].role = (missing)"});
  expect_error(R"({"messages": [{"role": 5, "content": "a"}]})", kChat, 400, "invalid_type", "messages[0].role",
               {"messages[0].role = 5: allowed a non-empty string"});
  expect_error(R"({"messages": [{"role": null}]})", kChat, 400, "invalid_type", "messages[0].role", {"= null"});
  expect_error(R"({"messages": [{"role": "user"}, {"role": "", "content": "a"}]})", kChat, 400, "invalid_value",
               "messages[1].role", {"messages[1].role = \"\": allowed a non-empty string"});
  expect_error(R"({"messages": [{"role": "user", "content": 5}]})", kChat, 400, "invalid_type", "messages[0].content",
               {"messages[0].content = 5: allowed a string, null or an array of text parts"});
  expect_error(R"({"messages": [{"role": "user", "content": {"type": "text"}}]})", kChat, 400, "invalid_type",
               "messages[0].content", {"{\"type\":\"text\"}"});
}

TEST(OpenAiRequestErrors, ContentParts) {
  const auto with_parts = [](const std::string& parts) {
    return R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [)" + parts + "]}]}";
  };
  expect_error(with_parts(R"({"type": "text", "text": "a"}, "b")"), kChat, 400, "invalid_type",
               "messages[1].content[1]", {"messages[1].content[1] = \"b\": allowed a text part"});
  expect_error(with_parts(R"({"text": "a"})"), kChat, 400, "missing_field", "messages[1].content[0].type",
               {"messages[1].content[0].type = (missing): allowed \"text\""});
  expect_error(with_parts(R"({"type": 1, "text": "a"})"), kChat, 400, "invalid_type", "messages[1].content[0].type",
               {"= 1"});
  expect_error(with_parts(R"({"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}})"),
               kChat, 400, "unsupported_field", "messages[1].content[1].type",
               {"messages[1].content[1].type = \"image_url\": allowed \"text\""});
  expect_error(with_parts(R"({"type": "input_audio"})"), kChat, 400, "unsupported_field",
               "messages[1].content[0].type", {"\"input_audio\""});
  expect_error(with_parts(R"({"type": "text"})"), kChat, 400, "missing_field", "messages[1].content[0].text",
               {"messages[1].content[0].text = (missing): allowed a string"});
  expect_error(with_parts(R"({"type": "text", "text": null})"), kChat, 400, "invalid_type",
               "messages[1].content[0].text", {"= null: allowed a string"});
  expect_error(R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text",
                 "text": "a"}]}, {"role": "user", "content": [{"type": "text", "text": ["x"]}]}]})",
               kChat, 400, "invalid_type", "messages[2].content[0].text", {"messages[2].content[0].text = [\"x\"]"});
}

TEST(OpenAiRequestErrors, Tools) {
  chat_error(R"("tools": {"type": "function"})", "invalid_type", "tools", {"tools = {\"type\":\"function\"}"});
  chat_error(R"("tools": [{"type": "function"}, "f"])", "invalid_type", "tools[1]", {"tools[1] = \"f\""});
}

TEST(OpenAiRequestErrors, Prompt) {
  expect_error("{}", kText, 400, "missing_field", "prompt", {"prompt = (missing): allowed a string or an array"});
  expect_error(R"({"prompt": 5})", kText, 400, "invalid_type", "prompt", {"prompt = 5"});
  expect_error(R"({"prompt": {"text": "a"}})", kText, 400, "invalid_type", "prompt", {"prompt = {\"text\":\"a\"}"});
  expect_error(R"({"prompt": []})", kText, 400, "invalid_value", "prompt", {"prompt = []"});
  expect_error(R"({"prompt": ["a", "b"]})", kText, 400, "unsupported_field", "prompt",
               {"prompt = [\"a\",\"b\"]", "one prompt per request"});
  expect_error(R"({"prompt": [[1], [2]]})", kText, 400, "unsupported_field", "prompt", {"prompt = [[1],[2]]"});
  expect_error(R"({"prompt": [1, -2]})", kText, 400, "invalid_value", "prompt[1]",
               {"prompt[1] = -2: allowed a token id (an integer >= 0)"});
  expect_error(R"({"prompt": [1, 2.5]})", kText, 400, "invalid_value", "prompt[1]", {"prompt[1] = 2.5"});
  expect_error(R"({"prompt": [1, 2, "x"]})", kText, 400, "invalid_type", "prompt[2]", {"prompt[2] = \"x\""});
  expect_error(R"({"prompt": [1, null]})", kText, 400, "invalid_type", "prompt[1]", {"prompt[1] = null"});
  expect_error(R"({"prompt": [[]]})", kText, 400, "invalid_value", "prompt[0]", {"prompt[0] = []"});
  expect_error(R"({"prompt": [[1, true]]})", kText, 400, "invalid_type", "prompt[0][1]", {"prompt[0][1] = true"});
  expect_error(R"({"prompt": [1, 18446744073709551615]})", kText, 400, "invalid_value", "prompt[1]",
               {"18446744073709551615"});
}

TEST(OpenAiRequestErrors, Model) {
  chat_error(R"("model": 3)", "invalid_type", "model", {"model = 3: allowed a string"});
  expect_error(text(R"("model": ["a"])"), kText, 400, "invalid_type", "model", {"model = [\"a\"]"});
}

TEST(OpenAiRequestErrors, MaxTokens) {
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    const std::string k = key;
    chat_error("\"" + k + "\": 0", "invalid_value", k, {k + " = 0: allowed an integer >= 1"});
    chat_error("\"" + k + "\": -5", "invalid_value", k, {k + " = -5"});
    chat_error("\"" + k + "\": 2.5", "invalid_value", k, {k + " = 2.5"});
    chat_error("\"" + k + "\": 1e300", "invalid_value", k, {k + " = 1e+300"});
    chat_error("\"" + k + "\": 9223372036854775808", "invalid_value", k, {"9223372036854775808"});
    chat_error("\"" + k + "\": \"16\"", "invalid_type", k, {k + " = \"16\""});
    chat_error("\"" + k + "\": true", "invalid_type", k, {k + " = true"});
    expect_error(text("\"" + k + "\": 0"), kText, 400, "invalid_value", k, {k + " = 0"});
  }
  chat_error(R"("max_tokens": 5, "max_completion_tokens": 6)", "invalid_value", "max_completion_tokens",
             {"max_completion_tokens = 6: allowed the value of max_tokens (5)"});
  expect_error(text(R"("max_tokens": 5, "max_completion_tokens": 6)"), kText, 400, "invalid_value",
               "max_completion_tokens", {"max_tokens (5)"});
}

TEST(OpenAiRequestErrors, SamplingNumbers) {
  chat_error(R"("temperature": 3.5)", "invalid_value", "temperature", {"temperature = 3.5: allowed a number in [0, 2]"});
  chat_error(R"("temperature": -0.1)", "invalid_value", "temperature", {"temperature = -0.1"});
  chat_error(R"("temperature": 2.0000001)", "invalid_value", "temperature", {"temperature = 2.0000001"});
  chat_error(R"("temperature": "hot")", "invalid_type", "temperature", {"temperature = \"hot\""});
  chat_error(R"("top_p": 0)", "invalid_value", "top_p", {"top_p = 0: allowed a number in (0, 1]"});
  chat_error(R"("top_p": 1.5)", "invalid_value", "top_p", {"top_p = 1.5"});
  chat_error(R"("top_p": -1)", "invalid_value", "top_p", {"top_p = -1"});
  chat_error(R"("top_p": [0.5])", "invalid_type", "top_p", {"top_p = [0.5]"});
  chat_error(R"("seed": 1.5)", "invalid_value", "seed", {"seed = 1.5: allowed an integer in [-2^63, 2^64 - 1]"});
  chat_error(R"("seed": 18446744073709551616)", "invalid_value", "seed", {"seed = 1.8446744073709552e+19"});
  chat_error(R"("seed": "42")", "invalid_type", "seed", {"seed = \"42\""});
  expect_error(text(R"("temperature": 9)"), kText, 400, "invalid_value", "temperature", {"temperature = 9"});
}

TEST(OpenAiRequestErrors, Stop) {
  chat_error(R"("stop": 5)", "invalid_type", "stop", {"stop = 5: allowed a string, null or an array of at most 4"});
  chat_error(R"("stop": "")", "invalid_value", "stop", {"stop = \"\" (0 bytes): allowed a non-empty string"});
  chat_error(R"("stop": ["a", "b", "c", "d", "e"])", "invalid_value", "stop", {"at most 4 strings"});
  chat_error(R"("stop": ["a", 1])", "invalid_type", "stop[1]", {"stop[1] = 1: allowed a non-empty string"});
  chat_error(R"("stop": ["a", null])", "invalid_type", "stop[1]", {"stop[1] = null"});
  chat_error(R"("stop": ["a", "b", ""])", "invalid_value", "stop[2]", {"stop[2] = \"\""});
  // Too long: the value abbreviated, its length given.
  chat_error(R"("stop": ["a", ")" + std::string(257, 'x') + "\"]", "invalid_value", "stop[1]",
             {"stop[1] = \"xxxxxxxx", "...", "(257 bytes): allowed a non-empty string of at most 256 bytes"});
  try {
    parse(chat(R"("stop": ")" + std::string(100000, 'y') + "\""));
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "stop");
    EXPECT_LT(std::string(e.what()).size(), 300u) << "the value is abbreviated";
  }
  RequestLimits limits;
  limits.max_stop = 1, limits.max_stop_bytes = 3;
  expect_error(chat(R"("stop": ["a", "b"])"), kChat, 400, "invalid_value", "stop", {"at most 1 strings"}, limits);
  expect_error(chat(R"("stop": "abcd")"), kChat, 400, "invalid_value", "stop", {"at most 3 bytes"}, limits);
}

TEST(OpenAiRequestErrors, Stream) {
  chat_error(R"("stream": "yes")", "invalid_type", "stream", {"stream = \"yes\": allowed true, false or null"});
  chat_error(R"("stream": 1)", "invalid_type", "stream", {"stream = 1"});
  chat_error(R"("stream_options": {"include_usage": true})", "invalid_value", "stream_options",
             {"stream_options = {\"include_usage\":true}: allowed only with \"stream\": true"});
  chat_error(R"("stream": false, "stream_options": {"include_usage": true})", "invalid_value", "stream_options", {});
  chat_error(R"("stream": true, "stream_options": true)", "invalid_type", "stream_options", {"stream_options = true"});
  chat_error(R"("stream": true, "stream_options": {"include_usage": "yes"})", "invalid_type",
             "stream_options.include_usage", {"stream_options.include_usage = \"yes\": allowed true, false or null"});
  expect_error(text(R"("stream_options": {})"), kText, 400, "invalid_value", "stream_options", {});
  EXPECT_TRUE(parse(text(R"("stream": true, "stream_options": {"include_usage": true})"), kText).include_usage);
}

TEST(OpenAiRequestErrors, UnsupportedFields) {
  struct Case {
    std::string field, value, shown;
  };
  const std::vector<Case> cases = {
      {"n", "2", "n = 2: allowed 1 or null"},
      {"n", "\"1\"", "n = \"1\""},
      {"best_of", "3", "best_of = 3: allowed 1 or null"},
      {"logprobs", "true", "logprobs = true: allowed false or null"},
      {"logprobs", "5", "logprobs = 5"},
      {"top_logprobs", "0", "top_logprobs = 0: allowed null"},
      {"presence_penalty", "0.5", "presence_penalty = 0.5: allowed 0 or null"},
      {"frequency_penalty", "-1", "frequency_penalty = -1: allowed 0 or null"},
      {"frequency_penalty", "\"0\"", "frequency_penalty = \"0\""},
      {"logit_bias", "{\"50256\": -100}", "logit_bias = {\"50256\":-100}: allowed {} or null"},
      {"logit_bias", "[]", "logit_bias = []"},
      {"response_format", "{\"type\": \"json_object\"}", "response_format = {\"type\":\"json_object\"}"},
      {"response_format", "\"text\"", "response_format = \"text\""},
      {"tool_choice", "\"required\"", "tool_choice = \"required\": allowed \"none\", \"auto\" or null"},
      {"tool_choice", "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}", "tool_choice = {"},
      {"echo", "true", "echo = true: allowed false or null"},
      {"suffix", "\"end\"", "suffix = \"end\": allowed null"},
  };
  for (const Case& c : cases) {
    chat_error("\"" + c.field + "\": " + c.value, "unsupported_field", c.field, {c.shown, "rotary does not implement"});
    expect_error(text("\"" + c.field + "\": " + c.value), kText, 400, "unsupported_field", c.field, {c.shown});
  }
}

TEST(OpenAiRequestErrors, LongValuesAreAbbreviated) {
  const std::string body = chat(R"("temperature": ")" + std::string(5000, 't') + "\"");
  try {
    parse(body);
    ADD_FAILURE();
  } catch (const ApiError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.param, "temperature");
    EXPECT_LT(what.size(), 200u) << what;
    EXPECT_NE(what.find("temperature = \"ttt"), std::string::npos) << what;
    EXPECT_NE(what.find("...: allowed a number in [0, 2]"), std::string::npos) << what;
  }
}

// --- the error body ---------------------------------------------------------------------------------------------

TEST(OpenAiError, Json) {
  const ApiError e(400, "invalid_request_error", "messages[2].role", "invalid_type", "messages[2].role = 5: ...");
  EXPECT_EQ(e.to_json().dump(), R"({"error":{"message":"messages[2].role = 5: ...","type":"invalid_request_error",)"
                                R"("param":"messages[2].role","code":"invalid_type"}})");
  const ApiError none(503, "server_error", "", "", "busy");
  EXPECT_EQ(none.to_json().dump(), R"({"error":{"message":"busy","type":"server_error","param":null,"code":null}})");
  // A message quoting bytes that are not UTF-8 (a name cut mid-character) still dumps.
  const ApiError cut(404, "invalid_request_error", "model", "model_not_found", "model = \"\xc3\": unknown");
  EXPECT_EQ(cut.to_json()["error"]["message"], "model = \"\xef\xbf\xbd\": unknown");
  // A parser message quoting invalid bytes, too.
  try {
    parse("{\"messages\": \xff}");
    ADD_FAILURE();
  } catch (const ApiError& err) {
    EXPECT_EQ(err.code, "invalid_json");
    EXPECT_NO_THROW((void)err.to_json().dump());
  }
}

// --- replies ----------------------------------------------------------------------------------------------------

const ReplyHeader kChatHead{"chatcmpl-1", "llama", 1700000000, kChat};
const ReplyHeader kTextHead{"cmpl-1", "llama", 1700000001, kText};

TEST(OpenAiReply, Usage) {
  EXPECT_EQ(Usage({5, 3}).to_json().dump(), R"({"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":0}})");
  EXPECT_EQ(Usage({5, 3, 4}).to_json().dump(),
            R"({"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":4}})");
  EXPECT_STREQ(finish_reason_name(FinishReason::Stop), "stop");
  EXPECT_STREQ(finish_reason_name(FinishReason::Length), "length");
}

TEST(OpenAiReply, ChatCompletion) {
  EXPECT_EQ(completion_json(kChatHead, "Hello!", FinishReason::Stop, {10, 2}).dump(),
            R"({"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"llama",)"
            R"("choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"logprobs":null,)"
            R"("finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":0}}})");
  EXPECT_EQ(completion_json(kChatHead, "", FinishReason::Length, {1, 0})["choices"][0]["finish_reason"], "length");
}

TEST(OpenAiReply, TextCompletion) {
  EXPECT_EQ(completion_json(kTextHead, " upon a time", FinishReason::Length, {1, 4}).dump(),
            R"({"id":"cmpl-1","object":"text_completion","created":1700000001,"model":"llama",)"
            R"("choices":[{"index":0,"text":" upon a time","logprobs":null,"finish_reason":"length"}],)"
            R"("usage":{"prompt_tokens":1,"completion_tokens":4,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}})");
}

TEST(OpenAiReply, ChatChunks) {
  const std::string head = R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"llama",)";
  EXPECT_EQ(chunk_json(kChatHead, "", true, std::nullopt, false).dump(),
            head + R"("choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,)"
                   R"("finish_reason":null}]})");
  EXPECT_EQ(chunk_json(kChatHead, "Hel", false, std::nullopt, false).dump(),
            head + R"("choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}]})");
  EXPECT_EQ(chunk_json(kChatHead, "", false, FinishReason::Stop, false).dump(),
            head + R"("choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]})");
  // With include_usage every chunk carries "usage": null.
  EXPECT_EQ(chunk_json(kChatHead, "lo", false, std::nullopt, true).dump(),
            head + R"("choices":[{"index":0,"delta":{"content":"lo"},"logprobs":null,"finish_reason":null}],)"
                   R"("usage":null})");
  EXPECT_EQ(chunk_json(kChatHead, "", false, FinishReason::Length, true)["usage"], J());
  EXPECT_TRUE(chunk_json(kChatHead, "", false, FinishReason::Length, true).contains("usage"));
  EXPECT_FALSE(chunk_json(kChatHead, "", false, FinishReason::Length, false).contains("usage"));
  // A last chunk that still has text carries it.
  EXPECT_EQ(chunk_json(kChatHead, "!", false, FinishReason::Stop, false)["choices"][0]["delta"], J({{"content", "!"}}));
  EXPECT_EQ(usage_chunk_json(kChatHead, {4, 6}).dump(),
            head + R"("choices":[],"usage":{"prompt_tokens":4,"completion_tokens":6,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}})");
}

TEST(OpenAiReply, TextChunks) {
  const std::string head = R"({"id":"cmpl-1","object":"text_completion","created":1700000001,"model":"llama",)";
  EXPECT_EQ(chunk_json(kTextHead, " upon", true, std::nullopt, false).dump(),
            head + R"("choices":[{"index":0,"text":" upon","logprobs":null,"finish_reason":null}]})");
  EXPECT_EQ(chunk_json(kTextHead, "", false, FinishReason::Length, true).dump(),
            head + R"("choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}],"usage":null})");
  EXPECT_EQ(usage_chunk_json(kTextHead, {1, 2}).dump(),
            head + R"("choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}})");
}

// --- stop strings -----------------------------------------------------------------------------------------------

TEST(StopStrings, FindStop) {
  const std::vector<std::string> stops = {"END", "\n\n", "ab"};
  size_t length = 99;
  EXPECT_EQ(find_stop("hello", stops, 0, &length), std::string::npos);
  EXPECT_EQ(length, 0u);
  EXPECT_EQ(find_stop("one\n\ntwo END", stops, 0, &length), 3u);
  EXPECT_EQ(length, 2u);
  EXPECT_EQ(find_stop("one\n\ntwo END", stops, 4, &length), 9u);  // from byte 4: "\n\n" starts before it
  EXPECT_EQ(length, 3u);
  EXPECT_EQ(find_stop("xxENDab", stops, 0), 2u);  // the first occurrence, whichever stop it is
  EXPECT_EQ(find_stop("xxabEND", stops, 0), 2u);
  EXPECT_EQ(find_stop("END", stops, 3), std::string::npos);
  EXPECT_EQ(find_stop("END", stops, 100), std::string::npos);  // past the end
  EXPECT_EQ(find_stop("", stops, 0), std::string::npos);
  EXPECT_EQ(find_stop("anything", {}, 0), std::string::npos);
  EXPECT_EQ(find_stop("anything", {""}, 0), std::string::npos);  // an empty stop never matches
  // Two starting at the same byte: the longer.
  EXPECT_EQ(find_stop("x<|end|>", {"<|", "<|end|>"}, 0, &length), 1u);
  EXPECT_EQ(length, 7u);
  // Bytes, not characters: a stop inside a multi-byte character matches where its bytes are.
  EXPECT_EQ(find_stop("a\xc3\xa9", {"\xa9"}, 0), 2u);
}

TEST(StopStrings, PrefixHeld) {
  const std::vector<std::string> stops = {"</answer>", "\n\n"};
  EXPECT_EQ(stop_prefix_held("The end", stops), 0u);
  EXPECT_EQ(stop_prefix_held("The end<", stops), 1u);
  EXPECT_EQ(stop_prefix_held("The end</ans", stops), 5u);
  EXPECT_EQ(stop_prefix_held("The end</answer", stops), 8u);  // a proper prefix: at most |stop| - 1
  EXPECT_EQ(stop_prefix_held("The end</answer>", stops), 0u);  // the whole stop is find_stop's, nothing held
  EXPECT_EQ(stop_prefix_held("line\n", stops), 1u);
  EXPECT_EQ(stop_prefix_held("", stops), 0u);
  EXPECT_EQ(stop_prefix_held("</a", {"</a>", "</ab>", "a"}), 3u);  // the longest over all stops
  EXPECT_EQ(stop_prefix_held("<", {"<"}), 0u);                     // a one-byte stop has no proper prefix
  EXPECT_EQ(stop_prefix_held("abab", {"ababc"}), 4u);
  EXPECT_EQ(stop_prefix_held("xaab", {"aab!", "b?"}), 3u);
  EXPECT_EQ(stop_prefix_held("ab", {"abcdef"}), 2u);  // the whole text may be held
  EXPECT_EQ(stop_prefix_held("abc", {}), 0u);
  EXPECT_EQ(stop_prefix_held("abc", {""}), 0u);
}

// --- rotary's extension: the seeds' position methods per request ------------------------------------------------

TEST(OpenAiRequest, RotaryPositions) {
  EXPECT_FALSE(parse(chat("")).positions.any());
  const CompletionRequest r = parse(chat(R"("rotary": {"positions": "leaky_rerope", "window": 512, "leaky_k": 16})"));
  EXPECT_EQ(r.positions.mode, "leaky_rerope");
  EXPECT_EQ(r.positions.window, 512);
  EXPECT_EQ(r.positions.leaky_k, 16.0);
  EXPECT_FALSE(parse(text(R"("rotary": {"window": null})"), kText).positions.any());
  EXPECT_FALSE(parse(chat(R"("rotary": null)")).positions.any());
}

TEST(OpenAiRequestErrors, RotaryPositions) {
  chat_error(R"("rotary": 3)", "invalid_type", "rotary", {"rotary = 3", "an object"});
  chat_error(R"("rotary": {"positions": "yarn"})", "invalid_value", "rotary.positions", {"\"yarn\"", "rerope"});
  chat_error(R"("rotary": {"positions": 1})", "invalid_type", "rotary.positions", {"rerope"});
  chat_error(R"("rotary": {"window": 0})", "invalid_value", "rotary.window", {"rotary.window = 0", ">= 1"});
  chat_error(R"("rotary": {"window": "8"})", "invalid_type", "rotary.window", {">= 1"});
  chat_error(R"("rotary": {"leaky_k": 0})", "invalid_value", "rotary.leaky_k", {"(0,"});
  chat_error(R"("rotary": {"memory_size": 3})", "invalid_value", "rotary.memory_size",
             {"positions, window, leaky_k, memory, memory_window, top_k, search"});
}

TEST(OpenAiRequest, RotaryMemory) {
  EXPECT_FALSE(parse(chat("")).memory.any());
  const CompletionRequest r =
      parse(chat(R"("rotary": {"memory": "rerope", "memory_window": 256, "top_k": 0, "search": "pages<4>"})"));
  EXPECT_EQ(r.memory.policy, "rerope");
  EXPECT_EQ(r.memory.window, 256);
  EXPECT_EQ(r.memory.top_k, 0);
  EXPECT_EQ(r.memory.search, "pages<4>");
  EXPECT_FALSE(r.positions.any());
  EXPECT_FALSE(parse(text(R"("rotary": {"memory": null, "top_k": null})"), kText).memory.any());
}

TEST(OpenAiRequestErrors, RotaryMemory) {
  chat_error(R"("rotary": {"memory": "all"})", "invalid_value", "rotary.memory", {"\"all\"", "unlimiformer"});
  chat_error(R"("rotary": {"memory": true})", "invalid_type", "rotary.memory", {"exact"});
  chat_error(R"("rotary": {"memory_window": 0})", "invalid_value", "rotary.memory_window", {">= 1"});
  chat_error(R"("rotary": {"top_k": -1})", "invalid_value", "rotary.top_k", {"[0, 65536]"});
  chat_error(R"("rotary": {"top_k": 70000})", "invalid_value", "rotary.top_k", {"[0, 65536]"});
  chat_error(R"("rotary": {"search": ""})", "invalid_type", "rotary.search", {"pages"});
}

}  // namespace
}  // namespace rotary::server
