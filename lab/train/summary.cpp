// lab/train/summary.cpp
#include "train/summary.h"

#include <cmath>

#include "common/files.h"
#include "rotary/error.h"
#include "rotary/json_guard.h"

namespace rotary::train {

void to_json(nlohmann::json& j, const RunSummary& s) {
  j = nlohmann::json{{"status", s.status}, {"steps", s.steps}, {"seconds", s.seconds}, {"final_train_loss", s.final_train_loss},
                     {"problems", s.problems}, {"config", s.config}};
  j["eval_loss"] = s.eval_loss ? nlohmann::json(*s.eval_loss) : nlohmann::json(nullptr);
  j["accuracy_greedy"] = s.accuracy_greedy ? nlohmann::json(*s.accuracy_greedy) : nlohmann::json(nullptr);
  j["accuracy_sampled"] = s.accuracy_sampled ? nlohmann::json(*s.accuracy_sampled) : nlohmann::json(nullptr);
}

void from_json(const nlohmann::json& j, RunSummary& s) {
  s.status = j.value("status", "finished");
  s.steps = j.at("steps").get<int64_t>();
  s.seconds = j.at("seconds").get<double>();
  s.final_train_loss = j.at("final_train_loss").is_number() ? j["final_train_loss"].get<double>() : std::nan("");
  s.problems = j.value("problems", 0);
  s.config = j.value("config", nlohmann::json::object());
  auto opt = [&](const char* k) -> std::optional<double> {
    if (j.contains(k) && j[k].is_number()) return j[k].get<double>();
    return std::nullopt;
  };
  s.eval_loss = opt("eval_loss");
  s.accuracy_greedy = opt("accuracy_greedy");
  s.accuracy_sampled = opt("accuracy_sampled");
}

std::optional<RunSummary> read_summary(const std::string& dir) {
  const std::string path = lab::join_path(dir, "summary.json");
  if (!lab::file_exists(path)) return std::nullopt;
  nlohmann::json j;
  try {
    j = parse_json(lab::read_file(path), path);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + "; delete " + path + " to rerun that run");
  }
  try {
    return j.get<RunSummary>();
  } catch (const nlohmann::json::exception& e) {
    throw Error("rotary: " + path + " is not a run summary (" + e.what() + "); delete it to rerun that run");
  }
}

void write_summary(const std::string& dir, const RunSummary& s) {
  lab::write_file_atomic(lab::join_path(dir, "summary.json"), nlohmann::json(s).dump(2) + "\n");
}

}  // namespace rotary::train
