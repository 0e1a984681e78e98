// `rotary template`: a conversation rendered with a model directory's chat template, as transformers'
// apply_chat_template(messages, tokenize=False) gives it (rotary_chat, docs/chat-templates.md). Torch-free.
//
// The text is printed exactly, with no newline added. Bad input - a messages file that is not a list of messages, a
// template construct outside the supported subset, a template's raise_exception - throws rotary::Error, which main()
// prints before exiting with status 2.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/chat_turns.h"
#include "cli/command.h"
#include "rotary/error.h"
#include "rotary_chat/chat_template.h"

namespace rotary::cli {
namespace {

struct TemplateArgs {
  std::string model_dir, messages_file;
  ChatTemplateFlags chat_flags;
  bool add_generation_prompt = false;
};

void run_template(const TemplateArgs& a) {
  const chat::ChatRequest request =
      a.chat_flags.request(read_json_file(a.messages_file, "--messages"), a.add_generation_prompt);
  write_stdout(chat::render_chat(a.chat_flags.load(a.model_dir), request));
}

const CommandRegistrar kRegisterTemplate([](CLI::App& root) {
  auto args = std::make_shared<TemplateArgs>();
  CLI::App* cmd = root.add_subcommand(
      "template", "Render a conversation with a model's chat template (tokenizer_config.json's chat_template or "
                  "chat_template.jinja), exactly as transformers' apply_chat_template prints it");
  TemplateArgs& a = *args;
  cmd->add_option("model", a.model_dir, "model directory (tokenizer_config.json: template, bos_token, eos_token)")
      ->required();
  cmd->add_option("--messages", a.messages_file, "JSON file: a list of {\"role\", \"content\"} messages")->required();
  cmd->add_flag("--add-generation-prompt", a.add_generation_prompt, "end with the assistant turn's opening");
  a.chat_flags.add_to(*cmd);
  cmd->callback([args] { run_template(*args); });
});

}  // namespace
}  // namespace rotary::cli
