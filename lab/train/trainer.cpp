// lab/train/trainer.cpp
#include "train/trainer.h"

#include <omp.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "common/files.h"
#include "rotary/error.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/schedule.h"

// OpenBLAS's thread count (cblas.h; declared here, weak, so the lab does not need OpenBLAS's headers or library).
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace rotary::train {
namespace {

std::atomic<int> g_stop_signal{0};

void on_stop_signal(int sig) { g_stop_signal.store(sig); }

}  // namespace

StopSignalGuard::StopSignalGuard() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls (gloo sockets, file writes) carry on; the loop reads the flag
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
}

StopSignalGuard::~StopSignalGuard() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::unique_ptr<torch::optim::AdamW> make_optimizer(nn::Transformer& model, const OptimConfig& o) {
  // Decoupled weight decay on matrices (projections, embeddings) only: decaying norm gains and biases towards 0
  // only hurts.
  std::vector<torch::Tensor> decay, no_decay;
  for (const torch::Tensor& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto opts = [&](double wd) {
    return torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(wd);
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(opts(o.weight_decay)));
  if (!no_decay.empty()) groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(opts(0.0)));
  return std::make_unique<torch::optim::AdamW>(groups, opts(o.weight_decay));
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
}

// Gradients of all parameters (zeros where a parameter got none, so every rank's buffer has the same layout).
std::vector<torch::Tensor> gradients(nn::Transformer& model) {
  std::vector<torch::Tensor> grads;
  for (torch::Tensor& p : model->parameters()) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  return grads;
}

// Sums gradients and the two scalars (this rank's share of the loss, its stop flag) over the ranks, in one
// all-reduce of a flat buffer.
void all_reduce_step(Communicator& comm, std::vector<torch::Tensor>& grads, double& loss, double& stop) {
  std::vector<torch::Tensor> flat_parts;
  for (const torch::Tensor& g : grads) flat_parts.push_back(g.reshape({-1}).to(torch::kFloat32));
  flat_parts.push_back(torch::tensor({static_cast<float>(loss), static_cast<float>(stop)}, torch::kFloat32));
  torch::Tensor flat = torch::cat(flat_parts);  // [n_params + 2]
  comm.all_reduce_sum(flat);
  int64_t offset = 0;
  for (torch::Tensor& g : grads) {
    const int64_t n = g.numel();
    g.copy_(flat.slice(0, offset, offset + n).view(g.sizes()));
    offset += n;
  }
  loss = flat[offset].item<double>();
  stop = flat[offset + 1].item<double>();
}

double global_norm(const std::vector<torch::Tensor>& grads) {
  double sq = 0;
  for (const torch::Tensor& g : grads) sq += g.to(torch::kFloat64).pow(2).sum().item<double>();
  return std::sqrt(sq);
}

struct Evaluation {
  std::optional<double> loss, accuracy;
};

// The curriculum start (TrainConfig::init_from): every parameter of `model` copied from the run at `where`, which
// must have the same parameters by name and shape (its encoding, attention path and task may differ).
void start_from_run(nn::Transformer& model, const std::string& where) {
  TrainedModel source;
  try {
    source = load_trained_model(where);
  } catch (const Error& e) {
    throw Error(std::string("rotary: init_from = ") + where + ": " + e.what());
  }
  auto from = source.model->named_parameters();
  auto to = model->named_parameters();
  const std::string same = "a run whose model has this model's parameters, by name and shape";
  for (const auto& p : to) {
    const torch::Tensor* s = from.find(p.key());
    check(s != nullptr, "init_from", where + " (its model has no " + p.key() + ")", same);
    check(s->sizes() == p.value().sizes(), "init_from",
          fmt::format("{} (its {} is {}, this model's {})", where, p.key(), fmt::join(s->sizes(), "x"),
                      fmt::join(p.value().sizes(), "x")),
          same);
  }
  check(from.size() == to.size(), "init_from",
        fmt::format("{} (its model has {} parameters, this one {})", where, from.size(), to.size()), same);
  torch::NoGradGuard no_grad;
  for (auto& p : to) p.value().copy_(from[p.key()]);
}

Evaluation evaluate(nn::Transformer& model, const lab::Task& task, const TrainConfig& c) {
  Evaluation e;
  if (c.eval_batches > 0)
    e.loss = heldout_loss(model, task, c.seq_len, c.eval_batches * c.batch_size, c.batch_size, c.eval_seed).loss;
  if (c.eval_problems > 0) {
    Accuracy a = exact_match(model, task, c.eval_problems, c.eval_seed, 0.0, c.eval_seed);
    if (a.total > 0) e.accuracy = a.value();
  }
  return e;
}

}  // namespace

bool stop_requested() { return g_stop_signal.load() != 0; }
int stop_signal() { return g_stop_signal.load(); }
void clear_stop_request() { g_stop_signal.store(0); }

int resolve_threads(int requested, int processes) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return requested > 0 ? requested : std::max(1, cores / std::max(1, processes));
}

int use_threads(int requested, int processes) {
  const int n = resolve_threads(requested, processes);
  torch::set_num_threads(n);
  omp_set_num_threads(n);
  // Debian's libtorch does its matrix products in OpenBLAS, whose own pthread pool ignores both settings above and
  // keeps one thread per core spinning in sched_yield between calls: at --threads 1 a run still used both cores
  // (measured: 10 s user + 6 s system time in 8.3 s wall), so two runs side by side (compare --jobs) fought each
  // other. Weak: a libtorch built on another BLAS has no such function, and then there is nothing to set.
  if (openblas_set_num_threads) openblas_set_num_threads(n);
  return n;
}

std::string checkpoint_path(const std::string& out_dir) { return lab::join_path(out_dir, "checkpoint.pt"); }

TrainResult train(TrainConfig config, const TrainOptions& options) {
  const int rank = options.comm ? options.comm->rank() : 0;
  const int world = options.comm ? options.comm->world_size() : 1;
  const bool leader = rank == 0;
  const std::string& label = options.label;
  auto say = [&](Progress* p, const std::string& text) {
    const std::string line = label.empty() ? text : label + ": " + text;
    if (p) p->message(line);
    else if (leader && options.progress) std::fprintf(stderr, "%s\n", line.c_str());
  };

  std::unique_ptr<lab::Task> task = lab::make_task(config.task, config.task_options);
  const int vocab = task->vocab().size();
  check(config.model.vocab_size == 0 || config.model.vocab_size == vocab, "model.vocab_size", config.model.vocab_size,
        "0 or the vocabulary size of task " + config.task + " (" + std::to_string(vocab) + ")");
  config.model.vocab_size = vocab;
  config.validate();
  check_positions_suffice(config.model, *task, config.seq_len, config.eval_problems, config.eval_seed);
  check(!(options.resume == ResumeMode::Required && options.overwrite), "overwrite", "true",
        "false when resuming (resume continues the run in out_dir; overwrite starts it again)");
  check(config.batch_size % world == 0, "batch_size", config.batch_size,
        "a multiple of the number of data-parallel processes (" + std::to_string(world) + ")");
  const nlohmann::json config_json = config;

  use_threads(config.threads, world);

  torch::manual_seed(config.seed);
  nn::Transformer model(config.model);
  model->train();
  std::unique_ptr<torch::optim::AdamW> optimizer = make_optimizer(model, config.optim);
  std::mt19937_64 data_rng(config.seed);
  int64_t step = 0;

  const std::string ckpt = checkpoint_path(config.out_dir);
  if (leader) lab::remove_stale_temp_files(config.out_dir);  // left by a run killed while it wrote a file
  const bool have_ckpt = lab::file_exists(ckpt);
  if (options.resume == ResumeMode::Required && !have_ckpt)
    throw Error("rotary: nothing to resume: no checkpoint at " + ckpt);
  if (options.resume == ResumeMode::Never && have_ckpt && !options.overwrite)
    throw Error("rotary: " + config.out_dir + " already holds a run (" + ckpt +
                "); use --resume to continue it, --overwrite to start it again, or another --out");
  const bool resuming = have_ckpt && options.resume != ResumeMode::Never;
  if (resuming) {
    CheckpointMeta meta = read_checkpoint_meta(ckpt);
    check_config_matches(ckpt, meta.config, config_json);
    meta = load_checkpoint(ckpt, *model, optimizer.get(), /*restore_torch_rng=*/true);
    data_rng = rng_from_text(meta.data_rng);
    step = meta.step;
  } else if (!config.init_from.empty()) {
    start_from_run(model, config.init_from);
  }
  // Every rank starts from rank 0's parameters (they agree already through the seed; this guards against a rank
  // that did not).
  if (options.comm) {
    torch::NoGradGuard no_grad;
    for (torch::Tensor& p : model->parameters()) options.comm->broadcast(p, 0);
  }

  std::unique_ptr<MetricsWriter> metrics;
  std::unique_ptr<Progress> progress;
  if (leader) {
    lab::make_dirs(config.out_dir);
    lab::write_file_atomic(lab::join_path(config.out_dir, "config.json"), config_json.dump(2) + "\n");
    metrics = std::make_unique<MetricsWriter>(config.out_dir, resuming ? step : -1);
    progress = std::make_unique<Progress>(config.steps, step, options.progress);
    if (resuming) say(progress.get(), fmt::format("resuming {} at step {}", config.out_dir, step));
  }

  const LrSchedule schedule{config.optim.lr, config.optim.warmup_steps, config.steps, config.optim.min_lr_ratio};
  const int64_t ckpt_every = config.checkpoint_interval > 0 ? config.checkpoint_interval : config.eval_interval;
  const size_t rows_per_rank = static_cast<size_t>(config.batch_size / world);
  const double tokens_per_step = static_cast<double>(config.batch_size) * config.seq_len;
  int64_t saved_step = resuming ? step : -1;
  const auto run_start = Clock::now();
  StopSignalGuard signals;

  auto save = [&]() {
    if (leader) {
      CheckpointMeta meta;
      meta.step = step;
      meta.config = config_json;
      meta.data_rng = rng_to_text(data_rng);
      save_checkpoint(ckpt, meta, *model, optimizer.get());
    }
    saved_step = step;
  };

  while (step < config.steps) {
    const auto step_start = Clock::now();
    const double lr = schedule.at(step);
    set_lr(*optimizer, lr);
    // Performer: fresh random features every performer_redraw steps, drawn from (seed, step) so every rank and a
    // resumed run draw the same ones (the current draw is a buffer of the model, saved in the checkpoint).
    const int64_t redraw = config.model.attention == nn::AttentionKind::Performer ? config.model.performer_redraw : 0;
    if (redraw > 0 && step > 0 && step % redraw == 0)
      model->redraw_performer_features(config.seed * 0x9e3779b97f4a7c15ULL + uint64_t(step));

    // Every rank draws the whole global batch (so the data RNG state is the same everywhere and does not depend
    // on the number of ranks), then keeps its own rows.
    std::vector<lab::TrainSequence> rows;
    rows.reserve(static_cast<size_t>(config.batch_size));
    for (int i = 0; i < config.batch_size; ++i) rows.push_back(task->train_sequence(data_rng, config.seq_len));
    double mask_total = 0;
    for (const auto& r : rows)
      for (float w : r.loss_mask) mask_total += w;
    Batch batch = make_batch(rows, config.seq_len, rows_per_rank * static_cast<size_t>(rank), rows_per_rank);

    optimizer->zero_grad();
    // This rank's share of the global masked mean: sum over its rows / weight of the whole global batch.
    torch::Tensor loss = (token_losses(model, batch) * batch.mask).sum() / std::max(mask_total, 1.0);
    loss.backward();
    double loss_value = loss.item<double>();
    // The test hook stands in for a signal arriving during this step.
    if (options.stop_after_step >= 0 && step + 1 >= options.stop_after_step && !stop_requested()) g_stop_signal.store(-1);
    double stop_flag = stop_requested() ? 1.0 : 0.0;
    std::vector<torch::Tensor> grads = gradients(model);
    if (options.comm) all_reduce_step(*options.comm, grads, loss_value, stop_flag);
    const double grad_norm = global_norm(grads);

    if (!std::isfinite(loss_value) || !std::isfinite(grad_norm)) {
      const std::string kept = saved_step >= 0 ? fmt::format("the last good checkpoint (step {}) is kept at {}", saved_step, ckpt)
                                               : std::string("no checkpoint was saved yet");
      TrainResult r;
      r.status = TrainStatus::NonFinite;
      r.step = step;
      r.message = fmt::format("non-finite {} ({}) at step {}: the run stops without applying that update; {}",
                              std::isfinite(loss_value) ? "gradient norm" : "loss",
                              std::isfinite(loss_value) ? grad_norm : loss_value, step + 1, kept);
      if (progress) progress->finish();
      if (leader) {
        // Marks the run as done (diverged), so `compare` counts it as a failed session instead of rerunning it.
        RunSummary s;
        s.status = "non_finite";
        s.steps = step;
        s.seconds = seconds_since(run_start);
        s.final_train_loss = NAN;
        s.config = config_json;
        write_summary(config.out_dir, s);
      }
      return r;
    }
    if (config.optim.grad_clip > 0 && grad_norm > config.optim.grad_clip) {
      const double scale = config.optim.grad_clip / (grad_norm + 1e-6);
      for (torch::Tensor& g : grads) g.mul_(scale);
    }
    optimizer->step();
    ++step;

    MetricsRow row;
    row.step = step;
    row.loss = loss_value;
    row.lr = lr;
    row.grad_norm = grad_norm;
    row.tokens_per_s = tokens_per_step / std::max(seconds_since(step_start), 1e-9);
    const bool last = step == config.steps;
    if (leader && (last || (config.eval_interval > 0 && step % config.eval_interval == 0))) {
      Evaluation e = evaluate(model, *task, config);
      row.eval_loss = e.loss;
      row.eval_accuracy = e.accuracy;
      std::string text = fmt::format("step {}: eval loss {:.4f}", step, e.loss.value_or(NAN));
      if (e.accuracy) text += fmt::format(", exact match {:.1f}% (greedy, {} problems)", 100 * *e.accuracy, config.eval_problems);
      say(progress.get(), text);
    }
    row.elapsed_s = seconds_since(run_start);
    if (leader) {
      metrics->append(row);
      progress->update(step, loss_value, row.tokens_per_s);
    }

    if (stop_flag > 0) {
      save();
      if (options.comm) options.comm->barrier();  // no rank exits before rank 0's checkpoint is on disk
      if (progress) progress->finish();
      TrainResult r;
      r.status = TrainStatus::Interrupted;
      r.step = step;
      r.signal = std::max(0, stop_signal());
      r.message = fmt::format("interrupted: checkpoint saved at step {} in {}; continue with --resume", step, ckpt);
      return r;
    }
    if (!last && ckpt_every > 0 && step % ckpt_every == 0) save();
  }
  if (saved_step != step) save();
  if (progress) progress->finish();

  TrainResult result;
  result.status = TrainStatus::Finished;
  result.step = step;
  if (leader) {
    RunSummary s;
    s.steps = step;
    s.seconds = seconds_since(run_start);
    s.config = config_json;
    const std::vector<MetricsRow> rows = read_metrics(lab::join_path(config.out_dir, "metrics.jsonl"));
    const size_t tail = std::max<size_t>(1, rows.size() / 20);
    double sum = 0;
    for (size_t i = rows.size() - std::min(tail, rows.size()); i < rows.size(); ++i) sum += rows[i].loss;
    s.final_train_loss = rows.empty() ? NAN : sum / static_cast<double>(std::min(tail, rows.size()));
    if (!rows.empty()) {
      s.eval_loss = rows.back().eval_loss;
      s.accuracy_greedy = rows.back().eval_accuracy;
    }
    if (config.eval_problems > 0) {
      // Seed 000 reports accuracy "with random sampling"; greedy is the stricter, deterministic view.
      Accuracy a = exact_match(model, *task, config.eval_problems, config.eval_seed, 1.0, config.eval_seed);
      if (a.total > 0) s.accuracy_sampled = a.value();
      s.problems = a.total;
    }
    write_summary(config.out_dir, s);
    result.summary = s;
  }
  if (options.comm) options.comm->barrier();
  return result;
}

}  // namespace rotary::train
