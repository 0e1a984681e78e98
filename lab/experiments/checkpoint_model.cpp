// CheckpointModel: the engine or the nn model behind the lab's checkpoint commands.
#include "experiments/checkpoint_model.h"

#include <fmt/format.h>

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/machine.h"
#include "memory/memory_index.h"
#include "rotary/content_hash.h"
#include "rotary/error.h"
#include "rotary_engine/generate.h"
#include "rotary_nn/hf_engine.h"
#include "common/stop_signal.h"

namespace rotary::experiments {

void CheckpointRunOptions::validate() const {
  check(engine == "engine" || engine == "torch", "--engine", engine, "engine, torch");
  check(engine != "torch" || torch_checkpoints_available(), "--engine", engine,
        "engine (this rotary is built without libtorch, which --engine torch runs the nn model on; a build with "
        "libtorch: scripts/build.sh)");
  // (a plain value beside a flag: GCC 12 warns that an std::optional<WeightFormat> may be read uninitialized)
  const bool weights_given = !weights.empty();
  const WeightFormat weights_to = weights_given ? parse_weight_format(weights, "--weights") : WeightFormat::F32;
  // Exactly the names listed (parse_dtype also reads "float16", "half", ...: a result stored under one spelling
  // would not be found under another).
  check(kv_dtype == "f32" || kv_dtype == "bf16" || kv_dtype == "f16" || kv_dtype == "q8", "--kv-dtype", kv_dtype,
        "f32, bf16, f16, q8");
  if (engine == "torch") {
    check(weights.empty(), "--weights", weights, "unset with --engine torch (the nn model copies weights to float32)");
    check(kv_dtype == "f32", "--kv-dtype", kv_dtype, "f32 with --engine torch");
    check(activations == "auto" || activations == "f32", "--activations", activations, "f32 with --engine torch");
  }
  const std::optional<ActivationFormat> act = activation_choice();
  if (act == ActivationFormat::BF16 && weights_given)
    check(weights_to == WeightFormat::BF16, "--activations", activations + " with --weights " + weights,
          "bf16 activations with bf16 weights only (--weights bf16 or bf16 as stored), or --activations f32");
  if (act == ActivationFormat::Q8 && weights_given)  // (as stored: the engine checks the file's formats)
    check(weights_to == WeightFormat::Q8 || is_block_format(weights_to), "--activations",
          activations + " with --weights " + weights,
          "q8 activations with --weights q8 or a block format (q8_0, q4_k, ...), or with a GGUF file's block formats "
          "as stored, or --activations f32");
}

std::optional<ActivationFormat> CheckpointRunOptions::activation_choice() const {
  if (activations == "auto") return std::nullopt;
  // (parse_activation_format's list lacks "auto", which this option also takes)
  for (ActivationFormat f : {ActivationFormat::F32, ActivationFormat::BF16, ActivationFormat::Q8})
    if (activations == activation_format_name(f)) return f;
  fail("--activations", "\"" + activations + "\"", "auto, f32, bf16, q8");
}

void CheckpointRunOptions::set_kv_cache(engine::SessionOptions& o) const {
  const bool q8 = kv_dtype == "q8";
  o.kv_dtype = q8 ? DType::F32 : parse_dtype(kv_dtype);
  o.kv_storage = q8 ? KvStorage::Q8 : KvStorage::Dtype;
}

nlohmann::json CheckpointRunOptions::key() const {
  if (engine == "torch") return {{"engine", "torch"}};
  nlohmann::json k = {{"engine", engine}, {"weights", weights.empty() ? "stored" : weights}, {"kv_dtype", kv_dtype}};
  if (activations != "f32") k["activations"] = activations;  // (absent from keys stored before the option)
  return k;
}

std::string CheckpointRunOptions::describe() const {
  if (engine == "torch") return "torch (float32 copies of the weights)";
  return fmt::format("engine (weights {}, kv cache {}{})", weights.empty() ? "as stored" : weights, kv_dtype,
                     activations == "f32" ? "" : ", activations " + activations);
}

void CheckpointMemoryOptions::validate() const {
  if (!enabled()) return;
  check(policy == "exact" || policy == "rerope" || policy == "none" || policy == "unlimiformer", "--memory", policy,
        "exact, rerope, none, unlimiformer");
  check(window >= 0, "--memory-window", window, ">= 0 (0: half the trained context)");
  check(top_k >= 0, "--top-k", top_k, ">= 0 (0: the window alone)");
  // Exactly the names listed (parse_dtype also reads f64, which the memory does not store).
  check(dtype == "f32" || dtype == "bf16" || dtype == "f16", "--memory-dtype", dtype, "f32, bf16, f16");
  check(page_size >= 1 && page_size <= 65536, "--page-size", page_size, "1..65536");
  if (search != "exact") {
    bool known = search == "faiss-flat" || search == "faiss-hnsw" || search == "faiss-ivf";
    if (search.rfind("pages", 0) == 0 || search.rfind("kdtree", 0) == 0 || search.rfind("graph", 0) == 0) {
      try {  // the lab's reader checks the digits and their range; its list of names is the lab's, not this flag's
        lab::memory_index_from_name(search, "--search");
        known = true;
      } catch (const Error&) {  // refused below, with this flag's names
      }
    }
    check(known, "--search", search,
          "exact, pages or kdtree (certified exact), pages<P> or kdtree<P> (P pages read per query, 1..2^30), "
          "graph or graph<W> (the query-routed graph, search width W, 1..2^20), faiss-flat, faiss-hnsw or "
          "faiss-ivf");
  }
}

namespace {

// An index of the lab (lab/memory/memory_index.h: FAISS's, or the query-routed graph) as the engine's search over
// one layer's memory. The graph learns from every query it is asked - the prompt's chunks first - and links the
// keys by them at its next build (MemoryIndex::add_queries; the other kinds ignore them). A saved context keeps the
// graph and its training sample (the FAISS kinds are rebuilt: they cost little beside the memory's reading).
class IndexSearch final : public engine::MemorySearch {
 public:
  IndexSearch(const KvMemory& memory, const lab::MemoryIndexConfig& config) : memory_(memory), index_(memory, config) {}
  void sync() override { index_.sync(); }
  double candidates(const MemoryAttentionParams& p, int64_t* out) override {
    index_.add_queries(p);
    const double before = index_.work().vectors;
    index_.candidates(p, out);
    return index_.work().vectors - before;
  }
  void save(const std::string& path) override {
    if (index_.config().kind != "graph") return;
    index_.sync();
    index_.save(path);
  }
  void open(const std::string& path) override {
    if (index_.config().kind == "graph" && std::filesystem::exists(path))
      index_ = lab::MemoryIndex::open(path, memory_, index_.config());
  }

 private:
  const KvMemory& memory_;
  lab::MemoryIndex index_;
};

// The index's bytes for `rows` rows of head_dim: FAISS keeps its own float32 copy of every key; hnsw adds 2 M
// neighbour ids (4 B) at level 0 and ~M / (M - 1) more above, ivf an 8-byte id per row.
int64_t index_bytes(const lab::MemoryIndexConfig& c, int64_t rows, int64_t head_dim) {
  int64_t per_row = 4 * head_dim + 8;
  if (c.kind == "hnsw") per_row += 4 * 3 * int64_t(c.hnsw_m) + 16;
  if (c.kind == "ivf") per_row += 8;
  // graph: no copy of the keys; an 8-byte offset and at most degree + 2 neighbours of 4 bytes a row, the training
  // queries, and while it is built each training query's Kq = 32 rows (8 bytes) and their links (4 bytes each).
  if (c.kind == "graph") {
    const int64_t queries = c.graph_training_queries, kq = MemoryGraphConfig{}.query_neighbors;
    return rows * (8 + 4 * (int64_t(c.graph_degree) + 2)) + queries * 4 * head_dim + queries * kq * (8 + 4 * (kq - 1));
  }
  return rows * per_row;
}

}  // namespace

engine::MemoryOptions CheckpointMemoryOptions::engine_options(int64_t trained_context) const {
  validate();
  engine::MemoryOptions m;
  m.policy = parse_memory_policy(policy);
  m.window = window > 0 ? window : std::max<int64_t>(1, trained_context / 2);
  m.top_k = top_k;
  m.storage = parse_dtype(dtype);
  if (is_faiss_search(search) || search.rfind("graph", 0) == 0) {
    const lab::MemoryIndexConfig c =
        lab::memory_index_from_name(is_faiss_search(search) ? search.substr(6) : search, "--search");
    m.search_factory = [c](const KvMemory& memory) { return std::make_unique<IndexSearch>(memory, c); };
    m.search_bytes = [c](int64_t rows, int64_t head_dim) { return index_bytes(c, rows, head_dim); };
  } else if (search != "exact") {
    const lab::MemoryIndexConfig c = lab::memory_index_from_name(search, "--search");
    m.search = MemoryPagesConfig{.page_size = page_size, .pages_read = c.pages_read,
                                 .grouping = c.kind == "kdtree" ? PageGrouping::Keys : PageGrouping::Tokens};
  }
  return m;
}

std::string CheckpointMemoryOptions::describe(int64_t trained_context) const {
  const engine::MemoryOptions m = engine_options(trained_context);
  return fmt::format("memory {}, W {}, top-{}, {}, search {}{}", policy, m.window, top_k, dtype, search,
                     is_paged_search(search) ? fmt::format(" (pages of {})", page_size) : "");
}

int64_t available_memory_bytes() { return lab::available_memory_bytes(); }

namespace {
TorchCheckpointLoader& torch_checkpoint_loader() {
  static TorchCheckpointLoader loader;
  return loader;
}
}  // namespace

void set_torch_checkpoint_loader(TorchCheckpointLoader loader) { torch_checkpoint_loader() = std::move(loader); }
bool torch_checkpoints_available() { return bool(torch_checkpoint_loader()); }

struct CheckpointModel::Impl {
  CheckpointRunOptions options;
  nn::HfModelSpec spec;
  nn::EncodingConfig active;
  std::unique_ptr<TorchCheckpoint> torch_model;  // --engine torch
  std::shared_ptr<const engine::Model> model;    // --engine engine
  int64_t mapped_bytes = 0;                      // weights read in place from the files
  int threads = 0;
  std::optional<engine::MemoryOptions> memory;   // set_memory
  engine::MemoryStats memory_stats;              // of the last run through the memory

  // Bytes the weights take in memory: the mapped ones read in place and the ones the model converted.
  int64_t weight_bytes() const { return std::max<int64_t>(mapped_bytes, 0) + model->owned_bytes(); }

  // A session for `capacity` tokens; Score: one pass that keeps no KV cache (with a memory, the memory is kept).
  engine::SessionOptions session(int64_t capacity, RunKind kind) const {
    engine::SessionOptions o;
    o.capacity = capacity, o.positions = nn::engine_positions(active);
    options.set_kv_cache(o);
    o.threads = threads;
    o.memory = memory;
    o.keep_caches = kind == RunKind::Generate || memory.has_value();
    return o;
  }
  // Tokens per forward call: all of them, or with a memory its chunk.
  int64_t piece(int64_t tokens) const {
    return memory ? std::min(tokens, memory->chunk_tokens()) : tokens;
  }
};

CheckpointModel::CheckpointModel(const std::string& model_dir, const CheckpointRunOptions& options)
    : impl_(std::make_unique<Impl>()) {
  options.validate();
  Impl& m = *impl_;
  m.options = options;
  m.threads = lab::resolve_threads(options.threads);
  omp_set_num_threads(m.threads);
  if (options.engine == "torch") {
    if (engine::is_gguf_path(model_dir))
      fail("--engine", "torch with the GGUF file " + model_dir,
           "engine for a GGUF file (the nn model reads Hugging Face model directories)");
    m.torch_model = torch_checkpoint_loader()(model_dir, m.threads);
    m.options.activations = "f32";  // the nn model's float32 products
    m.spec = m.torch_model->spec();
  } else {
    engine::LoadOptions load;
    load.threads = m.threads;
    if (!options.weights.empty()) load.weights = parse_weight_format(options.weights, "--weights");
    load.activations = options.activation_choice();
    nn::HfEngineCheckpoint c = nn::load_hf_engine(model_dir, load);
    m.spec = c.spec;
    m.model = c.model;
    m.options.activations = activation_format_name(m.model->activations());  // "auto" resolved
    m.mapped_bytes = m.model->weight_bytes_per_token() - m.model->owned_bytes();
  }
  m.active = m.spec.config.resolved_encoding();
}

CheckpointModel::~CheckpointModel() = default;
const nn::HfModelSpec& CheckpointModel::spec() const { return impl_->spec; }
const CheckpointRunOptions& CheckpointModel::options() const { return impl_->options; }

uint64_t CheckpointModel::weights_hash() const {
  const Impl& m = *impl_;
  return m.model ? m.model->weights_hash() : m.torch_model->weights_hash(m.threads);
}

const nn::EncodingConfig& CheckpointModel::active_encoding() const { return impl_->active; }

void CheckpointModel::set_override(const nn::EncodingOverride& o) {
  Impl& m = *impl_;
  if (m.torch_model) {
    m.active = m.torch_model->set_override(o);
  } else {
    m.active = nn::apply_override(m.spec.config, o);
    nn::engine_positions(m.active);  // a kind the engine cannot run is refused here, before any work
  }
}

void CheckpointModel::set_memory(const std::optional<engine::MemoryOptions>& memory) {
  Impl& m = *impl_;
  if (memory) {
    check(m.model != nullptr, "--engine", m.options.engine, "engine with a memory (it runs on the torch-free engine)");
    check(m.options.kv_dtype == "f32", "--kv-dtype", m.options.kv_dtype,
          "f32 with a memory (its window is kept in f32; --memory-dtype sets the memory's dtype)");
    engine::SessionOptions o = m.session(1, RunKind::Generate);
    o.memory = memory;
    engine::Session checked(m.model, o);  // every setting the session refuses, refused now, before any work
  }
  m.memory = memory;
}

engine::Session CheckpointModel::session(int64_t capacity) const {
  const Impl& m = *impl_;
  check(m.model != nullptr, "--engine", m.options.engine, "engine (a conversation keeps an engine session)");
  return engine::Session(m.model, m.session(capacity, RunKind::Generate));
}

std::shared_ptr<const engine::Model> CheckpointModel::engine_model() const {
  check(impl_->model != nullptr, "--engine", impl_->options.engine, "engine (the server batches engine sessions)");
  return impl_->model;
}

engine::MemoryStats CheckpointModel::memory_stats() const { return impl_->memory_stats; }

int64_t CheckpointModel::memory_needed(int64_t tokens, RunKind kind) const {
  const Impl& m = *impl_;
  if (!m.model) return 0;
  const int64_t piece = m.piece(tokens);
  const int64_t session = engine::Session::bytes_needed(*m.model, m.session(tokens, kind), piece);
  // The hidden rows handed out at a time and the LM head's chunk of logits.
  const int64_t logits = 4 * m.spec.config.vocab_size * std::min<int64_t>(piece, 512) +
                         (m.memory ? 4 * piece * m.spec.config.d_model : 0);
  // The weights the model converted at load are allocated already (MemAvailable no longer counts them): only the
  // mapped ones, read in place as the run touches them, are still to come.
  return std::max<int64_t>(m.mapped_bytes, 0) + session + logits;
}

void CheckpointModel::check_memory(int64_t tokens, RunKind kind, const std::string& what, int64_t available) const {
  const Impl& m = *impl_;
  if (!m.model) return;
  const int64_t need = memory_needed(tokens, kind), have = available >= 0 ? available : available_memory_bytes();
  if (have < 0 || need <= have) return;
  const int64_t mapped = std::max<int64_t>(m.mapped_bytes, 0), held = m.model->owned_bytes();
  const bool cache = kind == RunKind::Generate || m.memory;
  const bool q8 = m.model->matrix_format() == WeightFormat::Q8;
  fail(what, fmt::format("{} tokens, needing {:.2f} GB more than the {:.2f} GB of converted weights held already "
                         "(weights read in place {:.2f} GB, {}activations and logits {:.2f} GB)",
                         tokens, double(need) / 1e9, double(held) / 1e9, double(mapped) / 1e9,
                         cache ? "KV cache, " : "", double(need - mapped) / 1e9),
       fmt::format("a run that fits the {:.2f} GB available now: fewer tokens{}{}", double(have) / 1e9,
                   cache && !m.memory ? ", --kv-dtype bf16 (halves the cache)" : "",
                   q8 ? "" : ", or --weights q8 (about half of bf16's bytes)"));
}

void CheckpointModel::hidden_states(const std::vector<int64_t>& tokens,
                                    const std::function<void(int64_t, int64_t, const float*)>& rows) {
  Impl& m = *impl_;
  if (!m.memory) {
    const std::vector<float> all = hidden_states(tokens);
    rows(0, int64_t(tokens.size()), all.data());
    return;
  }
  const int64_t T = int64_t(tokens.size()), d = m.spec.config.d_model, piece = m.piece(T);
  engine::Session s(m.model, m.session(T, RunKind::Score));
  std::vector<float> hidden(size_t(piece * d));
  std::vector<int64_t> positions(static_cast<size_t>(piece));
  for (int64_t first = 0; first < T; first += piece) {
    const int64_t n = std::min(piece, T - first);
    for (int64_t i = 0; i < n; ++i) positions[size_t(i)] = first + i;
    s.forward(tokens.data() + first, positions.data(), n, hidden.data());
    rows(first, n, hidden.data());
  }
  m.memory_stats = s.memory_stats();
}

std::vector<float> CheckpointModel::hidden_states(const std::vector<int64_t>& tokens) {
  Impl& m = *impl_;
  const int64_t T = int64_t(tokens.size()), d = m.spec.config.d_model;
  std::vector<float> out(size_t(T * d));
  if (m.memory) {
    hidden_states(tokens, [&](int64_t first, int64_t n, const float* h) {
      std::memcpy(out.data() + first * d, h, size_t(n * d) * 4);
    });
    return out;
  }
  if (m.torch_model) {
    m.torch_model->hidden_states(tokens, out.data());
    return out;
  }
  engine::Session s(m.model, m.session(T, RunKind::Score));
  std::vector<int64_t> positions(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) positions[size_t(i)] = i;
  s.forward(tokens.data(), positions.data(), T, out.data());
  return out;
}

void CheckpointModel::project(const float* hidden, int64_t n, std::vector<float>& logits) {
  Impl& m = *impl_;
  logits.resize(size_t(n * m.spec.config.vocab_size));
  if (m.torch_model) return m.torch_model->project(hidden, n, logits.data());
  m.model->logits(hidden, n, logits.data(), m.threads);
}

std::vector<int64_t> CheckpointModel::generate(const std::vector<int64_t>& prompt, int64_t max_new, double temperature,
                                               const std::vector<int64_t>& stop_ids, uint64_t seed, int64_t sample_vocab,
                                               const std::function<void(int64_t, int64_t)>& on_prompt,
                                               const std::string& context, const std::string& save_context) {
  Impl& m = *impl_;
  check((context.empty() && save_context.empty()) || m.model, context.empty() ? "--save-context" : "--context",
        context.empty() ? save_context : context, "a run on the engine (--engine engine: it saves its sessions)");
  if (m.torch_model) {
    check(stop_ids.size() <= 1, "--engine", m.options.engine,
          "engine for a conversation whose template ends a turn with several tokens (the nn model stops at one)");
    return m.torch_model->generate(prompt, max_new, temperature, stop_ids.empty() ? -1 : stop_ids.front(), seed,
                                   sample_vocab);
  }
  engine::Session s(m.model, m.session(int64_t(prompt.size()) + std::max<int64_t>(max_new - 1, 0), RunKind::Generate));
  // A save this session could never make is refused now, not after the whole prompt is read.
  if (!save_context.empty()) s.check_save_context(save_context);
  if (!context.empty()) s.open_context(context);
  auto read = [&](int64_t done, int64_t total) {
    if (on_prompt) on_prompt(done, total);
    if (done == total && !save_context.empty()) s.save_context(save_context);
  };
  std::vector<int64_t> out = engine::generate(s, prompt, {.max_new = max_new, .temperature = temperature,
                                                          .stop_ids = stop_ids, .seed = seed,
                                                          .sample_vocab = sample_vocab, .on_token = {},
                                                          .on_prompt = read});
  m.memory_stats = s.memory_stats();
  return out;
}

}  // namespace rotary::experiments
