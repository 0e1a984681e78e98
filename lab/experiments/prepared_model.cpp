// lab/experiments/prepared_model.cpp
#include "experiments/prepared_model.h"

#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <optional>

#include "rotary/error.h"
#include "rotary/json_guard.h"
#include "train/checkpoint.h"
#include "train/summary.h"
#include "train/trainer.h"

namespace rotary::experiments {

using namespace train;

bool prepare_model(const TrainConfig& run, const std::string& checkpoint, const std::string& role, bool progress,
                   PreparedModel& out, RunOutcome& stopped) {
  std::string path = checkpoint;
  out.info.role = role;
  out.info.heldout_loss = std::nan("");
  if (path.empty()) {
    std::optional<RunSummary> done = read_summary(run.out_dir);
    if (done) {
      nlohmann::json want = run;
      if (want["model"].value("vocab_size", 0) == 0 && done->config.contains("model"))
        want["model"]["vocab_size"] = done->config["model"].value("vocab_size", 0);
      const std::string field = first_difference(done->config, want);
      if (!field.empty())
        throw Error("rotary: " + run.out_dir + " holds a finished run with different settings: " + field + " = " +
                    value_at(done->config, field) + " there, " + value_at(want, field) +
                    " here; use another --out (or delete that directory)");
      if (progress) std::fprintf(stderr, "%s model: finished earlier (%s), reused\n", role.c_str(), run.out_dir.c_str());
    } else {
      if (progress) std::fprintf(stderr, "%s model: training in %s\n", role.c_str(), run.out_dir.c_str());
      TrainOptions opts;
      opts.resume = ResumeMode::IfPresent;
      opts.progress = progress;
      opts.label = role + " model";
      TrainResult r = train::train(run, opts);
      if (r.status == TrainStatus::Interrupted) {
        stopped = RunOutcome::interrupted_by(r.signal, r.message);
        return false;
      }
      if (r.status == TrainStatus::NonFinite) throw Error("rotary: the " + role + " model diverged: " + r.message);
      done = r.summary;
    }
    out.info.train_seconds = done->seconds;
    if (done->eval_loss) out.info.heldout_loss = *done->eval_loss;
    path = checkpoint_path(run.out_dir);
  } else {
    path = resolve_checkpoint(path);
  }
  train::TrainedModel loaded = load_trained_model(path);
  out.model = loaded.model;
  out.config = loaded.config;
  out.info.step = loaded.step;
  out.info.checkpoint = loaded.checkpoint;
  out.info.train_len = out.config.seq_len;
  out.info.trained_logn = out.config.model.encoding.logn_train_len > 0;
  const nn::ModelConfig& m = out.config.model;
  // The encoding by kind (and ReRoPE's window): "rerope w = 64, rope(d=16, ...)"; the rope parameters alone would
  // describe a ReRoPE model as a RoPE one.
  const nn::EncodingConfig& e = m.resolved_encoding();
  std::string encoding(nn::encoding_kind_name(e.kind));
  if (e.window > 0) encoding += fmt::format(" w = {}", e.window);
  if (e.kind == nn::EncodingKind::LeakyRerope) encoding += fmt::format(" k = {}", e.leaky_k);
  out.info.description = fmt::format(
      "task {}, d_model {} x {} layers x {} heads, {}, {}, trained {} steps x batch {} at length {}{}", out.config.task,
      m.d_model, m.n_layers, m.n_heads, encoding, e.rope.describe(), out.info.step, out.config.batch_size,
      out.config.seq_len, out.info.trained_logn ? " with log-n" : "");
  return true;
}

}  // namespace rotary::experiments
