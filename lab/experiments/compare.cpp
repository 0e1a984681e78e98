// lab/experiments/compare.cpp
#include "experiments/compare.h"

#include <fmt/format.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "common/exit_status.h"
#include "common/files.h"
#include "common/lists.h"
#include "common/process.h"
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
  // 2000 steps: measured on 2 cores, two runs at a time, d_model 64 x 2 layers solves >= 50% of 3-digit sums
  // (seeds 1, 2: RoPE 42% / 62%, RoPER 62% / 67% of 64 problems); at 600 steps neither passed 11%.
  c.steps = 2000;
  c.optim.lr = 3e-3;
  c.optim.warmup_steps = 50;
  c.optim.weight_decay = 0.1;
  c.eval_interval = 250;
  c.eval_batches = 2;
  c.eval_problems = 64;  // one problem = 1.6%
  // One torch thread: at d_model 64 the ops are too small to split, and two threads on two cores measured half the
  // speed of one (150 steps: 19.0 s against 10.1 s). Threads do not change what a run computes.
  c.threads = 1;
  return s;
}

namespace {

// One run of the compare: its settings and where it stands.
struct PlannedRun {
  CompareRun run;
  TrainConfig config;
  std::string label;
};

// The last `n` bytes of a file (a child's log, for an error message).
std::string tail_of(const std::string& path, size_t n) {
  std::string text;
  try {
    text = lab::read_file(path);
  } catch (const Error&) {
    return "(no log)";
  }
  return text.size() > n ? "..." + text.substr(text.size() - n) : text;
}

// Runs `todo` as `rotary train` processes, `jobs` at a time, each with its own log (<run>/train.log) and threads.
// The parent only starts, waits and reads the summaries; a SIGINT/SIGTERM (to the terminal's process group, or to
// this process alone: it is passed on) lets every child save its checkpoint and stop. Returns false if interrupted.
bool train_in_processes(const std::string& program, std::vector<PlannedRun*>& todo, int jobs, bool progress,
                        CompareResult& result) {
  struct Child {
    PlannedRun* planned;
    pid_t pid;
    std::string log;
  };
  std::vector<Child> running;
  size_t next = 0;
  bool stopping = false;
  StopSignalGuard signals;
  auto start = [&](PlannedRun& p) {
    lab::make_dirs(p.run.dir);
    const std::string toml = lab::join_path(p.run.dir, "compare_run.toml");
    lab::write_file_atomic(toml, to_toml(p.config));
    std::vector<std::string> argv = {"rotary", "train", "--no-progress"};
    if (lab::file_exists(checkpoint_path(p.run.dir))) argv.insert(argv.end(), {"--resume", "--out", p.run.dir});
    else argv.insert(argv.end(), {"--config", toml});
    lab::SpawnOptions o;
    o.program = program;
    o.stdout_path = lab::join_path(p.run.dir, "train.log");
    o.stderr_to_stdout = true;
    o.die_with_parent = true;  // a compare killed outright (SIGKILL) leaves no training behind
    pid_t pid = 0;
    const int err = lab::spawn_process(argv, o, pid);
    if (err != 0) throw Error("rotary: cannot start `rotary train` for " + p.label + ": " + std::strerror(err));
    if (progress) std::fprintf(stderr, "%s: started (%s)\n", p.label.c_str(), p.run.dir.c_str());
    running.push_back({&p, pid, o.stdout_path});
  };
  while (next < todo.size() || !running.empty()) {
    if (stop_requested() && !stopping) {
      stopping = true;  // no new runs; each running child saves and stops (it may have had the signal already)
      for (const Child& c : running) ::kill(c.pid, SIGINT);
    }
    while (!stopping && next < todo.size() && int(running.size()) < jobs) start(*todo[next++]);
    if (running.empty()) break;
    // Poll instead of blocking: the stop handler is installed with SA_RESTART, so a blocking waitpid would carry
    // on through a SIGTERM sent to this process alone, and the children would never hear of it.
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (done < 0) {
      if (errno == EINTR) continue;  // a signal: checked at the top
      throw Error(std::string("rotary: waiting for the training processes: ") + std::strerror(errno));
    }
    auto it = std::find_if(running.begin(), running.end(), [&](const Child& c) { return c.pid == done; });
    if (it == running.end()) continue;
    const Child c = *it;
    running.erase(it);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    PlannedRun& p = *c.planned;
    if (code == 0 || code == lab::kExitNonFiniteLoss) {
      std::optional<RunSummary> s = read_summary(p.run.dir);
      if (!s) throw Error("rotary: " + p.label + " ended without a summary.json; its log " + c.log + ": " + tail_of(c.log, 400));
      p.run.summary = *s;
      if (progress) {
        std::string line = fmt::format("{}: finished, final train loss {:.4f}", p.label, s->final_train_loss);
        if (s->accuracy_greedy) line += fmt::format(", exact match {:.1f}%", 100 * *s->accuracy_greedy);
        if (code != 0) line += " (stopped: the loss became non-finite)";
        std::fprintf(stderr, "%s\n", line.c_str());
      }
    } else if (code > 128 || stopping) {
      stopping = true;
      // The signal this process had (its children then exit 130 from the SIGINT it passed on), else the child's.
      result.run.status = RunStatus::Interrupted;
      result.run.signal = stop_signal() != 0 ? stop_signal() : code > 128 ? code - 128 : SIGINT;
    } else {
      for (const Child& other : running) ::kill(other.pid, SIGINT);
      for (const Child& other : running) lab::wait_process(other.pid);
      throw Error("rotary: " + p.label + ": `rotary train` exited with status " + std::to_string(code) + "; its log " +
                  c.log + ": " + tail_of(c.log, 400));
    }
  }
  if (stopping) {
    result.run = RunOutcome::interrupted_by(result.run.signal != 0 ? result.run.signal : stop_signal(),
                                            "interrupted; the runs saved their checkpoints: rerun the same compare "
                                            "to continue");
    return false;
  }
  return true;
}

}  // namespace

CompareResult run_compare(const CompareSpec& spec, bool progress) {
  check(!spec.encodings.empty(), "encodings", "\"\"", "a comma-separated list such as rope,roper");
  check(spec.seeds >= 1 && spec.seeds <= 1000, "seeds", spec.seeds, "an integer in [1, 1000]");
  check(spec.jobs >= 0 && spec.jobs <= 256, "jobs", spec.jobs, "an integer in [0, 256] (0: one per core)");
  lab::check_unique(spec.encodings, "encodings");
  // Every encoding is checked before the first run starts, so a typo does not surface an hour in.
  for (const std::string& enc : spec.encodings) {
    TrainConfig c = spec.base;
    c.model.encoding.kind = nn::parse_encoding_kind(enc, "encodings");
    c.validate();
  }
  // Two compares on one --out would train the same runs and report each other's half-finished ones.
  const lab::DirectoryLock lock(spec.out_dir, "--out");
  lab::remove_stale_temp_files(spec.out_dir);  // of an earlier compare killed mid-write

  CompareResult result;
  const int total = static_cast<int>(spec.encodings.size()) * spec.seeds;
  const int cores = std::max(1, resolve_threads(0));
  const int jobs = spec.rotary_program.empty()
                       ? 1
                       : std::min(total, spec.jobs > 0 ? spec.jobs : std::max(1, cores / std::max(1, spec.base.threads)));
  std::vector<PlannedRun> planned;
  int index = 0;
  for (const std::string& enc : spec.encodings) {
    for (int k = 0; k < spec.seeds; ++k) {
      ++index;
      PlannedRun p;
      CompareRun& run = p.run;
      run.encoding = enc;
      run.seed = spec.base.seed + static_cast<uint64_t>(k);
      run.dir = lab::join_path(lab::join_path(spec.out_dir, enc), fmt::format("seed{}", run.seed));
      TrainConfig& c = p.config;
      c = spec.base;
      c.model.encoding.kind = nn::parse_encoding_kind(enc, "encodings");
      c.seed = run.seed;
      c.out_dir = run.dir;
      // Runs side by side share the cores: "all cores" becomes each run's share (threads do not change what a
      // run computes).
      if (jobs > 1 && c.threads == 0) c.threads = std::max(1, cores / jobs);
      p.label = fmt::format("[{}/{}] {} seed {}", index, total, enc, run.seed);

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
        if (progress) std::fprintf(stderr, "%s: finished earlier, skipped\n", p.label.c_str());
      }
      planned.push_back(std::move(p));
    }
  }

  std::vector<PlannedRun*> todo;
  for (PlannedRun& p : planned)
    if (!p.run.reused) todo.push_back(&p);
  if (jobs > 1 && todo.size() > 1 && !spec.rotary_program.empty()) {
    if (progress) std::fprintf(stderr, "%zu runs, %d at a time (each a `rotary train` process)\n", todo.size(), jobs);
    if (!train_in_processes(spec.rotary_program, todo, jobs, progress, result)) return result;
  } else {
    for (PlannedRun* p : todo) {
      if (progress) std::fprintf(stderr, "%s: %s\n", p->label.c_str(), p->run.dir.c_str());
      TrainOptions opts;
      opts.resume = ResumeMode::IfPresent;
      opts.progress = progress;
      opts.label = p->label;
      TrainResult r = train::train(p->config, opts);
      if (r.status == TrainStatus::Interrupted) {
        result.run = RunOutcome::interrupted_by(r.signal, r.message + "; rerun the same compare to continue");
        return result;
      }
      if (r.status == TrainStatus::NonFinite) {
        if (progress) std::fprintf(stderr, "%s: %s\n", p->label.c_str(), r.message.c_str());
        p->run.summary = *read_summary(p->run.dir);
      } else {
        p->run.summary = *r.summary;
      }
    }
  }
  for (const PlannedRun& p : planned) result.runs.push_back(p.run);

  ReportInputs in;
  in.out_dir = spec.out_dir;
  in.task = spec.base.task;
  in.encodings = spec.encodings;
  in.runs = result.runs;
  in.base_config = spec.base;
  in.command_line = spec.command_line;
  in.target_loss = spec.target_loss;
  result.report = write_report(in);
  return result;
}

}  // namespace rotary::experiments
