// tests/template_oracle/render_cases.cpp: our side of the chat template oracle (test_template_oracle.sh). Renders
// every case of cases.json with rotary_chat in one process and prints one JSON object per line: {"text": ...} or
// {"error": ...}, so that compare.py can set it beside Jinja2 (render_jinja2.py) and @huggingface/jinja
// (render_hf_jinja.mjs).
//
// usage: render_cases <cases.json>
//   cases.json: {"templates": {NAME: {"source", "bos_token"?, "eos_token"?}}, "now": UNIX_SECONDS,
//                "cases": [{"template": NAME, "messages", "add_generation_prompt", "tools"?, "extra"?}]}
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "rotary/error.h"
#include "rotary_chat/chat_template.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <cases.json>\n", argv[0]);
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream text;
  text << in.rdbuf();
  const auto spec = nlohmann::ordered_json::parse(text.str());
  std::map<std::string, rotary::chat::ChatTemplate> templates;
  for (auto it = spec["templates"].begin(); it != spec["templates"].end(); ++it) {
    rotary::chat::ChatTemplate t;
    t.source = it.value()["source"].get<std::string>();
    t.origin = it.key();
    if (it.value().contains("bos_token")) t.bos_token = it.value()["bos_token"].get<std::string>();
    if (it.value().contains("eos_token")) t.eos_token = it.value()["eos_token"].get<std::string>();
    templates[it.key()] = t;
  }
  rotary::chat::RenderOptions options;
  options.now = spec["now"].get<std::time_t>();
  for (const auto& c : spec["cases"]) {
    rotary::chat::ChatRequest request;
    request.messages = c["messages"];
    request.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    if (c.contains("tools")) request.tools = c["tools"];
    if (c.contains("extra")) request.extra = c["extra"];
    nlohmann::ordered_json line;
    try {
      line["text"] = rotary::chat::render_chat(templates.at(c["template"].get<std::string>()), request, options);
    } catch (const rotary::Error& e) {
      line["error"] = e.what();
    }
    std::cout << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}
