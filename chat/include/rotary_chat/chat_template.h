// rotary_chat/chat_template.h: the chat template of a Hugging Face model directory and rendering a conversation
// with it, as transformers' apply_chat_template(messages, tokenize=False) does (docs/chat-templates.md).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "rotary_chat/jinja.h"

namespace rotary::chat {

struct ChatTemplate {
  std::string source;  // the template text
  std::string origin;  // where it came from, for messages: "<dir>/tokenizer_config.json chat_template[default]"
  // tokenizer_config.json's bos_token / eos_token (a string, or an AddedToken's content); unset when absent, and
  // then undefined in the template, as transformers leaves them.
  std::optional<std::string> bos_token, eos_token;
};

// The template of `model_dir`: `template_file` when given (it overrides the directory's), else chat_template.jinja,
// else tokenizer_config.json's chat_template - a string, or a list of {"name", "template"} from which
// `template_name` (or "tool_use" when `with_tools` and it exists, or "default") is taken; a name not there is an
// Error listing the names. A directory with no template is an Error naming --template FILE.
// `model_dir` may be a GGUF file (a regular file named *.gguf) instead: its metadata tokenizer.chat_template (a
// name: tokenizer.chat_template.<name>), with bos_token / eos_token the texts of its tokenizer.ggml.bos_token_id /
// eos_token_id tokens.
ChatTemplate load_chat_template(const std::string& model_dir, const std::string& template_file = "",
                                const std::string& template_name = "", bool with_tools = false);

// Checks `messages` as apply_chat_template needs them: a list of objects, each with a string role and a content
// that is a string, null or a list of parts (objects); an Error names the first bad one (messages[3].role).
void check_messages(const nlohmann::ordered_json& messages);

struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  bool add_generation_prompt = false;
  std::optional<nlohmann::ordered_json> tools;  // a list; unset: none in the template (transformers' tools=None)
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more variables (enable_thinking, ...)
};

// Renders `request` with `chat_template` (after check_messages): the text transformers' apply_chat_template gives.
std::string render_chat(const ChatTemplate& chat_template, const ChatRequest& request, const RenderOptions& options = {});

}  // namespace rotary::chat
