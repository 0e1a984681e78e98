// `rotary serve MODEL`: the OpenAI HTTP API over a Hugging Face checkpoint (server/, docs/server.md) - chat
// completions through the model's own chat template, completions, streamed or whole; --parallel slots decoded
// together (continuous batching); every engine flag of generate (--weights, --kv-dtype, --activations, --kind rerope
// --window, --memory ...). The memory for every slot at --ctx is checked before the model serves. SIGTERM or
// Ctrl-C drains: running requests finish (or fail cleanly after --drain seconds) and the process exits 0.
// Torch-free.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/chat_turns.h"
#include "cli/checkpoint_flags.h"
#include "cli/command.h"
#include "cli/override_flags.h"
#include "common/stop_signal.h"
#include "rotary/error.h"
#include "rotary_server/http_server.h"
#include "rotary_server/scheduler.h"

namespace rotary::cli {
namespace {

constexpr int64_t kDefaultServeContext = 4096;

std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int) { g_stop = true; }

struct ServeCommand {
  std::string model_dir;
  server::ServerOptions server;
  server::SchedulerOptions slots;
  ChatTemplateFlags chat_flags;
  OverrideFlags overrides;
  experiments::CheckpointRunOptions run_options;
  experiments::CheckpointMemoryOptions memory;
  CheckpointMemoryFlags memory_flags;
  int64_t context_tokens = 0;
  int64_t prefix_cache_mib = -1;  // -1: the default (check_memory)

  void run() {
    memory_flags.check_given_together(memory);
    check(chat_flags.tools_file.empty(), "--tools", chat_flags.tools_file,
          "left out: a request sends its own \"tools\"");
    slots.validate();
    if (server.model_id.empty()) server.model_id = std::filesystem::path(model_dir).lexically_normal().filename().string();
    if (server.model_id.empty() || server.model_id == ".")
      server.model_id = std::filesystem::absolute(model_dir).lexically_normal().parent_path().filename().string();
    server.validate();
    run_options.threads = slots.threads;
    check(run_options.engine == "engine", "--engine", run_options.engine, "engine (the server batches engine sessions)");
    auto c = std::make_shared<experiments::CheckpointModel>(model_dir, run_options);
    c->set_override(overrides.override_of(c->spec().config));
    if (memory.enabled()) c->set_memory(memory.engine_options(c->spec().trained_context));
    // The default room per slot: what the checkpoint runs (its scaled context where its rope scaling extends the
    // trained one), at most 4096.
    const int64_t supported = std::max(c->spec().trained_context, c->spec().rope.max_position_embeddings);
    slots.context = context_tokens > 0 ? context_tokens : std::min<int64_t>(supported, kDefaultServeContext);
    slots.validate();
    check_memory(*c);

    std::shared_ptr<const tokenizers::Tokenizer> tokenizer = tokenizers::load_tokenizer(model_dir);
    server::PromptSetup prompts;
    const int64_t vocab = c->spec().config.vocab_size;
    prompts.end_of_turn = end_of_turn_ids(model_dir, *tokenizer, vocab);
    prompts.sample_vocab = std::min<int64_t>(tokenizer->vocab_size(), vocab);
    try {
      prompts.chat_template = chat_flags.load(model_dir);
    } catch (const Error& e) {
      if (!chat_flags.template_file.empty()) throw;  // a template asked for and broken is an error
      std::fprintf(stderr, "rotary serve: no chat template (%s): /v1/chat/completions refuses requests; "
                   "/v1/completions serves\n", e.what());
    }
    // A request's own settings (rotary's extension) over the run's: its positions; its memory's policy, window,
    // top-k and search over the --memory flags (validated as those flags are).
    auto new_session = [c, flags = memory](int64_t capacity, const server::Job* job) {
      engine::Session s = c->session(capacity);
      if (!job) return s;
      engine::SessionOptions o = s.options();
      if (job->positions) o.positions = *job->positions;
      if (job->memory.any()) {
        experiments::CheckpointMemoryOptions m = flags;
        if (job->memory.policy) m.policy = *job->memory.policy;
        check(m.enabled(), "rotary.memory", "unset", "a policy (exact, rerope, none, unlimiformer): this server runs no "
              "memory for memory_window, top_k or search to apply to");
        if (job->memory.window) m.window = *job->memory.window;
        if (job->memory.top_k) m.top_k = int(*job->memory.top_k);
        if (job->memory.search) m.search = *job->memory.search;
        m.validate();
        o.memory = m.engine_options(c->spec().trained_context);
      }
      return engine::Session(c->engine_model(), o);
    };
    server::ServedModel served{c->engine_model(), new_session, tokenizer, c->session(1).options().positions};
    server::Scheduler scheduler(served, slots);

    struct sigaction action {}, old_int {}, old_term {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int);
    sigaction(SIGTERM, &action, &old_term);
    std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not the end of the server
    server::serve(server, served, prompts, scheduler, g_stop, [&](int port) {
      std::fprintf(stderr, "rotary serve: %s as \"%s\" on http://%s:%d (%d slots of %lld tokens; prefix cache %lld MiB; %s)\n",
                   model_dir.c_str(), server.model_id.c_str(), server.host.c_str(), port, slots.slots,
                   (long long)slots.context, (long long)(slots.prefix_cache_bytes >> 20), c->options().describe().c_str());
      std::fflush(stderr);
    });
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    std::fprintf(stderr, "rotary serve: stopped\n");
  }

  // Every slot's cache at --ctx with a prompt piece of --prefill-step, the weights read in place and one batch's
  // logits, then the prefix cache, against the memory available now: refused before serving, naming the bytes and
  // flags that fit. Sets the prefix cache's budget: --prefix-cache-mib, by default as much as the slots' caches at
  // --ctx (the memory for rows at most doubles), within what is available after the slots.
  void check_memory(const experiments::CheckpointModel& c) {
    const int64_t available = experiments::available_memory_bytes();
    const engine::Session one = c.session(slots.context);
    const int64_t piece = std::min(slots.prefill_step, slots.context);
    const int64_t per_slot = engine::Session::bytes_needed(one.model(), one.options(), piece);
    const int64_t shared = c.memory_needed(piece, experiments::CheckpointModel::RunKind::Score) +
                           4 * c.spec().config.vocab_size * int64_t(slots.slots);
    const int64_t need = shared + per_slot * slots.slots;
    const int64_t slot_caches = engine::Session::bytes_needed(one.model(), one.options(), 1) * slots.slots;
    if (available >= 0 && need > available) {
      const int64_t fit_slots = std::max<int64_t>(0, (available - shared) / std::max<int64_t>(per_slot, 1));
      fail("--parallel " + std::to_string(slots.slots) + " --ctx " + std::to_string(slots.context),
           fmt::format("{:.2f} GB ({:.2f} GB per slot, {:.2f} GB shared)", double(need) / 1e9, double(per_slot) / 1e9,
                       double(shared) / 1e9),
           fmt::format("a setting that fits the {:.2f} GB available now: --parallel {} at this --ctx, a smaller --ctx, "
                       "or --kv-dtype bf16 (halves the cache)",
                       double(available) / 1e9, fit_slots));
    }
    // (sessions whose rows cannot be cut at a token - a memory, dynamic NTK, LongRoPE - are kept whole)
    if (prefix_cache_mib < 0) {
      slots.prefix_cache_bytes = available < 0 ? slot_caches : std::clamp<int64_t>(available - need, 0, slot_caches);
      return;
    }
    slots.prefix_cache_bytes = prefix_cache_mib << 20;
    if (available >= 0 && need + slots.prefix_cache_bytes > available)
      fail("--prefix-cache-mib", std::to_string(prefix_cache_mib),
           fmt::format("at most {} MiB: {:.2f} GB are available now and the slots need {:.2f} GB",
                       (available - need) >> 20, double(available) / 1e9, double(need) / 1e9));
  }
};

const CommandRegistrar kRegister([](CLI::App& root) {
  auto cmd = std::make_shared<ServeCommand>();
  CLI::App* sub = root.add_subcommand(
      "serve", "serve a Hugging Face model over the OpenAI HTTP API (/v1/chat/completions, /v1/completions, "
               "/v1/models, /health, /metrics): streamed answers, --parallel slots batched together");
  sub->add_option("model", cmd->model_dir, "a Hugging Face model directory (config.json, safetensors, tokenizer, "
                                           "chat template)")
      ->required();
  sub->add_option("--host", cmd->server.host, "address to listen on (default 127.0.0.1: this machine only)");
  sub->add_option("--port", cmd->server.port, "port (default 8080; 0: any free port, printed)")
      ->transform(integer_in(0, 65535));
  sub->add_option("--alias", cmd->server.model_id, "the model id requests name (default: the directory's name)");
  sub->add_option("--api-key", cmd->server.api_key, "require \"Authorization: Bearer KEY\" on every request but /health");
  sub->add_option("--parallel", cmd->slots.slots, "slots: requests decoded together (default 1)")
      ->transform(integer_in(1, 256));
  sub->add_option("--ctx", cmd->context_tokens,
                  "tokens per slot, prompt and answer (default: the model's context, at most 4096)")
      ->transform(integer_in(2, kMaxSequenceLength));
  sub->add_option("--prefill-step", cmd->slots.prefill_step,
                  "prompt tokens a piece holds: a slot's prompt is read a piece at a time (default 512)")
      ->transform(integer_in(1, kMaxSequenceLength));
  sub->add_option("--prompt-share", cmd->slots.prompt_share,
                  "while other slots decode, the time a piece of a prompt longer than --prefill-step may add to their "
                  "step, as a share of the step without it: each step then runs as much of the piece (its tokens "
                  "through the layers) as fits, so a long prompt slows the others' streams by about 1 + this at "
                  "most; shorter prompts are read whole (default 0.5; 0: whole pieces)")
      ->transform(finite_in(0, 1000));
  sub->add_option("--context", cmd->slots.saved_contexts,
                  "a context saved by `generate --save-context` (a book read once, with its memory where it has one): "
                  "a prompt that starts with all of its tokens opens it instead of reading them (repeatable; the "
                  "same model and settings as it was saved with)")
      ->check(non_empty("a directory written by generate --save-context"));
  sub->add_option("--prefix-cache-mib", cmd->prefix_cache_mib,
                  "MiB of finished requests' sessions kept, least recently used out first, so that a prompt starting "
                  "with their tokens (the next turn of a conversation, another question about one document) reads "
                  "only the rest (default: as much as the slots' caches at --ctx, within the memory available; "
                  "0: none)")
      ->transform(integer_in(0, int64_t(1) << 30));
  sub->add_option("--queue", cmd->slots.queue_limit, "requests that may wait for a slot; more get 503 (default 64)")
      ->transform(integer_in(0, 4096));
  sub->add_option("--timeout", cmd->server.timeout_s, "seconds a request may take (default 600)")
      ->transform(finite_in(0.001, 1e7));
  sub->add_option("--drain", cmd->server.drain_s,
                  "seconds SIGTERM waits for running requests before failing them (default 30)")
      ->transform(finite_in(0, 1e6));
  sub->add_option("--max-body", cmd->server.limits.max_body_bytes, "largest request body in bytes (default 8 MiB)")
      ->transform(integer_in(1024, int64_t(1) << 32));
  sub->add_option("--threads", cmd->slots.threads, "threads (0 = all cores)")->transform(integer_in(0, kMaxThreads));
  cmd->chat_flags.add_to(*sub);
  cmd->overrides.add_to(*sub);
  add_checkpoint_run_flags(*sub, cmd->run_options);
  cmd->memory_flags = add_checkpoint_memory_flags(*sub, cmd->memory);
  sub->callback([cmd] { cmd->run(); });
});

}  // namespace
}  // namespace rotary::cli
