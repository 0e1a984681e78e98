// lab/train/metrics.h: the per-step metrics of a run, as metrics.csv (for spreadsheets and gnuplot) and
// metrics.jsonl (one JSON object per line, for programs). Torch-free.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace rotary::train {

struct MetricsRow {
  int64_t step = 0;           // steps completed (1-based): the row of the k-th optimizer update
  double loss = 0;            // training loss of that update's batch (the whole global batch)
  double lr = 0;
  double tokens_per_s = 0;    // global batch tokens / wall time of the step
  double grad_norm = 0;       // before clipping
  double elapsed_s = 0;       // wall time since the run (or the resumed part of it) started
  std::optional<double> eval_loss;      // held-out loss, on evaluation steps
  std::optional<double> eval_accuracy;  // greedy exact match, on evaluation steps of tasks with problems
};

std::string to_jsonl(const MetricsRow& row);
MetricsRow from_jsonl(const std::string& line);  // rotary::Error on a malformed line

// Reads metrics.jsonl; missing file = no rows. A torn last line (a crash mid-write) is dropped.
std::vector<MetricsRow> read_metrics(const std::string& jsonl_path);

// Appends rows to <dir>/metrics.csv and <dir>/metrics.jsonl, flushing each row.
class MetricsWriter {
 public:
  // keep_through_step < 0: start both files afresh. Otherwise (resume) keep the rows with step <= keep_through_step
  // - those written after the checkpoint by the interrupted process are dropped, since the resumed run redoes
  // those steps - rewrite both files atomically, then append.
  MetricsWriter(const std::string& dir, int64_t keep_through_step);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void append(const MetricsRow& row);

 private:
  std::FILE* csv_ = nullptr;
  std::FILE* jsonl_ = nullptr;
};

}  // namespace rotary::train
