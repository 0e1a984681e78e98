#include "cli/chat_turns.h"

#include <algorithm>
#include <filesystem>

#include "rotary/error.h"
#include "rotary/files.h"
#include "rotary/json_guard.h"

namespace rotary::cli {

void ChatTemplateFlags::add_to(CLI::App& app) {
  app.add_option("--template", template_file, "a Jinja chat template file instead of the model directory's");
  app.add_option("--template-name", template_name,
                 "which of tokenizer_config.json's named templates (default: default, or tool_use with --tools)");
  app.add_option("--tools", tools_file, "JSON file: a list of tool (function) schemas the template renders");
}

void ChatTemplateFlags::check_only_with(bool conversation, const std::string& needs) const {
  if (conversation) return;
  const std::pair<const char*, const std::string*> flags[] = {
      {"--template", &template_file}, {"--template-name", &template_name}, {"--tools", &tools_file}};
  for (const auto& [name, value] : flags)
    if (!value->empty()) fail(name, *value, "unset without " + needs + " (it shapes a conversation's rendering)");
}

chat::ChatTemplate ChatTemplateFlags::load(const std::string& model_dir) const {
  return chat::load_chat_template(model_dir, template_file, template_name, !tools_file.empty());
}

chat::ChatRequest ChatTemplateFlags::request(nlohmann::ordered_json messages, bool add_generation_prompt) const {
  chat::ChatRequest r;
  r.messages = std::move(messages);
  r.add_generation_prompt = add_generation_prompt;
  if (!tools_file.empty()) r.tools = read_json_file(tools_file, "--tools");
  return r;
}

nlohmann::ordered_json read_json_file(const std::string& path, const std::string& flag) {
  const std::string text = read_regular_file(path, flag);
  check_json_depth(text, flag + " " + path);
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(flag + " " + path, std::string("malformed JSON (") + e.what() + ")", "JSON text");
  }
}

std::vector<int64_t> end_of_turn_ids(const std::string& model_dir, const tokenizers::Tokenizer& tokenizer,
                                     int64_t vocab_size) {
  std::vector<int64_t> ids;
  if (tokenizer.eos_id) ids.push_back(*tokenizer.eos_id);
  const std::filesystem::path file = std::filesystem::path(model_dir) / "generation_config.json";
  std::error_code ec;
  if (std::filesystem::exists(file, ec)) {
    const nlohmann::json j = parse_json(read_regular_file(file.string(), "generation_config.json"), file.string());
    const std::string field = file.string() + ": eos_token_id";
    const std::string allowed = "a token id in [0, " + std::to_string(vocab_size) + ") or a list of them";
    auto add = [&](const nlohmann::json& v) {
      const std::optional<int64_t> id = json_integer(v, 0, vocab_size - 1);
      if (!id) fail(field, json_excerpt(v), allowed);
      if (std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
    };
    if (j.is_object() && j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
      const nlohmann::json& v = j["eos_token_id"];
      if (v.is_array()) {
        for (const nlohmann::json& x : v) add(x);
      } else {
        add(v);
      }
    }
  }
  return ids;
}

}  // namespace rotary::cli
