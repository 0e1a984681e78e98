// chat/src/chat_template.cpp: a model directory's chat template, the messages check and apply_chat_template.
#include "rotary_chat/chat_template.h"

#include <filesystem>
#include <map>

#include "rotary/error.h"
#include "rotary/hf_config.h"
#include "rotary/files.h"
#include "rotary/gguf.h"
#include "rotary/json_guard.h"

namespace rotary::chat {
namespace {

nlohmann::ordered_json parse_ordered(const std::string& text, const std::string& source) {
  check_json_depth(text, source);
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(source, std::string("malformed JSON (") + e.what() + ")", "JSON text");
  }
}

std::string excerpt(const nlohmann::ordered_json& v) { return json_excerpt(nlohmann::json::parse(v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))); }

}  // namespace

namespace {

// --template FILE, which overrides a model's own template (a directory's or a GGUF file's): true when given.
bool take_template_file(ChatTemplate& out, const std::string& template_file, const std::string& template_name) {
  if (template_file.empty()) return false;
  if (!template_name.empty())
    fail("--template-name", quoted_text(template_name), "no name with --template FILE (the file is the template)");
  out.source = read_regular_file(template_file, "--template");
  out.origin = template_file;
  return true;
}

// A GGUF file's template (llama.cpp's converter writes tokenizer_config.json's chat_template there, a named one as
// tokenizer.chat_template.<name>) and its BOS / EOS tokens' texts.
ChatTemplate gguf_chat_template(const std::string& path, const std::string& template_file,
                                const std::string& template_name) {
  const GgufFile f = GgufFile::open(path);
  ChatTemplate out;
  const std::vector<std::string_view> tokens =
      f.find("tokenizer.ggml.tokens") ? f.get_strings("tokenizer.ggml.tokens") : std::vector<std::string_view>{};
  for (const auto& [key, text] : {std::pair{"tokenizer.ggml.bos_token_id", &out.bos_token},
                                  std::pair{"tokenizer.ggml.eos_token_id", &out.eos_token}}) {
    const std::optional<uint32_t> id = f.get_optional<uint32_t>(key);
    if (!id) continue;
    if (*id >= tokens.size())
      fail(f.source() + ": metadata " + key, std::to_string(*id),
           "a token id in [0, " + std::to_string(tokens.size()) + ") (tokenizer.ggml.tokens)");
    *text = std::string(tokens[*id]);
  }
  if (take_template_file(out, template_file, template_name)) return out;
  const std::string key = "tokenizer.chat_template" + (template_name.empty() ? "" : "." + template_name);
  const std::optional<std::string_view> text = f.get_optional_string(key);
  if (!text)
    fail("chat template of " + path, "(none: no metadata " + key + ")",
         "a GGUF file with a chat template, or --template FILE");
  out.source = std::string(*text);
  out.origin = f.source() + " " + key;
  return out;
}

}  // namespace

ChatTemplate load_chat_template(const std::string& model_dir, const std::string& template_file,
                                const std::string& template_name, bool with_tools) {
  namespace fs = std::filesystem;
  std::error_code gguf_ec;
  if (fs::path(model_dir).extension() == ".gguf" && !fs::is_directory(model_dir, gguf_ec))
    return gguf_chat_template(model_dir, template_file, template_name);
  ChatTemplate out;
  const std::string config_path = (fs::path(model_dir) / "tokenizer_config.json").string();
  std::optional<nlohmann::ordered_json> config;
  std::error_code ec;
  if (fs::exists(config_path, ec)) {
    config = parse_ordered(read_regular_file(config_path, "tokenizer_config.json"), config_path);
    if (!config->is_object()) fail(config_path, excerpt(*config), "a JSON object");
    out.bos_token = hf_special_token(nlohmann::json(*config), "bos_token", config_path);
    out.eos_token = hf_special_token(nlohmann::json(*config), "eos_token", config_path);
  }
  if (take_template_file(out, template_file, template_name)) return out;
  const std::string jinja_path = (fs::path(model_dir) / "chat_template.jinja").string();
  if (fs::exists(jinja_path, ec) && template_name.empty()) {
    out.source = read_regular_file(jinja_path, "chat_template.jinja");
    out.origin = jinja_path;
    return out;
  }
  const nlohmann::ordered_json* tmpl = nullptr;
  if (config) {
    const auto it = config->find("chat_template");
    if (it != config->end() && !it->is_null()) tmpl = &*it;
  }
  if (!tmpl) {
    if (!template_name.empty() && fs::exists(jinja_path, ec))
      fail("--template-name", quoted_text(template_name),
           "no name: " + jinja_path + " is the directory's one template");
    fail("chat template of " + model_dir, "(none: no chat_template.jinja, no chat_template in tokenizer_config.json)",
         "a model directory with a chat template, or --template FILE");
  }
  if (tmpl->is_string()) {
    if (!template_name.empty())
      fail("--template-name", quoted_text(template_name), "no name: " + config_path + " has one unnamed template");
    out.source = tmpl->get<std::string>();
    out.origin = config_path + " chat_template";
    return out;
  }
  if (!tmpl->is_array()) fail(config_path + " chat_template", excerpt(*tmpl), "a string or a list of {name, template}");
  std::string names;
  std::map<std::string, std::string> by_name;
  for (size_t k = 0; k < tmpl->size(); ++k) {
    const auto& entry = (*tmpl)[k];
    const std::string at = config_path + " chat_template[" + std::to_string(k) + "]";
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
        !entry["template"].is_string())
      fail(at, excerpt(entry), "an object {\"name\": string, \"template\": string}");
    const std::string name = entry["name"].get<std::string>();
    by_name[name] = entry["template"].get<std::string>();
    names += (names.empty() ? "" : ", ") + name;
  }
  std::string pick = template_name;
  if (pick.empty()) pick = with_tools && by_name.count("tool_use") ? "tool_use" : "default";
  const auto found = by_name.find(pick);
  if (found == by_name.end())
    fail(template_name.empty() ? config_path + " chat_template" : std::string("--template-name"),
         template_name.empty() ? "(no template named default)" : quoted_text(pick),
         "one of the names " + names + (template_name.empty() ? " (choose with --template-name)" : ""));
  out.source = found->second;
  out.origin = config_path + " chat_template[" + pick + "]";
  return out;
}

void check_messages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) fail("messages", excerpt(messages), "a list of message objects");
  for (size_t k = 0; k < messages.size(); ++k) {
    const auto& m = messages[k];
    const std::string at = "messages[" + std::to_string(k) + "]";
    if (!m.is_object()) fail(at, excerpt(m), "an object with role and content");
    const auto role = m.find("role");
    if (role == m.end()) fail(at + ".role", "(missing)", "a string (user, assistant, system, tool, ...)");
    if (!role->is_string()) fail(at + ".role", excerpt(*role), "a string (user, assistant, system, tool, ...)");
    const auto content = m.find("content");
    if (content == m.end() || content->is_null() || content->is_string()) continue;
    if (!content->is_array()) fail(at + ".content", excerpt(*content), "a string, null or a list of parts");
    for (size_t j = 0; j < content->size(); ++j)
      if (!(*content)[j].is_object())
        fail(at + ".content[" + std::to_string(j) + "]", excerpt((*content)[j]), "a part object ({\"type\": ...})");
  }
}

std::string render_chat(const ChatTemplate& chat_template, const ChatRequest& request, const RenderOptions& options) {
  check_messages(request.messages);
  if (request.tools && !request.tools->is_array()) fail("tools", excerpt(*request.tools), "a list of tool objects");
  if (!request.extra.is_object()) fail("template variables", excerpt(request.extra), "a JSON object");
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  for (auto it = request.extra.begin(); it != request.extra.end(); ++it) context[it.key()] = it.value();
  context["messages"] = request.messages;
  context["add_generation_prompt"] = request.add_generation_prompt;
  // transformers passes tools=None and documents=None when the caller gives none: defined, and none.
  context["tools"] = request.tools ? *request.tools : nlohmann::ordered_json();
  if (!context.contains("documents")) context["documents"] = nullptr;
  if (chat_template.bos_token) context["bos_token"] = *chat_template.bos_token;
  if (chat_template.eos_token) context["eos_token"] = *chat_template.eos_token;
  const Template parsed(chat_template.source, chat_template.origin);
  return parsed.render(context, options);
}

}  // namespace rotary::chat
