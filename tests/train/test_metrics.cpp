// The training engine's metrics files (lab/train/metrics.h): rows survive a crash mid-line, and a resumed run
// keeps exactly the rows up to its checkpoint.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "common/files.h"
#include "train/metrics.h"

namespace rotary::train {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("rotary_metrics_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

TEST(Metrics, ResumeKeepsRowsUpToTheCheckpointAndDropsATornLine) {
  const std::string dir = fresh_dir("metrics");
  {
    MetricsWriter w(dir, -1);
    for (int64_t s = 1; s <= 6; ++s) {
      MetricsRow r;
      r.step = s;
      r.loss = 1.0 / static_cast<double>(s);
      if (s == 4) r.eval_loss = 0.5, r.eval_accuracy = 0.25;
      w.append(r);
    }
  }
  // A crash in the middle of writing row 7.
  {
    std::FILE* f = std::fopen(lab::join_path(dir, "metrics.jsonl").c_str(), "a");
    std::fputs("{\"step\": 7, \"lo", f);
    std::fclose(f);
  }
  std::vector<MetricsRow> rows = read_metrics(lab::join_path(dir, "metrics.jsonl"));
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[3].eval_accuracy.value_or(-1), 0.25);
  EXPECT_FALSE(rows[2].eval_loss.has_value());
  EXPECT_DOUBLE_EQ(rows[5].loss, 1.0 / 6.0);  // %.17g-exact through JSON

  { MetricsWriter resumed(dir, 4); }  // the checkpoint was at step 4: rows 5, 6 (and the torn 7) are redone
  rows = read_metrics(lab::join_path(dir, "metrics.jsonl"));
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows.back().step, 4);
  const std::string csv = lab::read_file(lab::join_path(dir, "metrics.csv"));
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5);  // header + 4 rows
  EXPECT_EQ(csv.rfind("step,loss,lr,tokens_per_s,grad_norm,eval_loss,eval_accuracy,elapsed_s\n", 0), 0u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace rotary::train
