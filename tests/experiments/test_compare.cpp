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
  EXPECT_NE(md.find("| rope | 2 | 0.1500 | 0.2000 | 0.2000 - 1.2000 | 75.0% | 25.0% - 75.0% | 50.0% |"),
            std::string::npos)
      << md;
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
