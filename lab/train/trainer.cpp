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
#include "common/progress.h"
#include "train/schedule.h"

// OpenBLAS's thread count (cblas.h; declared here, weak, so the lab does not need OpenBLAS's headers or library).
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace rotary::train {

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

namespace {

// The task of `config`, with the model's vocabulary taken from it and every setting checked against it and against
// `options` (rotary::Error naming the setting).
std::unique_ptr<lab::Task> checked_task(TrainConfig& config, const TrainOptions& options, int world) {
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
  return task;
}

// What a checkpoint saves and restores: the model, the AdamW state, the data RNG and the updates done.
struct TrainingState {
  nn::Transformer model;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::mt19937_64 data_rng;
  int64_t step = 0;
};

// The state of a run's start: the model initialised from the config's seed (torch's generator seeded first).
TrainingState initial_state(const TrainConfig& config) {
  torch::manual_seed(config.seed);
  TrainingState s{nn::Transformer(config.model), nullptr, std::mt19937_64(config.seed), 0};
  s.model->train();
  s.optimizer = make_optimizer(s.model, config.optim);
  return s;
}

// The resume policy: whether train() continues the run whose checkpoint is `ckpt` (true) or starts one. rotary::Error
// when options.resume contradicts what out_dir holds. Rank 0 first removes the temporary files of a run killed
// while it wrote one.
bool resumes_run(const TrainConfig& config, const TrainOptions& options, const std::string& ckpt, bool leader) {
  if (leader) lab::remove_stale_temp_files(config.out_dir);
  const bool have_ckpt = lab::file_exists(ckpt);
  if (options.resume == ResumeMode::Required && !have_ckpt)
    throw Error("rotary: nothing to resume: no checkpoint at " + ckpt);
  if (options.resume == ResumeMode::Never && have_ckpt && !options.overwrite)
    throw Error("rotary: " + config.out_dir + " already holds a run (" + ckpt +
                "); use --resume to continue it, --overwrite to start it again, or another --out");
  return have_ckpt && options.resume != ResumeMode::Never;
}

// Continues from `ckpt`: model, optimizer, torch's generator, data RNG and step as they were saved. rotary::Error
// for the checkpoint of a run with other settings.
void restore_checkpoint(TrainingState& s, const std::string& ckpt, const nlohmann::json& config_json) {
  CheckpointMeta meta = read_checkpoint_meta(ckpt);
  check_config_matches(ckpt, meta.config, config_json);
  meta = load_checkpoint(ckpt, *s.model, s.optimizer.get(), /*restore_torch_rng=*/true);
  s.data_rng = rng_from_text(meta.data_rng);
  s.step = meta.step;
}

// Every rank starts from rank 0's parameters (they agree already through the seed; this guards against a rank that
// did not). Nothing without a data-parallel group.
void broadcast_parameters(nn::Transformer& model, Communicator* comm) {
  if (!comm) return;
  torch::NoGradGuard no_grad;
  for (torch::Tensor& p : model->parameters()) comm->broadcast(p, 0);
}

// The run's checkpoint file: rank 0 writes it; every rank remembers the step last saved.
class CheckpointSaver {
 public:
  CheckpointSaver(std::string path, const nlohmann::json& config_json, bool leader, int64_t saved_step)
      : path_(std::move(path)), config_json_(config_json), leader_(leader), saved_step_(saved_step) {}

  void save(TrainingState& s) {
    if (leader_) {
      CheckpointMeta meta;
      meta.step = s.step;
      meta.config = config_json_;
      meta.data_rng = rng_to_text(s.data_rng);
      save_checkpoint(path_, meta, *s.model, s.optimizer.get());
    }
    saved_step_ = s.step;
  }
  const std::string& path() const { return path_; }
  int64_t saved_step() const { return saved_step_; }  // -1: nothing saved yet

 private:
  std::string path_;
  const nlohmann::json& config_json_;
  bool leader_;
  int64_t saved_step_;
};

// Rank 0's outputs of a run: config.json, the metrics files (continued after the resumed step) and the progress
// bar; the messages of every rank go through say().
class RunOutputs {
 public:
  RunOutputs(const TrainConfig& config, const nlohmann::json& config_json, const TrainOptions& options, bool leader,
             bool resuming, int64_t step)
      : label_(options.label), leader_(leader), show_progress_(options.progress) {
    if (!leader) return;
    lab::make_dirs(config.out_dir);
    lab::write_file_atomic(lab::join_path(config.out_dir, "config.json"), config_json.dump(2) + "\n");
    metrics_ = std::make_unique<MetricsWriter>(config.out_dir, resuming ? step : -1);
    progress_ = std::make_unique<lab::Progress>(config.steps, step, options.progress);
    if (resuming) say(fmt::format("resuming {} at step {}", config.out_dir, step));
  }

  // A message of the run, after its label: through the progress bar on rank 0.
  void say(const std::string& text) {
    const std::string line = label_.empty() ? text : label_ + ": " + text;
    if (progress_) progress_->message(line);
    else if (leader_ && show_progress_) std::fprintf(stderr, "%s\n", line.c_str());
  }
  // Rank 0: the step's metrics row appended and the progress bar moved on.
  void record(const MetricsRow& row) {
    if (!leader_) return;
    metrics_->append(row);
    progress_->update(row.step, row.loss, row.tokens_per_s);
  }
  void finish_progress() {
    if (progress_) progress_->finish();
  }

 private:
  std::string label_;
  bool leader_, show_progress_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<lab::Progress> progress_;
};

// One step's gradients before its update is applied: the loss (each rank's share, summed over the ranks), the
// gradients and their global norm, and whether any rank was asked to stop.
struct StepGradients {
  std::vector<torch::Tensor> grads;
  double loss = 0, grad_norm = 0;
  bool stop = false;
};

// The loop of train(): one update a step until config.steps, a checkpoint every checkpoint_interval (or
// eval_interval) steps, an evaluation every eval_interval steps and at the end; it stops early, saving, when a
// signal (or the test hook) asks, and without saving when the loss or gradient norm is not finite.
class TrainingLoop {
 public:
  TrainingLoop(const TrainConfig& config, const nlohmann::json& config_json, const TrainOptions& options,
               const lab::Task& task, TrainingState& state, CheckpointSaver& checkpoint, RunOutputs& outputs)
      : config_(config), config_json_(config_json), options_(options), task_(task), state_(state),
        checkpoint_(checkpoint), outputs_(outputs), rank_(options.comm ? options.comm->rank() : 0),
        world_(options.comm ? options.comm->world_size() : 1), leader_(rank_ == 0),
        schedule_{config.optim.lr, config.optim.warmup_steps, config.steps, config.optim.min_lr_ratio} {}

  TrainResult run() {
    const int64_t ckpt_every = config_.checkpoint_interval > 0 ? config_.checkpoint_interval : config_.eval_interval;
    run_start_ = Clock::now();
    StopSignalGuard signals;
    int64_t& step = state_.step;
    while (step < config_.steps) {
      const auto step_start = Clock::now();
      const double lr = schedule_.at(step);
      set_lr(*state_.optimizer, lr);
      StepGradients g = gradients_of_step();
      if (!std::isfinite(g.loss) || !std::isfinite(g.grad_norm)) return non_finite(g);
      apply_update(g);
      record_step(g, lr, step_start);
      if (g.stop) return interrupted();
      if (step != config_.steps && ckpt_every > 0 && step % ckpt_every == 0) checkpoint_.save(state_);
    }
    return finished();
  }

 private:
  // Draws the global batch, runs forward and backward on this rank's rows and sums over the ranks.
  StepGradients gradients_of_step() {
    const int64_t step = state_.step;
    nn::Transformer& model = state_.model;
    // Performer: fresh random features every performer_redraw steps, drawn from (seed, step) so every rank and a
    // resumed run draw the same ones (the current draw is a buffer of the model, saved in the checkpoint).
    const int64_t redraw =
        config_.model.attention == nn::AttentionKind::Performer ? config_.model.performer_redraw : 0;
    if (redraw > 0 && step > 0 && step % redraw == 0)
      model->redraw_performer_features(config_.seed * 0x9e3779b97f4a7c15ULL + uint64_t(step));

    // Every rank draws the whole global batch (so the data RNG state is the same everywhere and does not depend
    // on the number of ranks), then keeps its own rows.
    const size_t rows_per_rank = static_cast<size_t>(config_.batch_size / world_);
    std::vector<lab::TrainSequence> rows;
    rows.reserve(static_cast<size_t>(config_.batch_size));
    for (int i = 0; i < config_.batch_size; ++i) rows.push_back(task_.train_sequence(state_.data_rng, config_.seq_len));
    double mask_total = 0;
    for (const auto& r : rows)
      for (float w : r.loss_mask) mask_total += w;
    Batch batch = make_batch(rows, config_.seq_len, rows_per_rank * static_cast<size_t>(rank_), rows_per_rank);

    state_.optimizer->zero_grad();
    // This rank's share of the global masked mean: sum over its rows / weight of the whole global batch.
    torch::Tensor loss = (token_losses(model, batch) * batch.mask).sum() / std::max(mask_total, 1.0);
    loss.backward();
    StepGradients g;
    g.loss = loss.item<double>();
    // The test hook stands in for a signal arriving during this step.
    if (options_.stop_after_step >= 0 && step + 1 >= options_.stop_after_step && !stop_requested())
      lab::request_stop(-1);
    double stop_flag = stop_requested() ? 1.0 : 0.0;
    g.grads = gradients(model);
    if (options_.comm) all_reduce_step(*options_.comm, g.grads, g.loss, stop_flag);
    g.grad_norm = global_norm(g.grads);
    g.stop = stop_flag > 0;
    return g;
  }

  // Clips the gradients to optim.grad_clip and takes the optimizer's step.
  void apply_update(StepGradients& g) {
    if (config_.optim.grad_clip > 0 && g.grad_norm > config_.optim.grad_clip) {
      const double scale = config_.optim.grad_clip / (g.grad_norm + 1e-6);
      for (torch::Tensor& grad : g.grads) grad.mul_(scale);
    }
    state_.optimizer->step();
    ++state_.step;
  }

  // The step's metrics row (with an evaluation on rank 0 every eval_interval steps and at the end), recorded.
  void record_step(const StepGradients& g, double lr, Clock::time_point step_start) {
    const int64_t step = state_.step;
    MetricsRow row;
    row.step = step;
    row.loss = g.loss;
    row.lr = lr;
    row.grad_norm = g.grad_norm;
    const double tokens_per_step = static_cast<double>(config_.batch_size) * config_.seq_len;
    row.tokens_per_s = tokens_per_step / std::max(seconds_since(step_start), 1e-9);
    const bool last = step == config_.steps;
    if (leader_ && (last || (config_.eval_interval > 0 && step % config_.eval_interval == 0))) {
      Evaluation e = evaluate(state_.model, task_, config_);
      row.eval_loss = e.loss;
      row.eval_accuracy = e.accuracy;
      std::string text = fmt::format("step {}: eval loss {:.4f}", step, e.loss.value_or(NAN));
      if (e.accuracy)
        text += fmt::format(", exact match {:.1f}% (greedy, {} problems)", 100 * *e.accuracy, config_.eval_problems);
      outputs_.say(text);
    }
    row.elapsed_s = seconds_since(run_start_);
    outputs_.record(row);
  }

  // The run stops without applying the step's update; rank 0 writes a summary that marks it diverged, so `compare`
  // counts it as a failed session instead of rerunning it.
  TrainResult non_finite(const StepGradients& g) {
    const int64_t step = state_.step;
    const int64_t saved = checkpoint_.saved_step();
    const std::string kept =
        saved >= 0 ? fmt::format("the last good checkpoint (step {}) is kept at {}", saved, checkpoint_.path())
                   : std::string("no checkpoint was saved yet");
    TrainResult r;
    r.status = TrainStatus::NonFinite;
    r.step = step;
    r.message = fmt::format("non-finite {} ({}) at step {}: the run stops without applying that update; {}",
                            std::isfinite(g.loss) ? "gradient norm" : "loss",
                            std::isfinite(g.loss) ? g.grad_norm : g.loss, step + 1, kept);
    outputs_.finish_progress();
    if (leader_) {
      RunSummary s;
      s.status = "non_finite";
      s.steps = step;
      s.seconds = seconds_since(run_start_);
      s.final_train_loss = NAN;
      s.config = config_json_;
      write_summary(config_.out_dir, s);
    }
    return r;
  }

  // Saved at the end of the step a stop was asked in; no rank exits before rank 0's checkpoint is on disk.
  TrainResult interrupted() {
    checkpoint_.save(state_);
    if (options_.comm) options_.comm->barrier();
    outputs_.finish_progress();
    TrainResult r;
    r.status = TrainStatus::Interrupted;
    r.step = state_.step;
    r.signal = std::max(0, stop_signal());
    r.message = fmt::format("interrupted: checkpoint saved at step {} in {}; continue with --resume", state_.step,
                            checkpoint_.path());
    return r;
  }

  // The last checkpoint and, on rank 0, summary.json.
  TrainResult finished() {
    if (checkpoint_.saved_step() != state_.step) checkpoint_.save(state_);
    outputs_.finish_progress();
    TrainResult result;
    result.status = TrainStatus::Finished;
    result.step = state_.step;
    if (leader_) {
      result.summary = finished_summary();
      write_summary(config_.out_dir, *result.summary);
    }
    if (options_.comm) options_.comm->barrier();
    return result;
  }

  // The finished run's summary: the mean training loss of the last 5% of the steps, the last evaluation and the
  // sampled exact match.
  RunSummary finished_summary() {
    RunSummary s;
    s.steps = state_.step;
    s.seconds = seconds_since(run_start_);
    s.config = config_json_;
    const std::vector<MetricsRow> rows = read_metrics(lab::join_path(config_.out_dir, "metrics.jsonl"));
    const size_t tail = std::max<size_t>(1, rows.size() / 20);
    double sum = 0;
    for (size_t i = rows.size() - std::min(tail, rows.size()); i < rows.size(); ++i) sum += rows[i].loss;
    s.final_train_loss = rows.empty() ? NAN : sum / static_cast<double>(std::min(tail, rows.size()));
    if (!rows.empty()) {
      s.eval_loss = rows.back().eval_loss;
      s.accuracy_greedy = rows.back().eval_accuracy;
    }
    if (config_.eval_problems > 0) {
      // Seed 000 reports accuracy "with random sampling"; greedy is the stricter, deterministic view.
      Accuracy a = exact_match(state_.model, task_, config_.eval_problems, config_.eval_seed, 1.0, config_.eval_seed);
      if (a.total > 0) s.accuracy_sampled = a.value();
      s.problems = a.total;
    }
    return s;
  }

  const TrainConfig& config_;
  const nlohmann::json& config_json_;
  const TrainOptions& options_;
  const lab::Task& task_;
  TrainingState& state_;
  CheckpointSaver& checkpoint_;
  RunOutputs& outputs_;
  const int rank_, world_;
  const bool leader_;
  const LrSchedule schedule_;
  Clock::time_point run_start_;
};

}  // namespace

TrainResult train(TrainConfig config, const TrainOptions& options) {
  const int world = options.comm ? options.comm->world_size() : 1;
  const bool leader = !options.comm || options.comm->rank() == 0;
  const std::unique_ptr<lab::Task> task = checked_task(config, options, world);
  const nlohmann::json config_json = config;

  use_threads(config.threads, world);
  TrainingState state = initial_state(config);
  const std::string ckpt = checkpoint_path(config.out_dir);
  const bool resuming = resumes_run(config, options, ckpt, leader);
  if (resuming) restore_checkpoint(state, ckpt, config_json);
  else if (!config.init_from.empty()) start_from_run(state.model, config.init_from);
  broadcast_parameters(state.model, options.comm);

  RunOutputs outputs(config, config_json, options, leader, resuming, state.step);
  CheckpointSaver checkpoint(ckpt, config_json, leader, resuming ? state.step : -1);
  return TrainingLoop(config, config_json, options, *task, state, checkpoint, outputs).run();
}

}  // namespace rotary::train
