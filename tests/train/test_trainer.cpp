// The training loop end to end on a tiny model: an interrupted and resumed run repeats the uninterrupted one,
// a non-finite loss stops the run and keeps the last good checkpoint, and a run directory is not clobbered.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/exit_status.h"
#include "common/files.h"
#include "expect_error.h"
#include "rotary/error.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace rotary::train {
namespace {

namespace fs = std::filesystem;

TrainConfig tiny(const std::string& out) {
  TrainConfig c;
  c.task = "addition";
  c.task_options.max_digits = 2;
  c.model.d_model = 16;
  c.model.n_layers = 1;
  c.model.n_heads = 1;
  c.seq_len = 32;
  c.batch_size = 4;
  c.steps = 12;
  c.seed = 5;
  c.optim.lr = 3e-3;
  c.optim.warmup_steps = 3;
  c.eval_interval = 4;
  c.eval_batches = 1;
  c.eval_problems = 2;
  c.threads = 1;  // the same reduction order in every run
  c.out_dir = out;
  return c;
}

struct Trainer : ::testing::Test {
  std::string root;
  void SetUp() override {
    root = (fs::temp_directory_path() / ("rotary_trainer_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(root);
    clear_stop_request();
  }
  void TearDown() override {
    fs::remove_all(root);
    clear_stop_request();
  }
  static TrainOptions quiet() {
    TrainOptions o;
    o.progress = false;
    return o;
  }
};

std::vector<double> losses(const std::string& dir) {
  std::vector<double> out;
  for (const MetricsRow& r : read_metrics(lab::join_path(dir, "metrics.jsonl"))) out.push_back(r.loss);
  return out;
}

// Bitwise: the resumed run restores the parameters, AdamW moments, step count and data RNG exactly, and runs the
// same float operations in the same order (one thread), so nothing may differ.
TEST_F(Trainer, InterruptedAndResumedRunRepeatsTheUninterruptedOne) {
  const std::string a = lab::join_path(root, "a"), b = lab::join_path(root, "b");
  TrainResult full = train(tiny(a), quiet());
  ASSERT_EQ(full.status, TrainStatus::Finished);

  TrainOptions stop = quiet();
  stop.stop_after_step = 6;  // as if Ctrl-C arrived during step 6
  TrainResult first = train(tiny(b), stop);
  ASSERT_EQ(first.status, TrainStatus::Interrupted);
  EXPECT_EQ(first.step, 6);
  EXPECT_EQ(read_checkpoint_meta(checkpoint_path(b)).step, 6);
  EXPECT_FALSE(lab::file_exists(lab::join_path(b, "summary.json")));
  clear_stop_request();

  TrainOptions resume = quiet();
  resume.resume = ResumeMode::Required;
  TrainResult second = train(tiny(b), resume);
  ASSERT_EQ(second.status, TrainStatus::Finished);
  const std::vector<double> la = losses(a), lb = losses(b);
  ASSERT_EQ(la.size(), 12u);
  ASSERT_EQ(lb.size(), 12u);
  for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i], lb[i]) << "step " << i + 1;
  ASSERT_TRUE(full.summary && second.summary);
  EXPECT_EQ(full.summary->eval_loss, second.summary->eval_loss);
  EXPECT_EQ(full.summary->accuracy_greedy, second.summary->accuracy_greedy);
  // Learning happened at all (else equality would be cheap): the loss fell.
  EXPECT_LT(la.back(), la.front());
}

// The performer's random features are redrawn every performer_redraw steps from (seed, step), and the current draw
// is a buffer saved in the checkpoint: interrupted at step 6 (after the redraw at 4, before the one at 8) and
// resumed, the run repeats the uninterrupted one bitwise. Without redraws the losses differ from step 5 on (the
// redraw did something).
TEST_F(Trainer, PerformerRedrawsAndResumesExactly) {
  auto performer = [](const std::string& out, int64_t redraw) {
    TrainConfig c = tiny(out);
    c.model.attention = nn::AttentionKind::Performer;
    c.model.performer_redraw = redraw;
    return c;
  };
  const std::string a = lab::join_path(root, "a"), b = lab::join_path(root, "b"), n = lab::join_path(root, "n");
  ASSERT_EQ(train(performer(a, 4), quiet()).status, TrainStatus::Finished);
  TrainOptions stop = quiet();
  stop.stop_after_step = 6;
  ASSERT_EQ(train(performer(b, 4), stop).status, TrainStatus::Interrupted);
  clear_stop_request();
  TrainOptions resume = quiet();
  resume.resume = ResumeMode::Required;
  ASSERT_EQ(train(performer(b, 4), resume).status, TrainStatus::Finished);
  ASSERT_EQ(train(performer(n, 0), quiet()).status, TrainStatus::Finished);
  const std::vector<double> la = losses(a), lb = losses(b), ln = losses(n);
  ASSERT_EQ(la.size(), 12u);
  ASSERT_EQ(lb.size(), 12u);
  for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i], lb[i]) << "step " << i + 1;
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(la[i], ln[i]) << "step " << i + 1;  // the same until the first redraw
  EXPECT_NE(la[4], ln[4]);
}

TEST_F(Trainer, ResumingWithDifferentSettingsNamesTheField) {
  const std::string dir = lab::join_path(root, "r");
  TrainOptions stop = quiet();
  stop.stop_after_step = 2;
  ASSERT_EQ(train(tiny(dir), stop).status, TrainStatus::Interrupted);
  clear_stop_request();
  TrainConfig changed = tiny(dir);
  changed.optim.lr = 1e-3;
  TrainOptions resume = quiet();
  resume.resume = ResumeMode::Required;
  try {
    train(changed, resume);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optim.lr"), std::string::npos) << e.what();
  }
  // A fresh run into the same directory is refused too (it would throw the run away).
  EXPECT_THROW(train(tiny(dir), quiet()), Error);
  TrainOptions nothing = resume;
  EXPECT_THROW(train(tiny(lab::join_path(root, "empty")), nothing), Error);
}

// A curriculum start: a run with init_from begins at the other run's parameters. At lr 1e-30 one AdamW step moves
// no float32 parameter, so the new run's checkpoint holds exactly the first run's parameters (its own start
// differs: another seed). A model of another shape, or a path with no run, is refused naming init_from.
TEST_F(Trainer, InitFromStartsAtTheOtherRunsParameters) {
  const std::string a = lab::join_path(root, "a"), b = lab::join_path(root, "b");
  ASSERT_EQ(train(tiny(a), quiet()).status, TrainStatus::Finished);
  TrainConfig from_a = tiny(b);
  from_a.seed = 6;
  from_a.steps = 1;
  from_a.optim.lr = 1e-30;
  from_a.init_from = a;
  ASSERT_EQ(train(from_a, quiet()).status, TrainStatus::Finished);
  TrainedModel ma = load_trained_model(a), mb = load_trained_model(b);
  auto pa = ma.model->named_parameters(), pb = mb.model->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& p : pa) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  EXPECT_EQ(mb.config.init_from, a);  // stored with the run

  TrainConfig fresh = from_a;
  fresh.out_dir = lab::join_path(root, "c");
  fresh.init_from.clear();
  ASSERT_EQ(train(fresh, quiet()).status, TrainStatus::Finished);
  TrainedModel mc = load_trained_model(fresh.out_dir);
  EXPECT_FALSE(torch::equal(mc.model->named_parameters()[pa.begin()->key()], pa.begin()->value()));

  auto refused = [&](TrainConfig c, const std::string& says) {
    test::expect_error([&] { train(c, quiet()); }, {"init_from", says});
  };
  TrainConfig wider = tiny(lab::join_path(root, "d"));
  wider.model.d_model = 32;
  wider.init_from = a;
  refused(wider, "is 21x16, this model's 21x32");  // the first parameter's shape, both sides named
  TrainConfig nowhere = tiny(lab::join_path(root, "e"));
  nowhere.init_from = lab::join_path(root, "no_such_run");
  refused(nowhere, "no_such_run");
}

// lr = 1e30 makes the first update enormous; the next loss is not finite. The run stops before applying that
// update, says so, and keeps the checkpoint of the last finite step.
TEST_F(Trainer, NonFiniteLossStopsTheRunAndKeepsTheLastCheckpoint) {
  const std::string dir = lab::join_path(root, "nan");
  TrainConfig c = tiny(dir);
  c.optim.lr = 1e30;
  c.optim.warmup_steps = 0;
  c.optim.grad_clip = 0;
  c.checkpoint_interval = 1;
  TrainResult r = train(c, quiet());
  ASSERT_EQ(r.status, TrainStatus::NonFinite);
  EXPECT_NE(r.message.find("non-finite"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("checkpoint"), std::string::npos) << r.message;
  EXPECT_LT(r.step, c.steps);
  const std::vector<MetricsRow> rows = read_metrics(lab::join_path(dir, "metrics.jsonl"));
  EXPECT_EQ(static_cast<int64_t>(rows.size()), r.step);
  for (const MetricsRow& row : rows) EXPECT_TRUE(std::isfinite(row.loss));
  if (r.step > 0) {
    EXPECT_EQ(read_checkpoint_meta(checkpoint_path(dir)).step, r.step);
  }
  std::optional<RunSummary> s = read_summary(dir);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, "non_finite");
}

// A failed torch allocation is a c10::Error, not std::bad_alloc: the exit-status policy still calls it out of
// memory (71), not a bug in rotary (70). 2^60 floats: no machine has them.
TEST(ExitStatus, TorchAllocationFailureIsOutOfMemory) {
  std::exception_ptr error;
  try {
    const torch::Tensor t = torch::empty({int64_t(1) << 60}, torch::kFloat);
  } catch (...) {
    error = std::current_exception();
  }
  ASSERT_TRUE(error) << "torch allocated 2^60 floats";
  std::FILE* out = std::tmpfile();
  EXPECT_EQ(lab::report_exception(error, out), lab::kExitOutOfMemory);
  std::rewind(out);
  char text[512] = {};
  std::fread(text, 1, sizeof text - 1, out);
  std::fclose(out);
  EXPECT_NE(std::string(text).find("out of memory"), std::string::npos) << text;
}

}  // namespace
}  // namespace rotary::train
