// lab/experiments/memory_experiment.cpp
#include "experiments/memory_experiment.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>

#include "common/statistics.h"
#include "common/files.h"
#include "common/limits.h"
#include "common/lists.h"
#include "common/plots.h"
#include "experiments/extrapolate_methods.h"
#include "memory/memory_index.h"
#include "rotary/error.h"
#include "rotary/json_guard.h"
#include "rotary/kv_memory.h"
#include "rotary_nn/memory_decoding.h"
#include "tasks/task.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/trainer.h"

namespace rotary::experiments {

using namespace train;
namespace {

using lab::median;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// W: as asked, else L / 2 - and never under a ReRoPE model's own window (the memory's keys must all lie past it).
int64_t memory_window(const MemorySpec& s, int L, const nn::EncodingConfig& trained) {
  if (s.window > 0) return s.window;
  const bool windowed = trained.kind == nn::EncodingKind::Rerope || trained.kind == nn::EncodingKind::LeakyRerope;
  return std::max<int64_t>({1, L / 2, windowed ? trained.window : 0});
}

// --memory-window against the model it serves, the rule MemoryKvCache holds it to when it is built, checked before
// a model is trained or a cell runs: under the rerope policy a ReRoPE model's memory keys must all lie past its
// window, so W >= that window.
void check_memory_window(const MemorySpec& s, const nn::EncodingConfig& trained, const std::string& who) {
  const bool windowed = trained.kind == nn::EncodingKind::Rerope || trained.kind == nn::EncodingKind::LeakyRerope;
  const bool rerope_policy = std::find(s.policies.begin(), s.policies.end(), "rerope") != s.policies.end();
  if (s.window > 0 && windowed && rerope_policy)
    check(s.window >= trained.window, "--memory-window", s.window,
          fmt::format(">= the ReRoPE window {} of {} under the rerope policy (its memory keys must all lie past "
                      "the window), or 0 for the default", trained.window, who));
}

// The tasks a memory run can test: one needle whose distance from the prompt's end grows with the prompt (passkey,
// kv_retrieval), or text, where the measure is the next-token accuracy and loss after a long prompt and the searches
// run on a language model's keys.
bool is_memory_task(const std::string& task) {
  return task == "passkey" || task == "kv_retrieval" || task == "text";
}
constexpr const char* kMemoryTasks = "passkey, kv_retrieval or text";

// text: a problem is a window of the training split's ids at a seeded start (the held-out split's 54k tokens are
// fewer than the longest memories hold; the measure is the memory and the search on the model's own keys, not the
// model's generalization): T prompt tokens, then kTextScored tokens predicted teacher-forced, each through the
// memory - the first from the prompt's last token, as a generated answer's first token is.
constexpr int kTextScored = 32;

// kv_retrieval's eval prompt (lab/tasks/kv_retrieval.cpp): an object of `pairs` pairs, pairs * (key_len + 11)
// characters, then " key=" - so a prompt of T characters holds (T - key_len - 2) / (key_len + 11) pairs.
int64_t kv_pairs_for(int64_t test_len, int key_len) { return (test_len - key_len - 2) / (key_len + 11); }

// The eval task of a cell: the model's task with prompts of test_len characters (passkey: its filler; kv_retrieval:
// as many pairs as fill them, which must stay within the task's limits: checked by check_test_lengths).
std::unique_ptr<lab::Task> eval_task(const TrainConfig& model_run, int test_len) {
  lab::TaskOptions options = model_run.task_options;
  if (model_run.task == "text") return lab::make_task("text", options);
  if (model_run.task == "kv_retrieval") {
    options.kv_pairs = int(kv_pairs_for(test_len, options.kv_key_len));
    options.kv_min_pairs = 0;  // a training option; eval objects have kv_pairs
  } else {
    options.passkey_eval_len = test_len;
  }
  return lab::make_task(model_run.task, options);
}

// Every test length must make a prompt of the model's task: for kv_retrieval at least one pair and no more than its
// keys' 26^key_len distinct keys (17,576 of 3 letters: 246,069 characters).
void check_test_lengths(const TrainConfig& model_run, const std::vector<int>& lengths, int L) {
  if (model_run.task == "text" && !lengths.empty()) {  // the longest prompt and its scored tokens in the split
    const int T = *std::max_element(lengths.begin(), lengths.end());
    std::mt19937_64 rng(0);
    try {
      eval_task(model_run, T)->train_sequence(rng, T + kTextScored - 1);
    } catch (const Error& e) {
      std::string why = e.what();  // the task's own check, naming the split's tokens
      if (why.rfind("rotary: ", 0) == 0) why.erase(0, 8);
      fail("lengths", std::to_string(T / L),
           fmt::format("multiples of L = {} whose prompts and {} scored tokens fit the text's training split ({})",
                       L, kTextScored, why));
    }
  }
  if (model_run.task != "kv_retrieval") return;
  const int key_len = model_run.task_options.kv_key_len;
  int64_t keys = 1;
  for (int i = 0; i < key_len; ++i) keys *= 26;
  for (int T : lengths) {
    const int64_t pairs = kv_pairs_for(T, key_len);
    if (pairs < 1 || pairs > keys)
      fail("lengths", std::to_string(T / L),
           fmt::format("multiples of L = {} whose prompts hold 1..{} key-value pairs of {}-letter keys (L x {} = {} "
                       "characters hold {})", L, keys, key_len, T / L, T, pairs));
  }
}

// Tokens from the needle to the end of the prompt: passkey's first digit after the needle's "the pass key is:"
// (lab/tasks/passkey.cpp); kv_retrieval's value of the asked key in the object.
double key_distance(const std::string& prompt) {
  size_t at = std::string::npos, after = 0;
  if (!prompt.empty() && prompt.back() == '=') {  // kv_retrieval: '... "key": "value"...} key='
    const size_t space = prompt.rfind(' ');
    if (space != std::string::npos) {
      const std::string key = "\"" + prompt.substr(space + 1, prompt.size() - space - 2) + "\": \"";
      at = prompt.find(key), after = key.size();
    }
  } else {
    const std::string cue = "the pass key is:";
    at = prompt.find(cue), after = cue.size();
  }
  return at == std::string::npos ? std::nan("") : double(prompt.size() - (at + after));
}

// What makes a cell's result what it is: a stored cell is reused only when all of it matches.
nlohmann::json cell_settings(const PreparedModel& p, const MemorySpec& spec, const MemoryCell& c, int64_t window) {
  nlohmann::json j{{"model_config", nlohmann::json(p.config)}, {"model_step", p.info.step},
                   {"checkpoint", p.info.checkpoint},         {"kind", c.kind},
                   {"name", c.name},                          {"top_k", c.top_k},
                   {"test_len", c.test_len},                  {"window", window},
                   {"problems", c.kind == "index" ? spec.index_problems : spec.problems},
                   {"eval_seed", spec.eval_seed}};
  j["model_config"].erase("out_dir");
  if (c.kind == "index") j["decoded_through_index"] = true;
  if (p.config.task == "text") j["text_scored"] = kTextScored;  // index cells before this measured exact decoding
  if (c.kind == "index" && c.name.rfind("graph", 0) == 0) {   // its build settings, so a change of default rebuilds
    const lab::MemoryIndexConfig g = lab::memory_index_from_name(c.name);
    j["graph"] = {{"width", g.graph_width}, {"degree", g.graph_degree}, {"training_queries", g.graph_training_queries}};
  }
  // Named only when not f32, so the cells stored before memories had a dtype are reused as they were.
  if (spec.memory_dtype != DType::F32) j["memory_dtype"] = dtype_name(spec.memory_dtype);
  return j;
}

nlohmann::json cell_result_json(const MemoryCell& c) {
  return {{"accuracy", c.accuracy},       {"problems", c.problems},           {"key_distance", c.key_distance},
          {"memory_mass", c.memory_mass}, {"memory_tokens", c.memory_tokens}, {"ms_per_answer_token", c.ms_per_answer_token},
          {"seconds", c.seconds},         {"reference", c.reference},         {"reference_overlap", c.reference_overlap},
          {"logit_error", c.logit_error}, {"recall", c.recall},               {"build_seconds", c.build_seconds},
          {"exact_step_ms", c.exact_step_ms}, {"index_step_ms", c.index_step_ms}, {"scored", c.scored},
          {"loss", c.loss}};
}

void cell_result_from_json(const nlohmann::json& j, MemoryCell& c) {
  auto number = [&](const char* key) { return cell_number(j.at(key)); };  // null: a quantity the cell lacks
  c.accuracy = number("accuracy");
  c.problems = j.at("problems").get<int>();
  c.key_distance = number("key_distance");
  c.memory_mass = number("memory_mass");
  c.memory_tokens = number("memory_tokens");
  c.ms_per_answer_token = number("ms_per_answer_token");
  c.seconds = number("seconds");
  c.reference = j.at("reference").get<std::string>();
  c.reference_overlap = number("reference_overlap");
  c.logit_error = number("logit_error");
  c.recall = number("recall");
  c.build_seconds = number("build_seconds");
  c.exact_step_ms = number("exact_step_ms");
  c.index_step_ms = number("index_step_ms");
  c.scored = j.contains("scored") ? number("scored") : std::nan("");  // cells stored before it was measured
  c.loss = j.contains("loss") ? number("loss") : std::nan("");        // and before text cells
}


// text's problems (kTextScored above) scored: logits_of(tokens, prefill_len) is given the prompt and the scored
// tokens but the last, and returns the logits [kTextScored, V] of the tokens from prefill_len = T - 1 on, which
// predict the scored tokens.
struct TextScore {
  int64_t correct = 0, tokens = 0;
  double nll = 0;  // summed over the scored tokens, nats
};
using LogitsFn = std::function<torch::Tensor(const std::vector<int64_t>& tokens, int64_t prefill_len)>;
TextScore score_text(const lab::Task& task, int T, int problems, uint64_t seed, const LogitsFn& logits_of) {
  TextScore s;
  for (int i = 0; i < problems; ++i) {
    std::mt19937_64 rng(seed + uint64_t(i));
    const lab::TrainSequence row = task.train_sequence(rng, T + kTextScored - 1);  // T + kTextScored ids
    const std::vector<int64_t> fed(row.tokens.begin(), row.tokens.end() - 1);      // the last is only predicted
    const torch::Tensor target =
        torch::tensor(std::vector<int64_t>(row.tokens.begin() + T, row.tokens.end()), torch::kLong);
    const torch::Tensor logits = logits_of(fed, T - 1).to(torch::kDouble);
    check(logits.size(0) == kTextScored, "text logits rows", logits.size(0), std::to_string(kTextScored));
    s.nll -= torch::log_softmax(logits, 1).gather(1, target.view({-1, 1})).sum().item<double>();
    s.correct += logits.argmax(1).eq(target).sum().item<int64_t>();
    s.tokens += kTextScored;
  }
  return s;
}

// MemoryDecodeOptions::search for an index cell: at each retrieving step of each layer the query is searched
// through a FAISS index over the layer's memory (built at the prompt's first retrieving step, synced after), and
// the decoding attends to its candidates. Beside that, on scratch outputs, the exact scan and the index's step
// (candidates + memory_attention over them) are timed alone, and the candidates' recall of the exact top-k taken.
class IndexProbe {
 public:
  explicit IndexProbe(const std::string& name) : config_(lab::memory_index_from_name(name)) {}
  // compare = false: this prompt decodes through the index alone (no exact scan beside it, which would also take
  // the caches from the next step), so its answer tokens' time is the time decoding through the index takes.
  void new_prompt(bool compare) { indexes_.clear(), synced_.clear(), compare_ = compare; }
  // MemoryDecodeOptions::on_prompt_queries: the prompt's queries, which a graph is routed by (the other kinds
  // ignore them). Prefill work: not in the step's time.
  void learn(int layer, const KvMemory& memory, const MemoryAttentionParams& queries) {
    index_of(layer, memory).add_queries(queries);
  }
  void operator()(const nn::MemoryStep& s, int64_t* proposed) {
    lab::MemoryIndex& index = index_of(s.layer, *s.memory);
    const auto entered = Clock::now();
    auto t0 = entered;
    const bool fresh = !synced_[size_t(s.layer)];
    synced_[size_t(s.layer)] = true;
    index.sync();
    // What decoding through the index costs is the sync of the rows since the last step and the search below; the
    // build (a prefill's work), the exact scan and the rest of this comparison are set aside from the step time.
    double decoding = fresh ? 0.0 : seconds_since(t0);
    if (fresh) build_seconds_ += seconds_since(t0), ++builds_;

    const int64_t Hq = s.q_heads, D = s.head_dim, k = s.top_k;
    std::vector<float> o(static_cast<size_t>(Hq * D)), lse(static_cast<size_t>(Hq));
    std::vector<int64_t> candidates(size_t(Hq * k));
    std::vector<float> exact_scores(size_t(Hq * k)), index_scores(size_t(Hq * k));
    MemoryAttentionParams p;
    p.tokens = 1;
    p.q = {const_cast<float*>(s.q), Hq, Hq * D, D};
    p.q_positions = &s.position;
    p.top_k = int(k);
    p.softmax_scale = s.softmax_scale;
    p.query_origin = s.query_origin;
    p.o = {o.data(), Hq, Hq * D, D};
    p.lse = lse.data();
    auto scratch = [&] {
      std::fill(o.begin(), o.end(), 0.0f);
      std::fill(lse.begin(), lse.end(), -std::numeric_limits<float>::infinity());
    };
    scratch();
    if (!compare_) {
      const auto searched = Clock::now();
      index.candidates(p, proposed);
      aside_seconds_ += seconds_since(entered) - decoding - seconds_since(searched);
      return;
    }
    p.retrieved_scores = exact_scores.data();
    t0 = Clock::now();
    memory_attention(*s.memory, p);
    exact_ms_.push_back(1e3 * seconds_since(t0));
    scratch();
    p.retrieved_scores = index_scores.data();
    t0 = Clock::now();
    const lab::SearchWork before = index.work();
    const auto searched = Clock::now();
    index.candidates(p, candidates.data());
    decoding += seconds_since(searched);
    scored_ += (index.work().vectors - before.vectors) / (index.work().scan_vectors - before.scan_vectors);
    p.candidates = candidates.data();
    memory_attention(*s.memory, p);
    index_ms_.push_back(1e3 * seconds_since(t0));
    std::copy(candidates.begin(), candidates.end(), proposed);

    // Recall by score: a proposed row counts when its exact score reaches the exact k-th best (within fp32
    // rounding of the two scoring paths). Keys repeat (a layer's first keys are functions of the token), and among
    // equal scores which rows a search keeps is arbitrary, so rows are not compared.
    double recall = 0;
    for (int64_t h = 0; h < Hq; ++h) {
      const float kth = exact_scores[size_t(h * k + k - 1)];  // the exact search fills all k (k <= size)
      const double tolerance = 1e-5 * std::max(1.0, double(std::abs(kth)));
      int64_t found = 0;  // past what the index found, the score is -inf
      for (int64_t i = 0; i < k; ++i) found += index_scores[size_t(h * k + i)] >= kth - tolerance ? 1 : 0;
      recall += double(std::min(found, k)) / double(k);
    }
    recall_ += recall / double(Hq);
    memory_tokens_ += double(s.memory->size());
    ++steps_;
    aside_seconds_ += seconds_since(entered) - decoding;
  }
  // Seconds of this probe's calls that decoding through the index would not spend (above), so far.
  double aside_seconds() const { return aside_seconds_; }
  void finish(MemoryCell& c) const {
    c.recall = steps_ ? recall_ / double(steps_) : std::nan("");
    c.memory_tokens = steps_ ? memory_tokens_ / double(steps_) : 0;
    c.build_seconds = builds_ ? build_seconds_ / double(builds_) : std::nan("");
    c.exact_step_ms = median(exact_ms_);
    c.index_step_ms = median(index_ms_);
    c.scored = steps_ ? scored_ / double(steps_) : std::nan("");
  }

 private:
  lab::MemoryIndexConfig config_;
  // This prompt's index of a layer, made on first use.
  lab::MemoryIndex& index_of(int layer, const KvMemory& memory) {
    if (indexes_.size() <= size_t(layer)) indexes_.resize(size_t(layer) + 1), synced_.resize(size_t(layer) + 1);
    if (!indexes_[size_t(layer)]) indexes_[size_t(layer)] = std::make_unique<lab::MemoryIndex>(memory, config_);
    return *indexes_[size_t(layer)];
  }

  std::vector<std::unique_ptr<lab::MemoryIndex>> indexes_;  // per layer, this prompt's
  std::vector<bool> synced_;                                // per layer: synced at a step (built) already
  double recall_ = 0, memory_tokens_ = 0, build_seconds_ = 0, scored_ = 0, aside_seconds_ = 0;
  bool compare_ = true;
  int64_t steps_ = 0, builds_ = 0;
  std::vector<double> exact_ms_, index_ms_;
};

// The policy that is exact for the model: the logits it was trained with.
std::string own_policy(nn::EncodingKind kind) { return kind == nn::EncodingKind::Rope ? "exact" : "rerope"; }

// Baselines other than "trained" apply a RoPE method at the test length: a RoPE model's only.
void check_baselines(const std::vector<std::string>& baselines, nn::EncodingKind kind, const std::string& who) {
  if (kind == nn::EncodingKind::Rope) return;
  for (const std::string& b : baselines)
    check(b == "trained", "baselines", b,
          "trained only, for " + who + " trained with " + std::string(nn::encoding_kind_name(kind)) +
              " (the other methods are applied to a RoPE model)");
}

// Scores one cell (or reads it back from cells/ when its settings match).
class MemoryCellRunner {
 public:
  MemoryCellRunner(const MemorySpec& spec, PreparedModel& p, int64_t window, bool progress, int total)
      : spec_(spec), p_(p), cells_(lab::join_path(spec.out_dir, "cells")), window_(window), progress_(progress),
        total_(total) {}

  MemoryCell run(MemoryCell c) {
    ++index_;
    const nlohmann::json settings = cell_settings(p_, spec_, c, window_);
    const std::string stem = c.kind == "full" ? c.name : fmt::format("{}_k{}", c.name, c.top_k);
    const std::string path = fmt::format("T{}/{}_{}.json", c.test_len, c.kind, stem);
    const std::string label = fmt::format("[{}/{}] T={} {} {}", index_, total_, c.test_len, c.kind, stem);
    const CellLookup found = cells_.find_cell(path, settings, c, cell_result_from_json);
    if (found == CellLookup::Reused) {
      if (progress_) std::fprintf(stderr, "%s: done earlier\n", label.c_str());
      return c;
    }
    if (progress_ && found != CellLookup::Missing)
      std::fprintf(stderr, "%s: stored cell %s, computed again\n", label.c_str(), cell_lookup_name(found));
    const auto t0 = Clock::now();
    const std::unique_ptr<lab::Task> task = eval_task(p_.config, c.test_len);
    const bool text = p_.config.task == "text";
    nn::MemoryDecodeStats sum;
    double mass = 0, ms = 0, overlap = 0, error = 0;
    int retrieving = 0, compared = 0, decoded = 0;
    Accuracy acc;     // passkey, kv_retrieval: exact match of the generated answers
    TextScore score;  // text: the scored tokens after each prompt
    const int problems = c.kind == "index" ? spec_.index_problems : spec_.problems;
    const std::string own = own_policy(p_.config.model.encoding.kind);
    // Each prompt through `o`'s memory - the answer generated, or text's tokens after the prompt teacher-forced -
    // between before() and after(its stats).
    auto through_memory = [&](const nn::MemoryDecodeOptions& o, const std::function<void()>& before,
                              const std::function<void(const nn::MemoryDecodeStats&)>& after) {
      if (text) {
        score = score_text(*task, c.test_len, problems, spec_.eval_seed,
                           [&](const std::vector<int64_t>& tokens, int64_t prefill) {
          before();
          nn::MemoryDecodeStats s;
          torch::Tensor logits = nn::decode_logits_with_memory(*p_.model, tokens, o, &s, prefill);
          after(s);
          return logits;
        });
      } else {
        acc = exact_match(p_.model, *task, problems, spec_.eval_seed, spec_.eval_seed,
                          [&](const std::vector<int64_t>& prompt, int max_new, int64_t stop_id, uint64_t seed) {
                            before();
                            nn::MemoryDecodeStats s;
                            std::vector<int64_t> out =
                                nn::generate_with_memory(*p_.model, prompt, max_new, 0.0, stop_id, seed, o, &s);
                            after(s);
                            return out;
                          });
      }
    };
    if (c.kind == "index") {
      p_.model->set_override({});
      IndexProbe probe(c.name);
      nn::MemoryDecodeOptions o = memory_options(own, c.top_k);
      o.search = [&probe](const nn::MemoryStep& s, int64_t* candidates) { probe(s, candidates); };
      o.on_prompt_queries = [&probe](int layer, const KvMemory& memory, const MemoryAttentionParams& queries) {
        probe.learn(layer, memory, queries);
      };
      c.reference = own;
      // The last prompt (of two or more) decodes through the index alone and is timed; the others are compared
      // with the exact scan at every step. Every retrieving step is an answer step: the probe's work is set aside.
      bool timed = false;
      double aside = 0;
      auto start_prompt = [&] {
        timed = spec_.index_problems >= 2 && decoded == spec_.index_problems - 1;
        probe.new_prompt(!timed);
        aside = probe.aside_seconds();
      };
      through_memory(o, start_prompt, [&](const nn::MemoryDecodeStats& s) {
        if (timed)
          ms = 1e3 * (s.answer_seconds - (probe.aside_seconds() - aside)) /
               double(std::max<int64_t>(1, s.answer_tokens));
        ++decoded;
      });
      probe.finish(c);
      c.ms_per_answer_token = spec_.index_problems >= 2 ? ms : std::nan("");
      c.memory_mass = c.reference_overlap = c.logit_error = std::nan("");
    } else if (c.kind == "memory") {
      p_.model->set_override({});
      nn::MemoryDecodeOptions o = memory_options(c.name, c.top_k);
      if (c.name != own) o.reference_policy = parse_memory_policy(c.reference = own);
      through_memory(o, [] {}, [&](const nn::MemoryDecodeStats& s) {
        if (s.retrieving_steps > 0) mass += s.memory_mass, ++retrieving;
        if (s.compared_steps > 0) overlap += s.reference_overlap, error += s.logit_error, ++compared;
        sum.memory_tokens += s.memory_tokens;
        ms += 1e3 * s.answer_seconds / double(std::max<int64_t>(1, s.answer_tokens));
        ++decoded;
      });
      c.memory_mass = retrieving ? mass / retrieving : std::nan("");
      c.memory_tokens = decoded ? double(sum.memory_tokens) / decoded : 0;
      c.ms_per_answer_token = decoded ? ms / decoded : std::nan("");
      c.reference_overlap = compared ? overlap / compared : std::nan("");
      c.logit_error = compared ? error / compared : std::nan("");
    } else {
      Method m;
      m.name = c.name;
      if (m.name == "rerope" || m.name == "leaky_rerope") m.window = window_;
      if (m.name == "leaky_rerope") m.leaky_k = 16;
      p_.model->set_override(c.name == "trained" ? nn::EncodingOverride{}
                                                 : method_override(m, p_.model->config().resolved_encoding(),
                                                                   p_.info.train_len, c.test_len));
      if (text) {
        torch::NoGradGuard no_grad;
        p_.model->eval();
        score = score_text(*task, c.test_len, problems, spec_.eval_seed,
                           [&](const std::vector<int64_t>& tokens, int64_t prefill) {
          const torch::Tensor all = p_.model->forward(torch::tensor(tokens, torch::kLong).view({1, -1}))[0];
          return all.narrow(0, prefill, kTextScored);
        });
      } else {
        acc = exact_match(p_.model, *task, problems, spec_.eval_seed, 0.0, spec_.eval_seed);
      }
      p_.model->set_override({});
      c.memory_mass = c.memory_tokens = c.ms_per_answer_token = c.reference_overlap = c.logit_error = std::nan("");
    }
    if (c.kind != "index") c.recall = c.build_seconds = c.exact_step_ms = c.index_step_ms = c.scored = std::nan("");
    if (text) {
      c.accuracy = score.tokens ? double(score.correct) / double(score.tokens) : 0.0;
      c.loss = score.tokens ? score.nll / double(score.tokens) : std::nan("");
      c.problems = problems;
      c.key_distance = std::nan("");  // no needle
    } else {
      c.accuracy = acc.value();
      c.problems = acc.total;
      c.loss = std::nan("");
      double distance = 0;
      for (const ProblemResult& r : acc.results) distance += key_distance(r.prompt);
      c.key_distance = acc.total ? distance / acc.total : std::nan("");
    }
    c.seconds = seconds_since(t0);
    cells_.store(path, settings, cell_result_json(c));
    if (progress_) {
      const std::string measured = text ? fmt::format("next-token accuracy {:.1f}%, loss {:.4f}, over {} prompts",
                                                      100 * c.accuracy, c.loss, c.problems)
                                        : fmt::format("exact match {:.1f}% of {}", 100 * c.accuracy, c.problems);
      std::string what = measured;
      if (c.kind == "memory")
        what += fmt::format(", memory mass {:.3f}, {:.0f} memory tokens, {:.2f} ms per answer token", c.memory_mass,
                            c.memory_tokens, c.ms_per_answer_token);
      if (c.kind == "memory" && !c.reference.empty())
        what += fmt::format(", {:.3f} of {}'s top-k, |logit error| {:.3f}", c.reference_overlap, c.reference,
                            c.logit_error);
      if (c.kind == "index")
        what = fmt::format("{} through the index, recall@{} {:.3f} of {}'s exact top-k, "
                           "{:.4f} of the keys scored, build {:.2f} s per layer, {:.3f} ms per step against {:.3f} "
                           "exact ({:.0f} memory tokens), {:.2f} ms per answer token through it",
                           measured, c.top_k, c.recall, c.reference, c.scored, c.build_seconds,
                           c.index_step_ms, c.exact_step_ms, c.memory_tokens, c.ms_per_answer_token);
      std::fprintf(stderr, "%s: %s (%.1f s)\n", label.c_str(), what.c_str(), c.seconds);
    }
    return c;
  }

 private:
  // The memory decoding every memory and index cell uses: the prompt in chunks of W that see the window alone,
  // retrieval from the prompt's last token on.
  nn::MemoryDecodeOptions memory_options(const std::string& policy, int top_k) const {
    nn::MemoryDecodeOptions o;
    o.window = window_;
    o.storage = spec_.memory_dtype;
    o.policy = parse_memory_policy(policy);
    o.top_k = top_k;
    o.retrieve_in_prompt = false;
    o.prefill_chunk = window_;
    return o;
  }

  const MemorySpec& spec_;
  PreparedModel& p_;
  CellStore cells_;
  int64_t window_;
  bool progress_;
  int total_, index_ = 0;
};

std::string num(double v, const char* format = "{:.3f}") { return std::isfinite(v) ? fmt::format(fmt::runtime(format), v) : "-"; }

std::string row_label(const MemoryCell& c) {
  if (c.kind == "index") return fmt::format("{} index (top-{})", c.name, c.top_k);
  return c.kind == "memory" ? fmt::format("memory {} (top-{})", c.name, c.top_k) : fmt::format("full context, {}", c.name);
}

// report.md, results.csv and the two plots.
void write_report(const MemorySpec& spec, const std::string& task, int L, int64_t window, const std::vector<int>& lengths,
                  MemoryResult& r) {
  const bool kv = task == "kv_retrieval", text = task == "text";
  const std::string measure = text ? "next-token accuracy" : "exact match";
  std::vector<std::string> rows;  // row labels in the cells' order
  for (const MemoryCell& c : r.cells)  // the index cells have a table of their own
    if (c.kind != "index" && std::find(rows.begin(), rows.end(), row_label(c)) == rows.end()) rows.push_back(row_label(c));
  auto find = [&](const std::string& row, int T) -> const MemoryCell* {
    for (const MemoryCell& c : r.cells)
      if (row_label(c) == row && c.test_len == T) return &c;
    return nullptr;
  };

  std::ostringstream md;
  md << "# rotary memory: "
     << (text ? "a text model read far beyond its training length" : kv ? "key-value retrieval far beyond the training length" : "pass-key retrieval far beyond the training length")
     << " (seed 001)\n\n";
  md << "Command: `" << spec.command_line << "`\n\n";
  md << "Model: " << r.model.description << " (" << r.model.checkpoint << ")";
  if (std::isfinite(r.model.heldout_loss)) md << fmt::format(", held-out loss {:.4f} at L", r.model.heldout_loss);
  md << fmt::format(". L = {}; memory window W = {} tokens per layer (the window holds W..2W-1 exact tokens, older "
                    "ones go to the memory); the prompt in chunks of W that see the window alone, the memory read at "
                    "the prompt's last token and the answer's. {} prompts per cell; memory: {} bytes per token "
                    "(every layer's keys and values {}, its position int64).\n\n",
                    L, window, spec.problems, r.memory_bytes_per_token, dtype_name(spec.memory_dtype));
  if (text)
    md << fmt::format("Text: each prompt is a window of T tokens of the model's training text at a seeded start (the "
                      "held-out split is shorter than the longest memories; this measures the memory and the searches "
                      "on a language model's keys), followed by {} tokens predicted teacher-forced, each through the "
                      "memory (the first from the prompt's last token): next-token accuracy and loss (nats) on those "
                      "tokens.\n\n", kTextScored);
  // A table of rows (methods) by prompt length, one cell's value each.
  auto length_table = [&](const std::string& title, const std::function<std::string(const MemoryCell&)>& value) {
    md << "## " << title << "\n\n| method |";
    for (int T : lengths) md << " " << T << " (" << T / L << "L) |";
    md << "\n|---|";
    for (size_t i = 0; i < lengths.size(); ++i) md << "---:|";
    md << "\n";
    for (const std::string& row : rows) {
      md << "| " << row << " |";
      for (int T : lengths) {
        const MemoryCell* c = find(row, T);
        md << " " << (c ? value(*c) : std::string("-")) << " |";
      }
      md << "\n";
    }
  };
  length_table(std::string(text ? "Next-token accuracy" : "Exact match") + " against prompt length",
               [](const MemoryCell& c) { return fmt::format("{:.1f}%", 100 * c.accuracy); });
  md << "\n(-: not run; the full-context baselines run up to " << L * spec.full_max_multiple << " tokens.)\n\n";
  if (text) {
    length_table("Loss (nats per token) on the scored tokens", [](const MemoryCell& c) { return num(c.loss, "{:.4f}"); });
    md << "\n";
  }
  md << "## Memory: softmax mass on retrieved keys, memory size, latency, distance from the model's own policy\n\n"
        "Overlap: the share of the top-k rows under the model's own policy (`exact` for a RoPE model, `rerope` for a "
        "ReRoPE one) that the policy retrieved; logit error: the mean |scaled logit - the own policy's| over the rows "
        "it retrieved (Unlimiformer's with its re-rotation). Both over every answer step, layer and head.\n\n"
        "| method | length | memory tokens per layer | mass on retrieved keys | ms per answer token | key distance | "
        "overlap with own top-k | logit error |\n|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const MemoryCell& c : r.cells)
    if (c.kind == "memory")
      md << "| " << row_label(c) << " | " << c.test_len << " | " << num(c.memory_tokens, "{:.0f}") << " | "
         << num(c.memory_mass) << " | " << num(c.ms_per_answer_token, "{:.2f}") << " | "
         << num(c.key_distance, "{:.0f}") << " | " << num(c.reference_overlap) << " | " << num(c.logit_error)
         << " |\n";
  std::vector<std::string> index_rows;
  for (const MemoryCell& c : r.cells)
    if (c.kind == "index" && std::find(index_rows.begin(), index_rows.end(), row_label(c)) == index_rows.end())
      index_rows.push_back(row_label(c));
  if (!index_rows.empty()) {
    md << "\n## Approximate search on the model's own keys\n\n"
       << fmt::format("The model's own policy; the first {} prompts of each length decoded through an index "
                      "over each layer's memory (lab/memory: FAISS at its defaults, or the core's page search): every "
                      "answer step attends to the index's candidates. {} that way, recall of the exact top-k "
                      "rows, the vectors the search scored as a share of an exact scan's (a page bound counts two), "
                      "the index's build time per layer, and one layer's memory attention for one token through the "
                      "index's candidates against the exact scan (medians, {}); last, the whole model's time per answer token "
                      "decoding through the index, on the last of the prompts, which runs without the comparison "
                      "(its index's build left out: the step a user of the index pays, beside the memory cells' "
                      "exact-scan steps above). Recall counts a proposed row when its exact score reaches the exact "
                      "k-th best: keys repeat (a first layer's keys are functions of the character), and among "
                      "equal scores which rows a search keeps is arbitrary.\n\n",
                      spec.index_problems, text ? "Next-token accuracy (and loss)" : "Exact match",
                      spec.threads == 0 ? std::string("all cores") : fmt::format("{} threads", spec.threads))
       << "| index | length | memory tokens per layer | " << measure << " | recall@k | keys scored | build s per layer "
          "| exact ms / step | index ms / step | x exact | ms per answer token |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const MemoryCell& c : r.cells)
      if (c.kind == "index")
        md << "| " << row_label(c) << " | " << c.test_len << " | " << num(c.memory_tokens, "{:.0f}") << " | "
           << (text ? fmt::format("{:.1f}%, loss {:.4f}", 100 * c.accuracy, c.loss)
                    : fmt::format("{:.1f}% of {}", 100 * c.accuracy, c.problems))
           << " | " << num(c.recall) << " | " << num(c.scored, "{:.4f}") << " | " << num(c.build_seconds, "{:.2f}") << " | " << num(c.exact_step_ms) << " | "
           << num(c.index_step_ms) << " | " << num(c.exact_step_ms / c.index_step_ms, "{:.2f}") << " | "
           << num(c.ms_per_answer_token, "{:.2f}") << " |\n";
  }
  md << "\n![" << measure << " against length](accuracy_vs_length.png)\n\n"
        "![latency per answer token against memory size](latency_vs_memory.png)\n";
  if (!index_rows.empty()) md << "\n![one step's memory search against memory size](search_vs_memory.png)\n";

  std::ostringstream csv;
  csv << "kind,name,top_k,test_len,accuracy,problems,key_distance,memory_mass,memory_tokens,ms_per_answer_token,"
         "reference,reference_overlap,logit_error,recall,scored,build_seconds,exact_step_ms,index_step_ms,seconds,loss\n";
  for (const MemoryCell& c : r.cells)
    csv << c.kind << "," << c.name << "," << c.top_k << "," << c.test_len << "," << c.accuracy << "," << c.problems
        << "," << num(c.key_distance, "{}") << "," << num(c.memory_mass, "{}") << "," << num(c.memory_tokens, "{}")
        << "," << num(c.ms_per_answer_token, "{}") << "," << c.reference << "," << num(c.reference_overlap, "{}")
        << "," << num(c.logit_error, "{}") << "," << num(c.recall, "{}") << "," << num(c.scored, "{}") << "," << num(c.build_seconds, "{}") << ","
        << num(c.exact_step_ms, "{}") << "," << num(c.index_step_ms, "{}") << "," << c.seconds << ","
        << num(c.loss, "{}") << "\n";

  // Plots: one data block per row.
  lab::DataBlocks accuracy, latency, search;
  lab::Figure acc_fig{"accuracy_vs_length.png",
                      fmt::format("{}: {} against prompt length (L = {})", text ? "text" : kv ? "key-value" : "pass key",
                                  measure, L),
                      "prompt tokens", measure + " %",
                      {"set logscale x 2", "set yrange [0:105]", "set key outside right"}, {}};
  lab::Figure lat_fig{"latency_vs_memory.png", "memory decoding: time per answer token", "memory tokens per layer",
                      "ms per token", {"set logscale xy"}, {}};
  lab::Figure search_fig{"search_vs_memory.png",
                         "one layer, one token: memory attention, exact scan against FAISS candidates",
                         "memory tokens per layer", "ms per step", {"set logscale xy"}, {}};
  for (const std::string& row : rows) {
    std::vector<std::pair<double, double>> acc_points, lat_points;
    for (int T : lengths)
      if (const MemoryCell* c = find(row, T)) {
        acc_points.push_back({double(T), 100 * c->accuracy});
        if (std::isfinite(c->ms_per_answer_token))
          lat_points.push_back({std::max(1.0, c->memory_tokens), c->ms_per_answer_token});
      }
    acc_fig.series.push_back(lab::data_series("accuracy.dat", accuracy.add(row, acc_points), "linespoints lw 2", row));
    if (row.rfind("memory", 0) == 0)
      lat_fig.series.push_back(lab::data_series("latency.dat", latency.add(row, lat_points), "linespoints lw 2", row));
  }
  // One step's search against the memory's size: the exact scan (from the first index's cells) and each index.
  for (size_t i = 0; i <= index_rows.size() && !index_rows.empty(); ++i) {
    const std::string name = i == 0 ? std::string("exact scan") : index_rows[i - 1];
    std::vector<std::pair<double, double>> points;
    for (int T : lengths) {
      const MemoryCell* c = find(i == 0 ? index_rows[0] : index_rows[i - 1], T);
      const double ms = !c ? std::nan("") : i == 0 ? c->exact_step_ms : c->index_step_ms;
      if (c && std::isfinite(ms)) points.push_back({std::max(1.0, c->memory_tokens), ms});
    }
    search_fig.series.push_back(lab::data_series("search.dat", search.add(name, points), "linespoints lw 2", name));
  }
  lab::write_file_atomic(lab::join_path(spec.out_dir, "accuracy.dat"), accuracy.text());
  if (!index_rows.empty()) lab::write_file_atomic(lab::join_path(spec.out_dir, "search.dat"), search.text());
  lab::write_file_atomic(lab::join_path(spec.out_dir, "latency.dat"), latency.text());
  const int lat_index = latency.size();
  r.plot_problem = lab::run_gnuplot(spec.out_dir, lab::figure_script({acc_fig, lat_fig, search_fig}));
  if (r.plot_problem.empty()) {
    r.plots.push_back(lab::join_path(spec.out_dir, "accuracy_vs_length.png"));
    if (lat_index > 0) r.plots.push_back(lab::join_path(spec.out_dir, "latency_vs_memory.png"));
    if (!index_rows.empty()) r.plots.push_back(lab::join_path(spec.out_dir, "search_vs_memory.png"));
  } else {
    md << "\n(no plots: " << r.plot_problem << ")\n";
  }
  r.report_md = md.str();
  lab::write_file_atomic(lab::join_path(spec.out_dir, "results.csv"), csv.str());
  lab::write_file_atomic(lab::join_path(spec.out_dir, "report.md"), r.report_md);
}

}  // namespace

MemorySpec default_memory_spec() {
  MemorySpec s;
  TrainConfig& t = s.run;
  t.task = "passkey";
  t.model.d_model = 64;
  t.model.n_layers = 2;
  t.model.n_heads = 4;
  // ReRoPE at w = L/2: every key past w sits at w in training, as the memory's rerope policy puts it at any length.
  t.model.encoding.kind = nn::EncodingKind::Rerope;
  t.model.encoding.window = 128;
  t.seq_len = 256;
  t.batch_size = 16;
  t.steps = 2500;   // 100% exact match at L from step 2000 on (from 1500 in another run: docs/tasks.md)
  t.optim.lr = 3e-3;
  t.optim.warmup_steps = 100;
  t.eval_interval = 500;
  t.eval_batches = 2;
  t.eval_problems = 50;
  return s;
}

void validate(const MemorySpec& spec) {
  check(is_memory_task(spec.run.task), "task", spec.run.task, std::string(kMemoryTasks) + " (rotary memory's tasks)");
  const int L = spec.run.seq_len;
  check(!spec.multiples.empty(), "lengths", "(none)", "a list of multiples of L such as 1,8,64,512");
  for (int m : spec.multiples) check(m >= 1 && m <= 4096, "lengths", m, "multiples of L in [1, 4096]");
  check(int64_t(L) * *std::max_element(spec.multiples.begin(), spec.multiples.end()) <= (int64_t(1) << 24), "lengths",
        *std::max_element(spec.multiples.begin(), spec.multiples.end()),
        fmt::format("L x multiple <= 2^24 tokens (L = {})", L));
  lab::check_unique(spec.multiples, "lengths");
  check(!spec.policies.empty() || !spec.baselines.empty() || !spec.indexes.empty(), "policies", "(none)",
        "at least one policy, baseline or index");
  for (const std::string& p : spec.policies)
    check(p == "exact" || p == "rerope" || p == "none" || p == "unlimiformer", "policies", p,
          "exact, rerope, none or unlimiformer (comma-separated)");
  lab::check_unique(spec.policies, "policies");
  for (const std::string& b : spec.baselines)
    if (b != "trained") check_method_name(b, "baselines");
  lab::check_unique(spec.baselines, "baselines");
  check(!spec.top_k.empty() || spec.policies.empty(), "top_k", "(none)", "a list of integers >= 1");
  for (int k : spec.top_k) check(k >= 1 && k <= 65536, "top_k", k, "integers in [1, 65536]");
  lab::check_unique(spec.top_k, "top_k");
  check(spec.full_max_multiple >= 0 && spec.full_max_multiple <= 4096, "full_max", spec.full_max_multiple,
        "a multiple of L in [0, 4096] (0: no baselines)");
  if (spec.checkpoint.empty()) {  // a loaded model's task is checked when it is loaded
    std::vector<int> lengths;
    for (int m : spec.multiples) lengths.push_back(L * m);
    check_test_lengths(spec.run, lengths, L);
  }
  check(spec.window >= 0 && spec.window <= L, "--memory-window", spec.window,
        fmt::format("0 (= L/2) or in [1, L = {}]", L));
  if (spec.checkpoint.empty()) check_memory_window(spec, spec.run.model.encoding, "the model to train");
  check(spec.problems >= 1 && spec.problems <= 100000, "problems", spec.problems, "an integer in [1, 100000]");
  for (const std::string& i : spec.indexes) lab::memory_index_from_name(i, "indexes");
  lab::check_unique(spec.indexes, "indexes");
  check(!spec.top_k.empty() || spec.indexes.empty(), "top_k", "(none)", "a list of integers >= 1");
  check(spec.index_problems >= 1 && spec.index_problems <= 100000, "index_problems", spec.index_problems,
        "an integer in [1, 100000]");
  check(spec.threads >= 0 && spec.threads <= lab::kMaxThreads, "threads", spec.threads,
        "an integer in [0, " + std::to_string(lab::kMaxThreads) + "] (0 = all cores)");
  const nn::EncodingConfig& e = spec.run.model.encoding;
  check(e.kind == nn::EncodingKind::Rope || e.kind == nn::EncodingKind::Rerope || e.kind == nn::EncodingKind::LeakyRerope,
        "encoding.kind", e.kind, "rope, rerope or leaky_rerope (the memory decodes rotary models)");
  check(e.rope.scaling == RopeScaling::None, "encoding.rope.scaling", scaling_name(e.rope.scaling), "none");
  if (spec.checkpoint.empty()) check_baselines(spec.baselines, e.kind, "a model");
  spec.run.validate();
}

MemoryResult run_memory(const MemorySpec& spec_in, bool progress) {
  MemorySpec spec = spec_in;
  if (!spec.checkpoint.empty()) {
    TrainConfig stored;  // a loaded model fixes L
    from_json(read_checkpoint_meta(resolve_checkpoint(spec.checkpoint)).config, stored);
    spec.run.seq_len = stored.seq_len;
  }
  spec.run.out_dir = lab::join_path(spec.out_dir, "model");
  validate(spec);
  const lab::DirectoryLock lock(spec.out_dir, "--out");  // one command at a time trains its model and cells
  lab::remove_stale_temp_files(spec.out_dir);
  const auto t0 = Clock::now();
  MemoryResult result;

  PreparedModel p;
  RunOutcome stopped;
  if (!prepare_model(spec.run, spec.checkpoint, spec.run.task, progress, p, stopped)) {
    result.run =
        RunOutcome::interrupted_by(stopped.signal, stopped.message + "; rerun the same memory command to continue");
    return result;
  }
  p.info.role = p.config.task;  // a --checkpoint's own task, not --task's default
  const std::string who = p.config.task + " model (" + p.info.checkpoint + ")";
  check(is_memory_task(p.config.task), who + " task", p.config.task, kMemoryTasks);
  // A model trained on plain torch ops (fused = false) computes the same function on the fused kernels (tests/nn/
  // test_model.cpp), and the memory decodes through the core's: such a model is rebuilt on them, as the report says.
  if (!p.config.model.fused && p.config.model.attention == nn::AttentionKind::Softmax) {
    p.config.model.fused = true;
    p.model = nn::on_attention_path(p.model, true);
    p.info.description += "; trained on plain torch ops, run here on the fused kernels (the same function)";
  }
  const nn::EncodingConfig& trained = p.config.model.encoding;
  check(trained.kind == nn::EncodingKind::Rope || trained.kind == nn::EncodingKind::Rerope ||
            trained.kind == nn::EncodingKind::LeakyRerope,
        who + " encoding.kind", trained.kind, "rope, rerope or leaky_rerope");
  check_baselines(spec.baselines, trained.kind, who);
  check_memory_window(spec, trained, who);
  use_threads(spec.threads);

  const int L = p.info.train_len;
  const int64_t window = memory_window(spec, L, trained);
  const nn::ModelConfig& mc = p.model->config();
  result.memory_bytes_per_token =
      int64_t(mc.n_layers) *
      (2 * int64_t(mc.kv_heads()) * mc.head_dim() * int64_t(dtype_size(spec.memory_dtype)) + int64_t(sizeof(int64_t)));
  std::vector<int> lengths;
  for (int m : spec.multiples) lengths.push_back(L * m);
  std::sort(lengths.begin(), lengths.end());
  check_test_lengths(p.config, lengths, L);

  std::vector<MemoryCell> plan;
  auto add = [&plan](const std::string& kind, const std::string& name, int top_k, int T) {
    MemoryCell c;
    c.kind = kind, c.name = name, c.top_k = top_k, c.test_len = T;
    plan.push_back(c);
  };
  for (int T : lengths) {
    if (T <= L * spec.full_max_multiple)
      for (const std::string& b : spec.baselines) add("full", b, 0, T);
    for (const std::string& policy : spec.policies)
      for (int k : spec.top_k) add("memory", policy, k, T);
    for (const std::string& index : spec.indexes)
      for (int k : spec.top_k) add("index", index, k, T);
  }
  MemoryCellRunner runner(spec, p, window, progress, int(plan.size()));
  for (const MemoryCell& c : plan) result.cells.push_back(runner.run(c));

  result.model = p.info;
  result.seconds = seconds_since(t0);
  write_report(spec, p.config.task, L, window, lengths, result);
  return result;
}

}  // namespace rotary::experiments
