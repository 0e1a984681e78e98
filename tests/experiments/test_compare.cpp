// compare's statistics and report (torch-free parts): drop-worst mean, report.md + PNGs.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "common/files.h"
#include "common/process.h"
#include "experiments/compare.h"
#include "experiments/report.h"
#include "train/metrics.h"

namespace rotary::experiments {

using namespace train;  // the training engine these experiments run on
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("rotary_train_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// The default runs land under the compare's own directory (a run's out_dir is derived from it), and the default
// is a valid run description for every encoding it compares.
TEST(DefaultCompare, RunsLiveUnderItsOutDirAndValidate) {
  const CompareSpec s = default_compare_spec();
  EXPECT_EQ(s.base.out_dir, s.out_dir);
  ASSERT_FALSE(s.encodings.empty());
  for (const std::string& e : s.encodings) {
    TrainConfig c = s.base;
    c.model.encoding.kind = nn::parse_encoding_kind(e, "encodings");
    EXPECT_NO_THROW(c.validate()) << e;
  }
}

TEST(DropWorstMean, DropsTheHighestLossAndTheLowestAccuracy) {
  EXPECT_DOUBLE_EQ(drop_worst_mean({1.0, 2.0, 3.0, 10.0}, false), (1.0 + 2.0 + 3.0) / 3.0);
  EXPECT_DOUBLE_EQ(drop_worst_mean({10.0, 1.0, 2.0, 3.0}, false), (1.0 + 2.0 + 3.0) / 3.0);  // position-free
  EXPECT_DOUBLE_EQ(drop_worst_mean({0.1, 0.5, 0.9}, true), (0.5 + 0.9) / 2.0);
  // Ties: exactly one run is dropped.
  EXPECT_DOUBLE_EQ(drop_worst_mean({4.0, 4.0, 1.0}, false), (4.0 + 1.0) / 2.0);
}

TEST(DropWorstMean, OneRunIsItsOwnMeanAndNothingIsNaN) {
  EXPECT_DOUBLE_EQ(drop_worst_mean({0.25}, true), 0.25);
  EXPECT_TRUE(std::isnan(drop_worst_mean({}, true)));
}

TEST(DropWorstMean, ADivergedRunIsTheWorstAndTwoMakeItNaN) {
  const double nan = std::nan("");
  EXPECT_DOUBLE_EQ(drop_worst_mean({1.0, nan, 3.0}, false), 2.0);
  EXPECT_DOUBLE_EQ(drop_worst_mean({0.5, nan, 0.7}, true), 0.6);
  EXPECT_TRUE(std::isnan(drop_worst_mean({1.0, nan, nan}, false)));
}

TEST(Report, StepsToLossInterpolatesTheCrossing) {
  std::vector<MetricsRow> rows(6);
  for (int i = 0; i < 6; ++i) rows[size_t(i)].step = i + 1;
  rows[1].eval_loss = 2.0;   // step 2
  rows[3].eval_loss = 1.0;   // step 4
  rows[5].eval_loss = 0.5;   // step 6
  EXPECT_DOUBLE_EQ(steps_to_loss(rows, 1.5), 3.0);
  EXPECT_DOUBLE_EQ(steps_to_loss(rows, 1.0), 4.0);
  EXPECT_DOUBLE_EQ(steps_to_loss(rows, 3.0), 2.0) << "below the level at the first evaluation";
  EXPECT_TRUE(std::isnan(steps_to_loss(rows, 0.25)));
  EXPECT_TRUE(std::isnan(steps_to_loss(rows, std::nan(""))));
  rows[3].eval_loss = std::nan("");  // a diverged evaluation is skipped, not taken as a crossing
  EXPECT_DOUBLE_EQ(steps_to_loss(rows, 1.0), 2.0 + 4.0 * 1.0 / 1.5);
}

// A task without problems (text): perplexity instead of the accuracy columns, and an explicit target level.
TEST(Report, TextTablesShowPerplexityAndTheTargetAskedFor) {
  const std::string dir = fresh_dir("report_text");
  ReportInputs in;
  in.out_dir = dir;
  in.task = "text";
  in.encodings = {"learned"};
  in.target_loss = 1.0;
  CompareRun r;
  r.encoding = "learned";
  r.dir = lab::join_path(dir, "learned");
  {
    MetricsWriter w(r.dir, -1);
    for (int64_t s = 1; s <= 4; ++s) {
      MetricsRow m;
      m.step = s;
      m.loss = 2.0 / double(s);
      m.tokens_per_s = 500;
      m.eval_loss = m.loss;
      w.append(m);
    }
  }
  r.summary.final_train_loss = 0.5;
  r.summary.eval_loss = std::log(2.0);
  in.runs.push_back(r);
  const std::string table = results_table(in);
  EXPECT_NE(table.find("perplexity"), std::string::npos) << table;
  EXPECT_EQ(table.find("exact match"), std::string::npos) << table;
  EXPECT_NE(table.find("| learned | 1 | 0.5000 | 0.6931 | 0.6931 - 0.6931 | 2.00 | 2 (1/1 runs) | 500 |"),
            std::string::npos)
      << table;
  fs::remove_all(dir);
}

// Two encodings x two runs with made-up metrics: the report has the table, every run, and the plots.
TEST(Report, WritesMarkdownTableAndPlots) {
  const std::string dir = fresh_dir("report");
  ReportInputs in;
  in.out_dir = dir;
  in.task = "addition";
  in.encodings = {"rope", "roper"};
  in.base_config = {{"steps", 20}, {"seq_len", 16}, {"batch_size", 2}, {"eval_batches", 1}, {"eval_problems", 4},
                    {"model", {{"d_model", 16}, {"n_layers", 1}, {"n_heads", 1}}},
                    {"optim", {{"lr", 0.001}, {"warmup_steps", 2}, {"min_lr_ratio", 0.1}}}};
  for (const std::string& enc : in.encodings) {
    for (int seed = 0; seed < 2; ++seed) {
      CompareRun r;
      r.encoding = enc;
      r.seed = static_cast<uint64_t>(seed);
      r.dir = lab::join_path(lab::join_path(dir, enc), "seed" + std::to_string(seed));
      {
        MetricsWriter w(r.dir, -1);
        for (int64_t s = 1; s <= 20; ++s) {
          MetricsRow m;
          m.step = s;
          m.loss = 3.0 / static_cast<double>(s) + seed;
          m.tokens_per_s = 1000.0 * (seed + 1) + double(s);  // median over 20 steps: 1000 (seed + 1) + 11
          if (s % 10 == 0) m.eval_loss = m.loss, m.eval_accuracy = 0.05 * static_cast<double>(s) / 10.0;
          w.append(m);
        }
      }
      r.summary.steps = 20;
      r.summary.final_train_loss = 0.15 + seed;
      r.summary.eval_loss = 0.2 + seed;
      r.summary.accuracy_greedy = seed == 0 ? 0.75 : 0.25;
      r.summary.accuracy_sampled = 0.5;
      in.runs.push_back(r);
    }
  }
  // Drop-worst of two runs keeps the better one.
  std::vector<EncodingStats> stats = encoding_stats(in);
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_DOUBLE_EQ(stats[0].final_train_loss, 0.15);
  EXPECT_DOUBLE_EQ(stats[1].accuracy_greedy, 0.75);

  ReportFiles files = write_report(in);
  const std::string md = lab::read_file(files.report_md);
  // Steps to the automatic target, the lowest level every run reached (1.15: seed 1's best, at step 20; its
  // evaluation at step 10 had 1.3): seed 0 is below it at its first evaluation (step 10), seed 1 crosses at 20;
  // the slower run is dropped as the worst.
  EXPECT_DOUBLE_EQ(resolved_target_loss(in), 1.15);
  EXPECT_DOUBLE_EQ(stats[0].steps_to_target, 10.0);
  EXPECT_EQ(stats[0].reached_target, 2);
  EXPECT_EQ(stats[0].run_steps_to_target, (std::vector<double>{10.0, 20.0}));
  EXPECT_DOUBLE_EQ(stats[0].tokens_per_s, 2011.0) << "higher throughput is better: the slower run is dropped";
  EXPECT_NE(md.find("| rope | 2 | 0.1500 | 0.2000 | 0.2000 - 1.2000 | 10 (2/2 runs) | 2011 | 75.0% | 25.0% - 75.0% "
                    "| 50.0% |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("steps to held-out loss 1.1500"), std::string::npos) << md;
  in.target_loss = 0.2;  // asked for: seed 0 crosses between 0.3 (step 10) and 0.15 (step 20); seed 1 never does
  stats = encoding_stats(in);
  EXPECT_NEAR(stats[0].steps_to_target, 10 + 10 * 0.1 / 0.15, 1e-9);
  EXPECT_EQ(stats[0].reached_target, 1);
  in.target_loss.reset();
  EXPECT_DOUBLE_EQ(stats[0].greedy_min, 0.25);
  EXPECT_DOUBLE_EQ(stats[0].eval_loss_max, 1.2);
  EXPECT_NE(md.find("| roper | 1 | finished | 20 | 1.1500 | 1.2000 | 25.0% | 50.0% |"), std::string::npos) << md;
  if (lab::find_in_path("gnuplot").empty()) GTEST_SKIP() << "gnuplot not installed";
  EXPECT_TRUE(files.plot_problem.empty()) << files.plot_problem;
  for (const char* png : {"loss.png", "eval_loss.png", "accuracy.png"}) {
    const std::string path = lab::join_path(dir, png);
    ASSERT_TRUE(lab::file_exists(path)) << png;
    EXPECT_EQ(lab::read_file(path).substr(1, 3), "PNG") << png;
    EXPECT_NE(md.find(std::string("](") + png + ")"), std::string::npos) << png;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace rotary::experiments
