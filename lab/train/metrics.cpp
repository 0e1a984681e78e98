// lab/train/metrics.cpp
#include "train/metrics.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include <fmt/format.h>

#include "common/files.h"
#include "rotary/error.h"
#include "rotary/json_guard.h"

namespace rotary::train {
namespace {

constexpr const char* kCsvHeader = "step,loss,lr,tokens_per_s,grad_norm,eval_loss,eval_accuracy,elapsed_s\n";

std::string csv_line(const MetricsRow& r) {
  auto opt = [](const std::optional<double>& v) { return v ? fmt::format("{:.9g}", *v) : std::string(); };
  return fmt::format("{},{:.9g},{:.9g},{:.9g},{:.9g},{},{},{:.9g}\n", r.step, r.loss, r.lr, r.tokens_per_s, r.grad_norm,
                     opt(r.eval_loss), opt(r.eval_accuracy), r.elapsed_s);
}

std::FILE* open_append(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) throw Error("rotary: cannot open " + path + ": " + std::strerror(errno));
  return f;
}

}  // namespace

std::string to_jsonl(const MetricsRow& r) {
  nlohmann::json j{{"step", r.step},         {"loss", r.loss},           {"lr", r.lr},
                   {"tokens_per_s", r.tokens_per_s}, {"grad_norm", r.grad_norm}, {"elapsed_s", r.elapsed_s}};
  if (r.eval_loss) j["eval_loss"] = *r.eval_loss;
  if (r.eval_accuracy) j["eval_accuracy"] = *r.eval_accuracy;
  return j.dump();
}

MetricsRow from_jsonl(const std::string& line) {
  nlohmann::json j;
  try {
    j = parse_json(line, "metrics line");
  } catch (const Error&) {
  }  // not an object: refused below with the line itself
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer() || !j.contains("loss"))
    fail("metrics line", line.substr(0, 80), "a JSON object with an integer step and a loss");
  MetricsRow r;
  r.step = j.at("step").get<int64_t>();
  // Non-finite values are written as null by nlohmann; read them back as NaN.
  auto num = [&](const char* key) {
    return j.contains(key) && j[key].is_number() ? j[key].get<double>() : std::nan("");
  };
  r.loss = num("loss");
  r.lr = num("lr");
  r.tokens_per_s = num("tokens_per_s");
  r.grad_norm = num("grad_norm");
  r.elapsed_s = num("elapsed_s");
  if (j.contains("eval_loss") && j["eval_loss"].is_number()) r.eval_loss = j["eval_loss"].get<double>();
  if (j.contains("eval_accuracy") && j["eval_accuracy"].is_number())
    r.eval_accuracy = j["eval_accuracy"].get<double>();
  return r;
}

std::vector<MetricsRow> read_metrics(const std::string& jsonl_path) {
  std::vector<MetricsRow> rows;
  if (!lab::file_exists(jsonl_path)) return rows;
  std::string text = lab::read_file(jsonl_path);
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    // Only the last line can be torn (written with one fwrite + fflush per row); it lacks its newline.
    if (in.eof() && text.back() != '\n') break;
    rows.push_back(from_jsonl(line));
  }
  return rows;
}

MetricsWriter::MetricsWriter(const std::string& dir, int64_t keep_through_step) {
  lab::make_dirs(dir);
  const std::string csv_path = lab::join_path(dir, "metrics.csv");
  const std::string jsonl_path = lab::join_path(dir, "metrics.jsonl");
  std::string csv = kCsvHeader, jsonl;
  if (keep_through_step >= 0) {
    for (const MetricsRow& r : read_metrics(jsonl_path)) {
      if (r.step > keep_through_step) break;
      csv += csv_line(r);
      jsonl += to_jsonl(r) + "\n";
    }
  }
  lab::write_file_atomic(csv_path, csv);
  lab::write_file_atomic(jsonl_path, jsonl);
  csv_ = open_append(csv_path);
  jsonl_ = open_append(jsonl_path);
}

MetricsWriter::~MetricsWriter() {
  if (csv_) std::fclose(csv_);
  if (jsonl_) std::fclose(jsonl_);
}

void MetricsWriter::append(const MetricsRow& row) {
  const std::string c = csv_line(row), j = to_jsonl(row) + "\n";
  std::fwrite(c.data(), 1, c.size(), csv_);
  std::fwrite(j.data(), 1, j.size(), jsonl_);
  std::fflush(csv_);
  std::fflush(jsonl_);
}

}  // namespace rotary::train
