// `rotary chat MODEL`: talk to a chat model interactively - a line of input per turn, the answer streamed as it is
// sampled, the conversation rendered with the model's own chat template. One engine session holds the conversation:
// each turn feeds only the tokens its rendering adds after the ones already in the session (when a re-rendering does
// not start with them - a template that rewrites earlier turns - the session starts again from the whole text).
// Ctrl-C stops the current answer, not the program; /reset starts a new conversation, /save DIR saves the session
// as a context (generate --context DIR continues it), /quit or end of input ends. Every long-context flag of
// generate applies (--kind rerope --window, --memory, ...). Torch-free.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "cli/chat_turns.h"
#include "cli/checkpoint_flags.h"
#include "cli/command.h"
#include "cli/override_flags.h"
#include "common/stop_signal.h"
#include "rotary/error.h"
#include "rotary_engine/generate.h"

namespace rotary::cli {
namespace {

constexpr int64_t kDefaultChatContext = 8192;

// Thrown from the token callback when Ctrl-C asks to stop the answer being sampled.
struct AnswerStopped {};

struct ChatCommand {
  std::string model_dir, system;
  ChatTemplateFlags chat_flags;
  OverrideFlags overrides;
  experiments::CheckpointRunOptions run_options;
  experiments::CheckpointMemoryOptions memory;
  CheckpointMemoryFlags memory_flags;
  int64_t max_new = 512, context_tokens = 0;
  double temperature = 0.0;
  uint64_t seed = 0;
  int threads = 0;

  void run() {
    memory_flags.check_given_together(memory);
    run_options.threads = threads;
    experiments::CheckpointModel c(model_dir, run_options);
    c.set_override(overrides.override_of(c.spec().config));
    if (memory.enabled()) c.set_memory(memory.engine_options(c.spec().trained_context));
    const auto tokenizer = tokenizers::load_tokenizer(model_dir);
    const chat::ChatTemplate tmpl = chat_flags.load(model_dir);
    const int64_t vocab = c.spec().config.vocab_size;
    const std::vector<int64_t> stop = end_of_turn_ids(model_dir, *tokenizer, vocab);
    // The conversation's room: --context-tokens, else the context the model was trained at up to 8192 tokens (the
    // KV cache is allocated for it at the start: 1 GB for an 8B model's 8192 in bf16).
    const int64_t capacity =
        context_tokens > 0 ? context_tokens : std::min<int64_t>(c.spec().trained_context, kDefaultChatContext);
    c.check_memory(capacity, experiments::CheckpointModel::RunKind::Generate, "--context-tokens");
    engine::Session session = c.session(capacity);
    const nlohmann::ordered_json start =
        system.empty() ? nlohmann::ordered_json::array()
                       : nlohmann::ordered_json::array({{{"role", "system"}, {"content", system}}});
    nlohmann::ordered_json messages = start;
    std::vector<int64_t> in_session;  // the tokens the session holds, in order
    const bool terminal = isatty(STDIN_FILENO);
    std::fprintf(stderr, "rotary chat: %s (%lld tokens of context); /reset, /save DIR, /quit; Ctrl-C stops an "
                 "answer\n", model_dir.c_str(), (long long)capacity);
    for (uint64_t turn = 0;;) {  // turn: the answers given (turn n samples with --seed + n)
      if (terminal) std::fprintf(stderr, "> ");
      std::string line;
      if (!std::getline(std::cin, line)) break;
      if (line.empty()) continue;
      if (line == "/quit" || line == "/exit") break;
      if (line == "/reset") {
        messages = start, in_session.clear();
        session.clear();
        std::fprintf(stderr, "(a new conversation)\n");
        continue;
      }
      if (line.rfind("/save", 0) == 0) {
        const std::string dir = line.size() > 6 && line[5] == ' ' ? line.substr(6) : "";
        try {
          check(!dir.empty(), "/save", line, "/save DIR: a directory to save the conversation's session in");
          session.save_context(dir);
          std::fprintf(stderr, "(saved %lld tokens to %s: generate --context %s continues them)\n",
                       (long long)session.size(), dir.c_str(), dir.c_str());
        } catch (const Error& e) {
          std::fprintf(stderr, "error: %s\n", e.what());
        }
        continue;
      }
      if (line[0] == '/') {
        std::fprintf(stderr, "error: %s is not a command; allowed: /reset, /save DIR, /quit\n", line.c_str());
        continue;
      }
      messages.push_back({{"role", "user"}, {"content", line}});
      std::vector<int64_t> ids;
      try {
        ids = tokenizer->encode(chat::render_chat(tmpl, chat_flags.request(messages, true)));
      } catch (const Error& e) {
        // A template's own refusal (raise_exception: "roles must alternate", ...) ends the turn, not the chat.
        std::fprintf(stderr, "error: %s\n", e.what());
        messages.erase(messages.end() - 1);
        continue;
      }
      // Feed what the rendering adds after the session's tokens; from the start where it does not begin with them.
      const bool continues = in_session.size() < ids.size() &&
                             std::equal(in_session.begin(), in_session.end(), ids.begin());
      if (!continues) session.clear(), in_session.clear();
      const std::vector<int64_t> fresh(ids.begin() + int64_t(in_session.size()), ids.end());
      if (int64_t(ids.size()) + max_new > capacity) {
        std::fprintf(stderr, "error: the conversation is %lld tokens and an answer up to %lld more, past its room "
                     "of %lld (--context-tokens): /reset starts a new one\n",
                     (long long)ids.size(), (long long)max_new, (long long)capacity);
        messages.erase(messages.end() - 1);
        continue;
      }
      std::vector<int64_t> answer;
      std::string printed;
      engine::GenerateOptions o;
      o.max_new = max_new, o.temperature = temperature, o.stop_ids = stop, o.seed = seed + turn;
      o.sample_vocab = std::min<int64_t>(tokenizer->vocab_size(), vocab);
      o.on_token = [&](int64_t token) {
        answer.push_back(token);
        // The text so far, printed as it grows; a token that ends inside a character waits for the next one.
        const std::string text = tokenizer->decode_continuation(ids, answer);
        if (text.rfind(printed, 0) == 0 && !text.ends_with("\xEF\xBF\xBD")) {
          std::fwrite(text.data() + printed.size(), 1, text.size() - printed.size(), stdout);
          std::fflush(stdout);
          printed = text;
        }
        if (lab::stop_requested()) throw AnswerStopped{};
      };
      bool stopped = false;
      {
        lab::StopSignalGuard ctrl_c;  // Ctrl-C during an answer sets the flag the callback reads
        try {
          engine::generate(session, fresh, o);
        } catch (const AnswerStopped&) {
          stopped = true;
        }
        lab::clear_stop_request();
      }
      // The session holds the prompt and every answer token but the last one chosen (never fed).
      in_session = ids;
      if (!answer.empty()) in_session.insert(in_session.end(), answer.begin(), answer.end() - 1);
      const std::string text = tokenizer->decode_continuation(ids, answer);
      if (text.size() > printed.size())
        std::fwrite(text.data() + printed.size(), 1, text.size() - printed.size(), stdout);
      std::fputs(stopped ? " [stopped]\n" : "\n", stdout);
      std::fflush(stdout);
      messages.push_back({{"role", "assistant"}, {"content", text}});
      ++turn;
    }
  }
};

const CommandRegistrar kRegister([](CLI::App& root) {
  auto cmd = std::make_shared<ChatCommand>();
  CLI::App* sub = root.add_subcommand(
      "chat", "talk to a chat model (a Hugging Face model directory with a chat template): line input, streamed "
              "answers, /reset, /save DIR; Ctrl-C stops an answer");
  sub->add_option("model", cmd->model_dir, "a Hugging Face model directory (config.json, safetensors, tokenizer, "
                                           "chat template)")
      ->required();
  sub->add_option("--system", cmd->system, "a system message that opens every conversation");
  sub->add_option("--max-new", cmd->max_new, "tokens per answer at most")->transform(integer_in(1, kMaxSequenceLength));
  sub->add_option("--context-tokens", cmd->context_tokens,
                  "tokens the conversation may hold (default: the model's trained context, at most 8192)")
      ->transform(integer_in(0, kMaxSequenceLength));
  sub->add_option("--temperature", cmd->temperature, "0 = greedy")->transform(finite_in(0, 100));
  sub->add_option("--seed", cmd->seed, "sampling seed (turn n samples with seed + n)")
      ->transform(unsigned_up_to(UINT64_MAX - (uint64_t(1) << 32)));
  sub->add_option("--threads", cmd->threads, "threads (0 = all cores)")->transform(integer_in(0, kMaxThreads));
  cmd->chat_flags.add_to(*sub);
  cmd->overrides.add_to(*sub);
  add_checkpoint_run_flags(*sub, cmd->run_options);
  cmd->memory_flags = add_checkpoint_memory_flags(*sub, cmd->memory);
  sub->callback([cmd] { cmd->run(); });
});

}  // namespace
}  // namespace rotary::cli
