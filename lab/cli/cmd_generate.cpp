// rotary generate: sample from a trained model, or a Hugging Face checkpoint, through the KV-cache decoder.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fmt/format.h>

#include "cli/chat_turns.h"
#include "cli/checkpoint_flags.h"
#include "cli/command.h"
#include "cli/override_flags.h"
#include "common/files.h"
#include "rotary_engine/hf_model.h"
#include "rotary_tokenizers/tokenizer.h"
#ifdef ROTARY_HAVE_TORCH  // a lab run (checkpoint.pt) runs on the nn model
#include "cli/torch/load_model.h"
#include "train/evaluate.h"
#include "train/trainer.h"
#endif

namespace rotary::cli {
namespace {

struct GenerateCommand {
  std::string checkpoint, prompt, prompt_file, prompt_tokens, messages_file, context, save_context;
  ChatTemplateFlags chat_flags;  // --messages: the model's chat template
  int max_new = 200;
  double temperature = 0.0;
  uint64_t seed = 0;
  bool no_stop = false, only_new = false;
  int threads = 0;
  OverrideFlags overrides;
  experiments::CheckpointRunOptions run_options;  // Hugging Face checkpoints: --engine, --weights, --kv-dtype
  experiments::CheckpointMemoryOptions memory;     // and --memory, --memory-window, --top-k, --memory-dtype
  std::vector<CLI::Option*> run_flags;
  CheckpointMemoryFlags memory_flags;
  bool no_progress = false;

  const char* prompt_flag() const {
    return !prompt_tokens.empty() ? "--prompt-tokens"
           : !prompt_file.empty() ? "--prompt-file"
           : !messages_file.empty() ? "--messages"
                                    : "--prompt";
  }
  // One bound on a generation's tokens, with or without --memory: kMaxSequenceLength (2^20), the documented bound
  // on every sequence length - a book through the memory fits (524,288 tokens were measured, docs/memory.md). A
  // longer prompt is refused before its prefill starts, not hours into it.
  void check_length(size_t prompt_ids) const {
    check(int64_t(prompt_ids) + max_new <= kMaxSequenceLength, std::string(prompt_flag()) + " tokens + --max-new",
          std::to_string(prompt_ids) + " + " + std::to_string(max_new),
          "at most 2^20 = " + std::to_string(kMaxSequenceLength) + " tokens in all (with or without --memory)");
  }

  // A Hugging Face model directory (config.json and a weights file of the Hugging Face layout, no checkpoint.pt of
  // ours): its own tokenizer (BOS as the model expects), stop at its EOS. A run directory of ours also has a
  // config.json; without checkpoint.pt it is still a run directory, and load_run says that it has no checkpoint.
  static bool is_hf_model(const std::string& where) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (engine::is_gguf_path(where)) return true;  // a GGUF file: the model and its tokenizer in one file
    const fs::path dir(where);
    if (!fs::is_directory(dir, ec) || !fs::exists(dir / "config.json", ec) || fs::exists(dir / "checkpoint.pt", ec))
      return false;
    // (the formats rotary does not read are listed so that SafetensorsCheckpoint::open names them)
    for (const char* weights : {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                                "pytorch_model.bin.index.json", "model.gguf"})
      if (fs::exists(dir / weights, ec)) return true;
    return false;
  }

  void run_hf() {
    memory_flags.check_given_together(memory);
    run_options.threads = threads;
    experiments::CheckpointModel c(checkpoint, run_options);
    c.set_override(overrides.override_of(c.spec().config));
    if (memory.enabled()) c.set_memory(memory.engine_options(c.spec().trained_context));
    // Token ids in and out need no tokenizer (a checkpoint without one, or a check against another runtime's ids);
    // text in is the model's own tokenizer's, BOS as the model expects.
    const int64_t vocab = c.spec().config.vocab_size;
    std::unique_ptr<tokenizers::Tokenizer> tokenizer;
    std::vector<int64_t> ids;
    if (!prompt_tokens.empty()) {
      ids = tokenizers::read_token_id_file(prompt_tokens, vocab);
      check(!ids.empty(), "--prompt-tokens", prompt_tokens, "a file of at least one token id");
    } else if (!messages_file.empty()) {
      // A conversation: the model's own template renders it with the assistant's turn opened, and the text is
      // encoded as transformers' apply_chat_template(tokenize=True) does - no BOS added (the template writes it),
      // special tokens recognised.
      tokenizer = tokenizers::load_tokenizer(checkpoint);
      const chat::ChatTemplate tmpl = chat_flags.load(checkpoint);
      prompt = chat::render_chat(tmpl, chat_flags.request(read_json_file(messages_file, "--messages"), true));
      ids = tokenizer->encode(prompt);
      check(!ids.empty(), "--messages", messages_file, "a conversation the template renders to at least one token");
    } else {
      tokenizer = tokenizers::load_tokenizer(checkpoint);
      ids = tokenizer->encode_for_model(prompt);
      check(!ids.empty(), prompt_flag(), "\"\"", "at least one token");
    }
    check_length(ids.size());
    // A saved context's memory is read into RAM: its files' bytes come out of what is available.
    int64_t available = experiments::available_memory_bytes();
    if (!context.empty() && available >= 0) available -= engine::Session::saved_context_bytes(context);
    c.check_memory(int64_t(ids.size()) + max_new, experiments::CheckpointModel::RunKind::Generate,
                   std::string(prompt_flag()) + " tokens + --max-new", std::max<int64_t>(available, 0));
    // The end of text, and for a conversation every token that ends the assistant's turn.
    std::vector<int64_t> stop;
    if (!no_stop && tokenizer && !messages_file.empty()) stop = end_of_turn_ids(checkpoint, *tokenizer, vocab);
    else if (!no_stop && tokenizer && tokenizer->eos_id) stop = {*tokenizer->eos_id};
    // Ids the tokenizer has no token for (padding rows of the embedding, as Qwen2.5's 151936 rows for 151665
    // tokens) are never sampled: they could not be printed.
    const int64_t sample_vocab = tokenizer ? std::min<int64_t>(tokenizer->vocab_size(), vocab) : vocab;
    // A long prompt (a book through the memory) reports its progress on stderr.
    const auto start = std::chrono::steady_clock::now();
    int64_t reported = 0;
    auto progress = [&](int64_t done, int64_t total) {
      if (no_progress || total < 4096 || (done - reported < total / 20 && done < total)) return;
      reported = done;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "prompt: %lld / %lld tokens (%.0f tokens/s)\n", (long long)done, (long long)total,
                   double(done) / std::max(s, 1e-9));
    };
    const std::vector<int64_t> out =
        c.generate(ids, max_new, temperature, stop, seed, sample_vocab, progress, context, save_context);
    if (tokenizer) {
      write_stdout((only_new ? "" : prompt) + tokenizer->decode_continuation(ids, out) + "\n");
    } else {
      std::string line;
      for (const auto& part : {only_new ? std::vector<int64_t>{} : ids, out})
        for (int64_t id : part) line += (line.empty() ? "" : " ") + std::to_string(id);
      std::printf("%s\n", line.c_str());
    }
    if (memory.enabled() && !no_progress) {
      const engine::MemoryStats s = c.memory_stats();
      // (Debian's FAISS 1.7.3 counts no HNSW distances: lab/memory/memory_index.h's SearchWork)
      const std::string work = std::isnan(s.scored_share)
                                   ? std::string("its work is not counted (FAISS's HNSW)")
                                   : fmt::format("the search scored {:.2f}% of an exact scan's vectors", 100 * s.scored_share);
      std::fprintf(stderr, "%s: %lld tokens in each layer's memory, %.1f%% of the attention on retrieved rows "
                   "(mean over %lld queries); %s\n",
                   memory.describe(c.spec().trained_context).c_str(), (long long)s.memory_tokens,
                   100 * s.memory_mass, (long long)s.retrieving_queries, work.c_str());
    }
  }

  void run() {
    const int given = !prompt.empty() + !prompt_file.empty() + !prompt_tokens.empty() + !messages_file.empty();
    check(given == 1, "--prompt / --prompt-file / --prompt-tokens / --messages",
          given == 0 ? "none" : std::to_string(given),
          "exactly one: the text, a file holding it, a file of token ids, or a conversation (JSON messages)");
    chat_flags.check_only_with(!messages_file.empty(), "--messages");
    if (!prompt_file.empty()) {
      prompt = lab::read_file(prompt_file);
      check(!prompt.empty(), "--prompt-file", prompt_file + " (an empty file)",
            "a file holding the text to continue (as --prompt: at least one byte)");
    }
    if (is_hf_model(checkpoint)) return run_hf();
#ifdef ROTARY_HAVE_TORCH
    train::use_threads(threads);
    check(messages_file.empty(), "--messages", messages_file,
          "unset for a lab run (it has no chat template); conversations are for Hugging Face model directories");
    check(prompt_tokens.empty(), "--prompt-tokens", prompt_tokens,
          "unset for a lab run (its prompt is text in the task's vocabulary); token ids are for Hugging Face model "
          "directories");
    for (CLI::Option* o : run_flags)
      if (o->count()) fail(o->get_name(), o->as<std::string>(), "unset for a lab run (it runs the nn model it was "
                                                                   "trained as); the flag is for Hugging Face model "
                                                                   "directories");
    LoadedRun r = load_run(checkpoint);
    apply_overrides(overrides, r);
    std::vector<int32_t> ids32 = r.task->vocab().encode(prompt);  // rotary::Error names an unknown character
    check(!ids32.empty(), prompt_flag(), "\"\"", "at least one token");
    check_length(ids32.size());
    std::vector<int64_t> ids(ids32.begin(), ids32.end());
    const int64_t stop = no_stop ? -1 : train::stop_token(*r.task);
    std::vector<int64_t> out = r.model->generate(ids, max_new, temperature, stop, seed);
    const std::string text = r.task->vocab().decode(std::vector<int32_t>(out.begin(), out.end()));
    write_stdout((only_new ? "" : prompt) + text + "\n");
#else
    fail("checkpoint", checkpoint,
         "a Hugging Face model directory (config.json and model.safetensors): this rotary is built without libtorch, "
         "which a lab run (checkpoint.pt) runs on");
#endif
  }
};

const CommandRegistrar kRegister([](CLI::App& root) {
  auto cmd = std::make_shared<GenerateCommand>();
  CLI::App* sub = root.add_subcommand("generate", "sample from a trained model (KV-cache decoder)");
  sub->add_option("checkpoint,--checkpoint", cmd->checkpoint, "checkpoint file, run directory, or Hugging Face model directory")->required();
  sub->add_option("--prompt", cmd->prompt, "text to continue (in the task's vocabulary)")
      ->check(non_empty("a text of at least one character"));
  sub->add_option("--prompt-file", cmd->prompt_file, "or: a file holding the text (a book-length prompt)")
      ->check(non_empty("a file holding the text"));
  sub->add_option("--prompt-tokens", cmd->prompt_tokens,
                  "or (Hugging Face checkpoints): a file of whitespace-separated token ids; the output is ids too, "
                  "no tokenizer needed")
      ->check(non_empty("a file of token ids"));
  sub->add_option("--messages", cmd->messages_file,
                  "or (Hugging Face checkpoints): a JSON file of {\"role\", \"content\"} messages, rendered with the "
                  "model's chat template (--template to give one), answered until the template's end of turn")
      ->check(non_empty("a JSON file of messages"));
  cmd->chat_flags.add_to(*sub);
  sub->add_option("--max-new", cmd->max_new,
                  "tokens to generate at most (0: read the prompt only, for --save-context); the prompt's tokens + "
                  "--max-new are at most 2^20, with or without --memory")
      ->transform(integer_in(0, kMaxSequenceLength));
  CLI::Option* save_context = sub->add_option("--save-context", cmd->save_context,
                  "engine: save the session to this directory once the prompt is read - its KV caches, or with --memory "
                  "the memory (a book or a long prompt read once, continued in later runs with --context)")
      ->check(non_empty("a directory to save the session in"));
  CLI::Option* context = sub->add_option("--context", cmd->context,
                  "engine: continue the session saved by --save-context in this directory (the same model, "
                  "positions, --kv-dtype and memory settings); the prompt goes after its tokens")
      ->check(non_empty("a directory written by --save-context"))
      ->check(CLI::ExistingDirectory);
  sub->add_option("--temperature", cmd->temperature, "0 = greedy")->transform(finite_in(0, 100));
  sub->add_option("--seed", cmd->seed, "sampling seed")->transform(unsigned_up_to(UINT64_MAX));
  sub->add_flag("--no-stop", cmd->no_stop, "do not stop at the task's stop token");
  sub->add_flag("--only-new", cmd->only_new, "print only the generated text, not the prompt");
  sub->add_option("--threads", cmd->threads, "torch threads (0 = all cores)")->transform(integer_in(0, kMaxThreads));
  cmd->overrides.add_to(*sub);
  cmd->run_flags = add_checkpoint_run_flags(*sub, cmd->run_options);
  cmd->memory_flags = add_checkpoint_memory_flags(*sub, cmd->memory);
  for (CLI::Option* o : cmd->memory_flags.all()) cmd->run_flags.push_back(o);
  cmd->run_flags.push_back(save_context), cmd->run_flags.push_back(context);
  sub->add_flag("--no-progress", cmd->no_progress, "no progress or memory summary on stderr");
  sub->callback([cmd] { cmd->run(); });
});

}  // namespace
}  // namespace rotary::cli
