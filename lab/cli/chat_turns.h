// lab/cli/chat_turns.h: what the commands that talk to a chat model share (generate --messages, chat, template):
// the template flags, a JSON file read, and the tokens that end the assistant's turn. Torch-free.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "rotary_chat/chat_template.h"
#include "rotary_tokenizers/tokenizer.h"

namespace rotary::cli {

// --template FILE, --template-name NAME, --tools FILE.json.
struct ChatTemplateFlags {
  std::string template_file, template_name, tools_file;
  void add_to(CLI::App& app);
  // Refuses a flag given where no conversation is rendered (rotary::Error naming it and `needs`).
  void check_only_with(bool conversation, const std::string& needs) const;
  // The model directory's template (or --template's), chosen for the tools when --tools is given.
  chat::ChatTemplate load(const std::string& model_dir) const;
  // A request of `messages` with --tools' list.
  chat::ChatRequest request(nlohmann::ordered_json messages, bool add_generation_prompt) const;
};

// A JSON file a flag names: rotary::Error naming the flag and the file for an unreadable, too deep or malformed one.
nlohmann::ordered_json read_json_file(const std::string& path, const std::string& flag);

// The tokens that end the assistant's turn, as transformers' generate stops: the tokenizer's EOS and
// generation_config.json's eos_token_id (an id or a list of ids) where the directory has one. rotary::Error naming
// the file and field for an id outside [0, vocab_size) or of another type.
std::vector<int64_t> end_of_turn_ids(const std::string& model_dir, const tokenizers::Tokenizer& tokenizer,
                                     int64_t vocab_size);

}  // namespace rotary::cli
