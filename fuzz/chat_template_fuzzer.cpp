// fuzz/chat_template_fuzzer.cpp: arbitrary bytes as a chat template (rotary_chat's lexer, parser and interpreter),
// rendered with a small fixed conversation under small limits. rotary::Error is the expected answer to bad input;
// a crash, a hang or any other exception is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "rotary/error.h"
#include "rotary_chat/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Grüße ✓"},
                 {"role": "assistant", "content": "<think>x</think>ok", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}],
    "tools": [{"type": "function", "function": {"name": "f"}}], "add_generation_prompt": true,
    "bos_token": "<s>", "eos_token": "</s>"})");
  rotary::chat::RenderOptions options;
  options.now = 0;
  options.limits.max_loop_iterations = 10000;
  options.limits.max_output_bytes = 1 << 20;
  options.limits.max_call_depth = 50;
  try {
    const rotary::chat::Template t(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    (void)t.render(context, options);
  } catch (const rotary::Error&) {
  }
  return 0;
}
