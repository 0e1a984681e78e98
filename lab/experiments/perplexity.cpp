// lab/experiments/perplexity.cpp
#include "experiments/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <fmt/format.h>
#include <optional>
#include <sstream>
#include <thread>

#include "common/files.h"
#include "common/plots.h"
#include "rotary/error.h"
#include "rotary/files.h"
#include "rotary/json_guard.h"
#include "rotary_engine/hf_model.h"
#include "rotary_tokenizers/tokenizer.h"
#include "common/progress.h"
#include "common/stop_signal.h"

namespace rotary::experiments {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr int kPositionBins = 64;

std::vector<Method> methods_of(const PerplexitySpec& spec, int64_t L) {
  std::vector<Method> out;
  for (const std::string& name : spec.methods)
    for (bool logn : spec.logn) {
      Method m;
      m.name = name;
      m.logn = logn;
      if (name == "rerope" || name == "leaky_rerope") m.window = spec.window > 0 ? spec.window : L / 2;
      if (name == "leaky_rerope") m.leaky_k = spec.leaky_k;
      if (name == "dynamic") m.dynamic_factor = spec.dynamic_factor;
      out.push_back(m);
      if (!spec.memory.enabled()) continue;
      m.memory_policy = spec.memory.policy;
      m.memory_window = spec.memory.engine_options(L).window;
      m.memory_top_k = spec.memory.top_k;
      m.memory_dtype = spec.memory.dtype;
      m.memory_search = spec.memory.search;
      m.memory_page_size = spec.memory.page_size;
      m.context = "memory";
      out.push_back(m);
      m.context = "window";
      out.push_back(m);
    }
  return out;
}

// The token stream: the text through the checkpoint's tokenizer (BOS first where the model expects it), or ids.
std::vector<int64_t> read_stream(const PerplexitySpec& spec, int64_t vocab_size) {
  if (!spec.tokens_file.empty()) return tokenizers::read_token_id_file(spec.tokens_file, vocab_size);
  const auto tokenizer = tokenizers::load_tokenizer(spec.model_dir);
  std::vector<int64_t> ids = tokenizer->encode_for_model(lab::read_file(spec.text_file));
  for (int64_t id : ids)
    check(id >= 0 && id < vocab_size, "token id of " + spec.text_file, id,
          fmt::format("[0, {}) (the model's vocab_size; is the tokenizer from another checkpoint?)", vocab_size));
  return ids;
}

std::string g(double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : "NaN"; }

// A cell's result (cell_store.h stores a NaN loss as null and cell_number reads it back as NaN).
nlohmann::json cell_to_json(const PerplexityCell& c) {
  return {{"method", c.method.key()},   {"length", c.length},           {"tail_loss", c.tail_loss},
          {"full_loss", c.full_loss},   {"tail_tokens", c.tail_tokens}, {"full_tokens", c.full_tokens},
          {"loss_by_bin", c.loss_by_bin}, {"seconds", c.seconds},       {"tokens_per_s", c.tokens_per_s}};
}

void cell_from_json(const nlohmann::json& j, PerplexityCell& c) {
  c.tail_loss = cell_number(j.at("tail_loss"));
  c.full_loss = cell_number(j.at("full_loss"));
  c.tail_tokens = j.at("tail_tokens").get<int64_t>();
  c.full_tokens = j.at("full_tokens").get<int64_t>();
  c.seconds = j.at("seconds").get<double>();
  c.tokens_per_s = j.at("tokens_per_s").get<double>();
  c.loss_by_bin.clear();
  for (const auto& v : j.at("loss_by_bin")) c.loss_by_bin.push_back(cell_number(v));  // (null also: no position)
}

// A methods x lengths table of one value per cell (`cell_text`), plain (printed) or markdown (report.md).
std::string method_table(const PerplexityResult& r, const std::vector<Method>& methods, bool markdown,
                         const std::string& corner, const std::function<std::string(const PerplexityCell&)>& cell_text) {
  std::ostringstream t;
  auto header = [&](int64_t T) {
    return T == r.train_len ? fmt::format("{} (L)", T) : fmt::format("{} ({:.3g}L)", T, double(T) / double(r.train_len));
  };
  if (markdown) {
    t << "| method |";
    for (int64_t T : r.lengths) t << " " << header(T) << " |";
    t << "\n|---|";
    for (size_t i = 0; i < r.lengths.size(); ++i) t << "---:|";
    t << "\n";
  }
  size_t width = corner.size() + 2;  // the plain table's first column: the longest label (memory rows are long)
  for (const Method& m : methods) width = std::max(width, m.label(false).size() + 2);
  if (!markdown) {
    t << fmt::format("{:<{}}", corner, width);
    for (int64_t T : r.lengths) t << fmt::format("{:>16}", header(T));
    t << "\n";
  }
  for (const Method& m : methods) {
    t << (markdown ? "| " + m.label(false) + " |" : fmt::format("{:<{}}", m.label(false), width));
    for (int64_t T : r.lengths) {
      std::string v = "-";
      for (const PerplexityCell& c : r.cells)
        if (c.length == T && c.method.key() == m.key()) v = cell_text(c);
      t << (markdown ? " " + v + " |" : fmt::format("{:>16}", v));
    }
    t << "\n";
  }
  return t.str();
}

std::string tail_loss_text(const PerplexityCell& c) { return fmt::format("{:.4f}", c.tail_loss); }

void write_report(const PerplexitySpec& spec, const std::vector<Method>& methods, PerplexityResult& r) {
  // results.csv
  std::ostringstream csv;
  csv << "method,logn,length,train_len,tail_loss,tail_ppl,full_loss,full_ppl,tail_tokens,full_tokens,seconds,tokens_per_s\n";
  for (const PerplexityCell& c : r.cells)
    csv << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{}\n", c.method.key(), c.method.logn ? 1 : 0, c.length,
                       r.train_len, g(c.tail_loss), g(std::exp(c.tail_loss)), g(c.full_loss), g(std::exp(c.full_loss)),
                       c.tail_tokens, c.full_tokens, g(c.seconds), g(c.tokens_per_s));
  r.csv = lab::join_path(spec.out_dir, "results.csv");
  lab::write_file_atomic(r.csv, csv.str());

  // Plots: tail loss against length per method, and loss against position at the longest length.
  const int64_t longest = r.lengths.back();
  const std::string at_train_len = fmt::format("set arrow from {0}, graph 0 to {0}, graph 1 nohead dt 3", r.train_len);
  lab::DataBlocks data;
  lab::Figure by_length{"loss_vs_length.png",
                        fmt::format("Loss on the last L = {} tokens against the window length", r.train_len),
                        "window length (tokens)", "loss (nats)", {"set key top left", "set logscale x 2", at_train_len},
                        {}};
  lab::Figure by_position{"loss_vs_position.png",
                          fmt::format("Loss by position at length {} (mean of {} stretches)", longest, kPositionBins),
                          "position", "loss (nats)", {"set key top left", at_train_len}, {}};
  for (const Method& m : methods) {
    std::vector<std::pair<double, double>> points;
    for (int64_t T : r.lengths)
      for (const PerplexityCell& c : r.cells)
        if (c.length == T && c.method.key() == m.key()) points.push_back({double(T), c.tail_loss});
    by_length.series.push_back(
        lab::data_series("perplexity.dat", data.add(m.key(), points), "linespoints lw 2", m.label(false)));
  }
  for (const Method& m : methods)
    for (const PerplexityCell& c : r.cells)
      if (c.length == longest && c.method.key() == m.key()) {
        std::vector<std::pair<double, double>> points;
        for (size_t b = 0; b < c.loss_by_bin.size(); ++b)
          if (std::isfinite(c.loss_by_bin[b]))
            points.push_back({(double(b) + 0.5) * double(longest) / double(c.loss_by_bin.size()), c.loss_by_bin[b]});
        by_position.series.push_back(lab::data_series("perplexity.dat", data.add(m.key() + " by position", points),
                                                      "lines lw 2", m.label(false)));
      }
  lab::write_file_atomic(lab::join_path(spec.out_dir, "perplexity.dat"), data.text());
  r.plot_problem = lab::run_gnuplot(spec.out_dir, lab::figure_script({by_length, by_position}));

  std::ostringstream md;
  md << "# rotary perplexity: a checkpoint past its context (seed 004's measurement)\n\n";
  if (!spec.command_line.empty()) md << "Command: `" << spec.command_line << "`\n\n";
  md << fmt::format("Model: {}. Trained context L = {}. Token stream: {} tokens, {} window(s) per length.\n\n",
                    r.model_description, r.train_len, r.stream_tokens, spec.windows);
  md << "Loss (nats) on the last L targets of each window - the same tokens at every length, only the context "
        "before them grows:\n\n"
     << method_table(r, methods, true, "", tail_loss_text) << "\nLoss over the whole window:\n\n"
     << method_table(r, methods, true, "", [](const PerplexityCell& c) { return fmt::format("{:.4f}", c.full_loss); })
     << "\nSpeed (input tokens per second through the model, one full forward per window):\n\n"
     << method_table(r, methods, true, "", [](const PerplexityCell& c) {
          return c.reused ? std::string("(earlier run)") : fmt::format("{:.0f}", c.tokens_per_s);
        });
  md << fmt::format("\nMachine: {} cores. This invocation: {:.0f} s.\n",
                    std::max(1u, std::thread::hardware_concurrency()), r.seconds);
  if (r.plot_problem.empty()) md << "\n![loss vs length](loss_vs_length.png)\n\n![loss vs position](loss_vs_position.png)\n";
  else md << "\nNo plots: " << r.plot_problem << "\n";
  r.report_md = lab::join_path(spec.out_dir, "report.md");
  lab::write_file_atomic(r.report_md, md.str());
}

}  // namespace

void validate(const PerplexitySpec& spec) {
  check(!spec.model_dir.empty(), "model", "(empty)", "a Hugging Face model directory or a GGUF file");
  check(spec.text_file.empty() != spec.tokens_file.empty(), "--text / --tokens",
        spec.text_file.empty() ? "neither" : "both", "exactly one: a text file or a token-id file");
  for (const std::string& m : spec.methods) check_method_name(m, "methods", /*checkpoint=*/true);
  check(!spec.methods.empty(), "methods", "(none)", "at least one method");
  check(!spec.logn.empty(), "logn", "(none)", "off, on or both");
  for (int64_t T : spec.lengths) check(T >= 2 && T <= kMaxAbsPosition, "lengths", T, ">= 2");
  check(spec.train_len >= 0, "train_len", spec.train_len, ">= 0 (0: the checkpoint's trained context)");
  check(spec.window >= 0, "window", spec.window, ">= 0 (0: L / 2)");
  check(spec.leaky_k >= 1, "leaky_k", spec.leaky_k, ">= 1");
  check(spec.dynamic_factor >= 1, "dynamic_factor", spec.dynamic_factor, ">= 1");
  check(spec.windows >= 1, "windows", spec.windows, ">= 1");
  check(spec.head_chunk >= 1, "head_chunk", spec.head_chunk, ">= 1");
  spec.memory.validate();
  if (spec.memory.enabled()) {
    spec.run.validate();
    check(spec.run.engine == "engine", "--engine", spec.run.engine, "engine with --memory (the memory runs on the "
                                                                    "torch-free engine)");
    for (const std::string& m : spec.methods)
      check(m != "dynamic", "--methods", "dynamic", "methods whose frequencies do not change with the length, with "
                                                    "--memory (a memory keeps its keys rotated once)");
  }
}

// The memory a method's cells run through (Method::context), for a checkpoint trained at L.
std::optional<engine::MemoryOptions> memory_of(const Method& m, const PerplexitySpec& spec, int64_t L) {
  if (m.context.empty()) return std::nullopt;
  engine::MemoryOptions o = spec.memory.engine_options(L);
  if (m.context == "window") o.policy = MemoryPolicy::Exact, o.top_k = 0, o.search.reset(), o.search_factory = {};
  return o;
}

WindowLoss window_loss(CheckpointModel& model, const std::vector<int64_t>& tokens, int64_t tail, int64_t head_chunk) {
  const int64_t T = int64_t(tokens.size()) - 1;
  check(T >= 1, "window tokens", int64_t(tokens.size()), ">= 2");
  check(tail >= 1 && tail <= T, "tail", tail, fmt::format("in [1, {}]", T));
  check(head_chunk >= 1, "head_chunk", head_chunk, ">= 1");
  const int64_t d = model.spec().config.d_model, V = model.spec().config.vocab_size;
  WindowLoss out;
  out.loss_by_position.resize(size_t(T));
  std::vector<float> logits;
  // Hidden rows [first, first + rows) as the model hands them out: the LM head head_chunk positions at a time.
  model.hidden_states(std::vector<int64_t>(tokens.begin(), tokens.end() - 1),
                      [&](int64_t first, int64_t rows, const float* hidden) {
    for (int64_t from = 0; from < rows; from += head_chunk) {
      const int64_t n = std::min(head_chunk, rows - from);
      model.project(hidden + from * d, n, logits);  // [n, V]
      for (int64_t i = 0; i < n; ++i) {  // cross entropy: logsumexp(logits) - logits[target], in double
        const float* row = logits.data() + i * V;
        const double top = *std::max_element(row, row + V);
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - top);
        const int64_t t = first + from + i;
        out.loss_by_position[size_t(t)] = top + std::log(sum) - double(row[tokens[size_t(t + 1)]]);
      }
    }
  });
  double full = 0, last = 0;
  for (int64_t t = 0; t < T; ++t) {
    full += out.loss_by_position[size_t(t)];
    if (t >= T - tail) last += out.loss_by_position[size_t(t)];
  }
  out.full_loss = full / double(T);
  out.tail_loss = last / double(tail);
  return out;
}

PerplexityResult run_perplexity(const PerplexitySpec& spec, bool progress) {
  validate(spec);
  const auto t_start = Clock::now();
  PerplexityResult r;
  CheckpointRunOptions run = spec.run;
  run.threads = spec.threads;
  CheckpointModel ckpt(spec.model_dir, run);
  const nn::ModelConfig& mc = ckpt.spec().config;
  r.train_len = spec.train_len > 0 ? spec.train_len : ckpt.spec().trained_context;
  r.model_description = fmt::format("{} ({}), d_model {} x {} layers, {} heads ({} kv), vocab {}, {}; {}",
                                    spec.model_dir, ckpt.spec().model_type, mc.d_model, mc.n_layers, mc.n_heads,
                                    mc.kv_heads(), mc.vocab_size, mc.resolved_encoding().rope.describe(),
                                    ckpt.options().describe());
  r.lengths = spec.lengths;
  if (r.lengths.empty()) r.lengths = {r.train_len, 2 * r.train_len, 4 * r.train_len};
  std::sort(r.lengths.begin(), r.lengths.end());
  r.lengths.erase(std::unique(r.lengths.begin(), r.lengths.end()), r.lengths.end());
  // The default lengths come from config.json (max_position_embeddings), not from validate()'s flags.
  for (int64_t T : r.lengths)
    check(T <= kMaxAbsPosition, "lengths", T, fmt::format("<= 2^53 (the default L, 2L, 4L with L = {})", r.train_len));
  check(r.lengths.front() >= r.train_len, "lengths", r.lengths.front(),
        fmt::format(">= L = {} (the loss is taken on the last L tokens of each window)", r.train_len));
  const int64_t longest = r.lengths.back();
  if (mc.sliding_window > 0)
    check(longest <= mc.sliding_window, "lengths", longest,
          fmt::format("<= sliding_window = {} (this checkpoint's attention span; rotary has no sliding-window "
                      "attention)", mc.sliding_window));

  const std::vector<int64_t> stream = read_stream(spec, mc.vocab_size);
  r.stream_tokens = int64_t(stream.size());
  const int64_t row = longest + 1;
  const std::string tokens_needed = "windows x (longest length + 1)";
  const std::string tokens_allowed =
      fmt::format("<= the {} tokens of {} (fewer --windows, shorter --lengths, or a longer text)", stream.size(),
                  spec.text_file.empty() ? spec.tokens_file : spec.text_file);
  // Checked: the product bounds the copies of the windows out of the stream below.
  const int64_t needed = checked_mul(spec.windows, row, tokens_needed, tokens_allowed);
  check(int64_t(stream.size()) >= needed, tokens_needed, needed, tokens_allowed);

  const std::vector<Method> methods = methods_of(spec, r.train_len);
  // Every (method, length) checked before the first cell runs (a window beyond L, ...), so a refused run writes
  // nothing.
  for (const Method& m : methods)
    for (int64_t T : r.lengths) {
      ckpt.set_override(method_override(m, mc.resolved_encoding(), r.train_len, T));
      ckpt.set_memory(memory_of(m, spec, r.train_len));  // a memory the method's encoding cannot run with
      ckpt.check_memory(longest, CheckpointModel::RunKind::Score, "--lengths");  // the longest window, before the first cell
    }
  // What describes the model beside its weights: config.json's text, or a GGUF file's description (its metadata
  // is its config; the weights hash covers its tensors).
  const std::string model_key = [&] {
    if (!engine::is_gguf_path(spec.model_dir)) return lab::read_file(lab::join_path(spec.model_dir, "config.json"));
    const nn::HfModelSpec& d = ckpt.spec();
    return fmt::format("gguf {} vocab {} d {} layers {} heads {}/{} head_dim {} d_ff {} eps {} tied {} {} ctx {}",
                       d.model_type, d.arch.vocab_size, d.arch.d_model, d.arch.n_layers, d.arch.n_heads,
                       d.arch.n_kv_heads, d.arch.head_dim, d.arch.d_ff, d.arch.norm_eps, d.arch.tie_embeddings,
                       d.rope.describe(), d.trained_context);
  }();
  const uint64_t weights_key = ckpt.weights_hash();  // by content: a copy or a switched symlink is no stale cell
  const uint64_t stream_hash = lab::fnv1a64(std::string_view(reinterpret_cast<const char*>(stream.data()),
                                                             stream.size() * sizeof(int64_t)));
  const lab::DirectoryLock lock(spec.out_dir, "--out");  // one command at a time writes these cells
  const CellStore cells(lab::join_path(spec.out_dir, "cells"));
  lab::StopSignalGuard signals;
  lab::Progress bar(int64_t(methods.size() * r.lengths.size()) * spec.windows, 0, progress);
  int64_t step = 0;
  for (int64_t T : r.lengths) {
    for (const Method& m : methods) {
      PerplexityCell c;
      c.method = m;
      c.length = T;
      ckpt.set_override(method_override(m, mc.resolved_encoding(), r.train_len, T));
      ckpt.set_memory(memory_of(m, spec, r.train_len));
      const nlohmann::json settings{{"run", ckpt.options().key()},
                                    {"model_config_json", lab::fnv1a64(model_key)},
                                    {"model_dir", spec.model_dir},
                                    {"weights", weights_key},
                                    {"stream", stream_hash},
                                    {"windows", spec.windows},
                                    {"longest", longest},
                                    {"train_len", r.train_len},
                                    {"encoding", nlohmann::json(ckpt.active_encoding())}};
      const std::string name = fmt::format("{}/T{}.json", m.key(), T);
      const CellLookup found = cells.find_cell(name, settings, c, cell_from_json);
      if (found == CellLookup::Reused) {
        step += spec.windows;
        bar.message(fmt::format("T={} {}: done earlier (loss {:.4f})", T, m.label(false), c.tail_loss));
        r.cells.push_back(c);
        continue;
      }
      if (found != CellLookup::Missing)
        bar.message(fmt::format("T={} {}: stored cell {}, computed again", T, m.label(false), cell_lookup_name(found)));
      const auto t0 = Clock::now();
      std::vector<double> by_pos(size_t(T), 0.0);
      for (int w = 0; w < spec.windows; ++w) {
        const auto row_end = stream.begin() + (w + 1) * row;
        const std::vector<int64_t> window(row_end - (T + 1), row_end);
        const auto tw = Clock::now();
        const WindowLoss loss = window_loss(ckpt, window, r.train_len, spec.head_chunk);
        c.tail_loss += loss.tail_loss / spec.windows;
        c.full_loss += loss.full_loss / spec.windows;
        for (int64_t t = 0; t < T; ++t) by_pos[size_t(t)] += loss.loss_by_position[size_t(t)] / spec.windows;
        bar.update(++step, loss.tail_loss, double(T) / std::max(1e-9, seconds_since(tw)));
        if (lab::stop_requested()) {
          bar.finish();
          r.run = RunOutcome::interrupted_by(lab::stop_signal(), "interrupted; the finished cells are in " +
                                                                     spec.out_dir + ", a rerun continues");
          r.seconds = seconds_since(t_start);
          return r;  // the finished cells are on disk; a rerun continues from here
        }
      }
      c.tail_tokens = r.train_len * spec.windows;
      c.full_tokens = T * spec.windows;
      c.loss_by_bin.assign(kPositionBins, 0.0);
      std::vector<int64_t> n_bin(kPositionBins, 0);
      for (int64_t t = 0; t < T; ++t) {
        const size_t b = size_t(t * kPositionBins / T);
        c.loss_by_bin[b] += by_pos[size_t(t)];
        ++n_bin[b];
      }
      for (int b = 0; b < kPositionBins; ++b)
        c.loss_by_bin[size_t(b)] = n_bin[size_t(b)] ? c.loss_by_bin[size_t(b)] / double(n_bin[size_t(b)]) : std::nan("");
      c.seconds = seconds_since(t0);
      c.tokens_per_s = double(T * spec.windows) / std::max(1e-9, c.seconds);
      cells.store(name, settings, cell_to_json(c));
      bar.message(fmt::format("T={} {}: loss on the last {} tokens {:.4f}, whole window {:.4f} ({:.0f} tokens/s)", T,
                              m.label(false), r.train_len, c.tail_loss, c.full_loss, c.tokens_per_s));
      r.cells.push_back(c);
    }
  }
  bar.finish();
  ckpt.set_memory(std::nullopt);
  ckpt.set_override({});
  for (const PerplexityCell& c : r.cells)
    if (!std::isfinite(c.tail_loss) || !std::isfinite(c.full_loss))
      r.non_finite.push_back(fmt::format("{} at T={}", c.method.label(false), c.length));
  r.table = method_table(r, methods, false, "loss on the last L tokens", tail_loss_text);
  r.seconds = seconds_since(t_start);
  write_report(spec, methods, r);
  return r;
}

}  // namespace rotary::experiments
