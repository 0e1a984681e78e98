// lab/experiments/reproduce/run_specs.cpp: the run descriptions of `rotary reproduce`'s studies, per scale.
#include <algorithm>
#include <fmt/format.h>

#include "common/files.h"
#include "experiments/example_runs.h"
#include "experiments/reproduce/study.h"
#include "rotary/error.h"

namespace rotary::experiments {

using namespace train;  // the training engine these experiments run on

namespace {

// The small model every default-scale compare trains (the main job's: docs/lab.md says why one thread per run).
TrainConfig small_run(const std::string& task) {
  TrainConfig c = default_compare_spec().base;
  c.task = task;
  return c;
}

// Smoke: tiny models and a handful of steps - the machinery end to end, not the claims.
void shrink_to_smoke(TrainConfig& c) {
  c.model.d_model = 32;  // head_dim 16: the smallest the fused kernels take (ALiBi and T5 run fused)
  c.model.n_layers = 1;
  c.model.n_heads = 2;
  if (c.model.attention == nn::AttentionKind::Performer) c.model.performer_features = 8;
  c.seq_len = std::min(c.seq_len, 32);
  c.batch_size = 4;
  c.steps = 16;
  c.optim.warmup_steps = 2;
  c.eval_interval = 8;
  c.eval_batches = 1;
  c.eval_problems = c.eval_problems > 0 ? 4 : 0;
  c.threads = 1;
}

// Seed 000's models: the run files users run (examples/runs/seed000-<task>.toml, compiled in), all threads.
TrainConfig seed000_run(const std::string& task) {
  std::string name = "seed000-" + task;
  std::replace(name.begin(), name.end(), '_', '-');
  TrainConfig c = example_run(name);
  c.threads = 0;
  return c;
}

}  // namespace

namespace reproduce {

bool is_scale(const std::string& s, std::string_view name) { return s == name; }

StudyCompare compare_study(const ReproduceSpec& r, const std::string& study) {
  StudyCompare out;
  CompareSpec& s = out.spec;
  s.out_dir = lab::join_path(r.out_dir, study);
  s.rotary_program = r.rotary_program;
  s.jobs = r.jobs;
  s.seeds = 3;
  TrainConfig& c = s.base;
  const bool seed = is_scale(r.scale, "seed"), smoke = is_scale(r.scale, "smoke");
  if (study.rfind("seed000_", 0) == 0) {
    const std::string task = study.substr(8);
    s.encodings = {"rope", "roper"};
    if (seed) {
      c = seed000_run(task);
      s.seeds = 10;
    } else {
      c = small_run(task);
      if (task == "substring_index") c.task_options.max_string = 12;  // ~30 characters a problem, 4 a row
    }
  } else if (study == "seed002_text") {
    s.encodings = {"learned", "t5", "rope", "sinusoidal", "alibi", "roper"};
    c = small_run("text");
    c.task_options.text_tokenizer = "bpe";
    c.eval_problems = 0;
    c.eval_interval = 100;  // the steps-to-loss column reads between evaluations
    c.eval_batches = 4;
    c.steps = 1200;
    if (seed) {
      // GPT-3 small's shape (the seed's 125M models), on our 1M-token corpus rather than OpenWebText2.
      c.model.d_model = 768, c.model.n_layers = 12, c.model.n_heads = 12;
      c.seq_len = 1024, c.batch_size = 32, c.steps = 20000, c.eval_interval = 500;
      c.task_options.text_vocab = 8000;
      c.optim.lr = 6e-4, c.optim.warmup_steps = 1000;
      c.threads = 0;
    }
  } else if (study == "seed002_performer") {
    s.encodings = {"none", "rope"};
    c = small_run("text");
    c.task_options.text_tokenizer = "char";
    c.model.attention = nn::AttentionKind::Performer;
    c.eval_problems = 0;
    c.eval_interval = 100;
    c.eval_batches = 4;
    c.seq_len = 256;
    c.steps = 1000;
    if (seed) {
      // The seed's enwik8 Performers: 8 layers, 512 wide, 8 heads, characters.
      c.model.d_model = 512, c.model.n_layers = 8, c.model.n_heads = 8;
      c.seq_len = 1024, c.batch_size = 16, c.steps = 20000, c.eval_interval = 500;
      c.optim.lr = 1e-3, c.optim.warmup_steps = 1000;
      c.threads = 0;
    }
  } else {
    fail("study", study,
         "a compare study: seed000_addition, seed000_substring_index, seed000_substring_search, seed002_text, "
         "seed002_performer");
  }
  if (smoke) {
    shrink_to_smoke(c);
    s.seeds = 2;
  }
  if (!r.cache_dir.empty()) c.task_options.cache_dir = r.cache_dir;
  c.out_dir = s.out_dir;
  out.note = smoke ? "smoke scale (tiny models, 16 steps): checks the machinery, not the claim"
                   : fmt::format("d_model {} x {} layers, {} steps, batch {} x {}, {} seeds", c.model.d_model,
                                 c.model.n_layers, c.steps, c.batch_size, c.seq_len, s.seeds);
  return out;
}

}  // namespace reproduce

using reproduce::compare_study;
using reproduce::is_scale;

ExtrapolateSpec reproduce_extrapolate_spec(const ReproduceSpec& r) {
  ExtrapolateSpec e = default_extrapolate_spec();
  e.out_dir = lab::join_path(r.out_dir, "seed004_extrapolate");
  if (is_scale(r.scale, "smoke")) {
    shrink_to_smoke(e.text);
    e.multiples = {1, 2};
    e.windows = 2;
    e.batch_size = 2;
    e.problems = 2;
  } else if (is_scale(r.scale, "seed")) {
    // The seed's 100M model trained at 512 and tested at 4096 (8L).
    TrainConfig& t = e.text;
    t.model.d_model = 768, t.model.n_layers = 12, t.model.n_heads = 12;
    t.seq_len = 512, t.batch_size = 32, t.steps = 20000, t.eval_interval = 1000;
    t.optim.lr = 6e-4, t.optim.warmup_steps = 1000;
    t.threads = 0;
    e.windows = 64;
  }
  if (!r.cache_dir.empty()) e.text.task_options.cache_dir = e.kv.task_options.cache_dir = r.cache_dir;
  e.text.out_dir = lab::join_path(e.out_dir, "text_model");
  e.kv.out_dir = lab::join_path(e.out_dir, "kv_model");
  return e;
}

MemorySpec reproduce_memory_spec(const ReproduceSpec& r) {
  MemorySpec m = default_memory_spec();
  m.out_dir = lab::join_path(r.out_dir, "seed001_memory");
  if (is_scale(r.scale, "smoke")) {
    TrainConfig& t = m.run;
    t.model.d_model = 32, t.model.n_layers = 1, t.model.n_heads = 2;
    t.seq_len = 128, t.model.encoding.window = 64;  // the passkey problem needs ~100 characters
    t.batch_size = 2, t.steps = 16, t.optim.warmup_steps = 2;
    t.eval_interval = 8, t.eval_batches = 1, t.eval_problems = 2;
    t.threads = 1;
    m.multiples = {1, 2};
    m.full_max_multiple = 2;
    m.problems = 2;
    m.indexes = {};
  } else if (is_scale(r.scale, "seed")) {
    m.problems = 50;  // the default model: seed 001 names no model, only the problem (multiples 1, 8, 64, 512)
  } else {
    m.multiples = {1, 8, 64};
    m.indexes = {};  // the approximate indexes on this model's keys: `rotary memory` (docs/memory.md)
  }
  return m;
}

CompareSpec reproduce_compare_spec(const ReproduceSpec& r, const std::string& study) {
  return compare_study(r, study).spec;
}

}  // namespace rotary::experiments
