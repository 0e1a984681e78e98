// lab/experiments/compare.cpp
#include "experiments/compare.h"

#include <fmt/format.h>

#include "common/files.h"
#include "common/lists.h"
#include "rotary/error.h"
#include "train/trainer.h"

namespace rotary::experiments {

using namespace train;  // the training engine these experiments run on

CompareSpec default_compare_spec() {
  CompareSpec s;
  s.encodings = {"rope", "roper"};
  s.seeds = 3;
  s.out_dir = "runs/compare";
  TrainConfig& c = s.base;
  c.out_dir = s.out_dir;  // `--out` overrides both
  c.task = "addition";
  c.task_options.max_digits = 3;
  c.model.d_model = 64;
  c.model.n_layers = 2;
  c.model.n_heads = 4;
  c.seq_len = 128;
  c.batch_size = 16;
  c.steps = 600;
  c.optim.lr = 3e-3;
  c.optim.warmup_steps = 50;
  c.optim.weight_decay = 0.1;
  c.eval_interval = 100;
  c.eval_batches = 2;
  c.eval_problems = 32;
  // One torch thread: at d_model 64 the ops are too small to split, and two threads on two cores measured half the
  // speed of one (150 steps: 19.0 s against 10.1 s). Threads do not change what a run computes.
  c.threads = 1;
  return s;
}

CompareResult run_compare(const CompareSpec& spec, bool progress) {
  check(!spec.encodings.empty(), "encodings", "\"\"", "a comma-separated list such as rope,roper");
  check(spec.seeds >= 1 && spec.seeds <= 1000, "seeds", spec.seeds, "an integer in [1, 1000]");
  lab::check_unique(spec.encodings, "encodings");
  // Every encoding is checked before the first run starts, so a typo does not surface an hour in.
  for (const std::string& enc : spec.encodings) {
    TrainConfig c = spec.base;
    c.model.encoding.kind = nn::parse_encoding_kind(enc, "encodings");
    c.validate();
  }
  lab::remove_stale_temp_files(spec.out_dir);  // of an earlier compare killed mid-write

  CompareResult result;
  const int total = static_cast<int>(spec.encodings.size()) * spec.seeds;
  int index = 0;
  for (const std::string& enc : spec.encodings) {
    for (int k = 0; k < spec.seeds; ++k) {
      ++index;
      CompareRun run;
      run.encoding = enc;
      run.seed = spec.base.seed + static_cast<uint64_t>(k);
      run.dir = lab::join_path(lab::join_path(spec.out_dir, enc), fmt::format("seed{}", run.seed));
      TrainConfig c = spec.base;
      c.model.encoding.kind = nn::parse_encoding_kind(enc, "encodings");
      c.seed = run.seed;
      c.out_dir = run.dir;
      const std::string label = fmt::format("[{}/{}] {} seed {}", index, total, enc, run.seed);

      if (std::optional<RunSummary> done = read_summary(run.dir)) {
        // The stored config has the vocabulary size filled in; compare with ours filled the same way.
        nlohmann::json want = c;
        if (want["model"].value("vocab_size", 0) == 0 && done->config.contains("model"))
          want["model"]["vocab_size"] = done->config["model"].value("vocab_size", 0);
        const std::string field = first_difference(done->config, want);
        if (!field.empty())
          throw Error("rotary: " + run.dir + " holds a finished run with different settings: " + field + " = " +
                      value_at(done->config, field) + " there, " + value_at(want, field) +
                      " here; use another --out (or delete that directory)");
        run.summary = *done;
        run.reused = true;
        if (progress) std::fprintf(stderr, "%s: finished earlier, skipped\n", label.c_str());
        result.runs.push_back(run);
        continue;
      }
      if (progress) std::fprintf(stderr, "%s: %s\n", label.c_str(), run.dir.c_str());
      TrainOptions opts;
      opts.resume = ResumeMode::IfPresent;
      opts.progress = progress;
      opts.label = label;
      TrainResult r = train::train(c, opts);
      if (r.status == TrainStatus::Interrupted) {
        result.interrupted = true;
        result.signal = r.signal;
        result.message = r.message + "; rerun the same compare to continue";
        return result;
      }
      if (r.status == TrainStatus::NonFinite) {
        if (progress) std::fprintf(stderr, "%s: %s\n", label.c_str(), r.message.c_str());
        run.summary = *read_summary(run.dir);
      } else {
        run.summary = *r.summary;
      }
      result.runs.push_back(run);
    }
  }

  ReportInputs in;
  in.out_dir = spec.out_dir;
  in.task = spec.base.task;
  in.encodings = spec.encodings;
  in.runs = result.runs;
  in.base_config = spec.base;
  in.command_line = spec.command_line;
  result.report = write_report(in);
  return result;
}

}  // namespace rotary::experiments
