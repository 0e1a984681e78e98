// lab/train/config.cpp: TrainConfig <-> JSON, TOML files, validation and config differences.
#include "train/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>

#include "common/files.h"
#include "rotary/error.h"

namespace rotary::train {
namespace {

using nlohmann::json;

// Reads the known fields of one JSON object and rejects the rest, so a typo in a TOML file is an error rather
// than a silently ignored setting.
class FieldReader {
 public:
  FieldReader(const json& j, std::string prefix) : j_(j), prefix_(std::move(prefix)) {
    if (!j_.is_object()) fail(prefix_.empty() ? "config" : prefix_, j_.dump(), "a table of fields");
  }

  template <class T>
  void get(const std::string& key, T& out) {
    known_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end()) return;
    const json& v = *it;
    const std::string field = prefix_ + key;
    if constexpr (std::is_same_v<T, bool>) {
      check(v.is_boolean(), field, v.dump(), "true or false");
      out = v.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      // TOML writers sometimes give 1000.0 for 1000; accept numbers with an integral value.
      bool ok = v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
      if (ok && std::is_unsigned_v<T>) ok = v.get<double>() >= 0;
      if (ok)
        ok = v.get<double>() >= static_cast<double>(std::numeric_limits<T>::lowest()) &&
             v.get<double>() <= static_cast<double>(std::numeric_limits<T>::max());
      check(ok, field, v.dump(), std::is_unsigned_v<T> ? "a non-negative integer" : "an integer");
      out = v.is_number_integer() ? v.get<T>() : static_cast<T>(v.get<double>());
    } else if constexpr (std::is_floating_point_v<T>) {
      check(v.is_number(), field, v.dump(), "a number");
      out = v.get<T>();
    } else {
      check(v.is_string(), field, v.dump(), "a string");
      out = v.get<std::string>();
    }
  }

  // Every key must have been asked for (or be one of `also_known`, handled by the caller).
  void finish(std::initializer_list<const char*> also_known = {}) {
    for (const char* k : also_known) known_.insert(k);
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (known_.count(it.key())) continue;
      std::string allowed;
      for (const std::string& k : known_) allowed += (allowed.empty() ? "" : ", ") + k;
      fail("config field", prefix_ + it.key(), "one of " + allowed);
    }
  }

 private:
  const json& j_;
  std::string prefix_;
  std::set<std::string> known_;
};

void task_options_to_json(json& j, const lab::TaskOptions& o) {
  j = json{{"max_digits", o.max_digits},       {"min_string", o.min_string}, {"max_string", o.max_string},
           {"search_substring", o.search_substring}, {"search_eval_len", o.search_eval_len}, {"kv_pairs", o.kv_pairs},     {"text_vocab", o.text_vocab},
           {"cache_dir", o.cache_dir}};
}

void task_options_from_json(const json& j, lab::TaskOptions& o) {
  FieldReader r(j, "task_options.");
  r.get("max_digits", o.max_digits);
  r.get("min_string", o.min_string);
  r.get("max_string", o.max_string);
  r.get("search_substring", o.search_substring);
  r.get("search_eval_len", o.search_eval_len);
  r.get("kv_pairs", o.kv_pairs);
  r.get("text_vocab", o.text_vocab);
  r.get("cache_dir", o.cache_dir);
  r.finish();
}

json toml_node_to_json(const toml::node& node, const std::string& where) {
  if (const toml::table* t = node.as_table()) {
    json out = json::object();
    for (const auto& [key, value] : *t) out[std::string(key.str())] = toml_node_to_json(value, where + "." + std::string(key.str()));
    return out;
  }
  if (const toml::array* a = node.as_array()) {
    json out = json::array();
    for (const toml::node& e : *a) out.push_back(toml_node_to_json(e, where + "[]"));
    return out;
  }
  if (auto v = node.value_exact<std::string>()) return *v;
  if (auto v = node.value_exact<int64_t>()) return *v;
  if (auto v = node.value_exact<double>()) return *v;
  if (auto v = node.value_exact<bool>()) return *v;
  fail("config field", where.substr(where.empty() || where[0] != '.' ? 0 : 1), "a string, number, boolean, table or array (no dates)");
}

}  // namespace

void to_json(json& j, const OptimConfig& c) {
  j = json{{"lr", c.lr},
           {"beta1", c.beta1},
           {"beta2", c.beta2},
           {"eps", c.eps},
           {"weight_decay", c.weight_decay},
           {"warmup_steps", c.warmup_steps},
           {"min_lr_ratio", c.min_lr_ratio},
           {"grad_clip", c.grad_clip}};
}

void from_json(const json& j, OptimConfig& c) {
  FieldReader r(j, "optim.");
  r.get("lr", c.lr);
  r.get("beta1", c.beta1);
  r.get("beta2", c.beta2);
  r.get("eps", c.eps);
  r.get("weight_decay", c.weight_decay);
  r.get("warmup_steps", c.warmup_steps);
  r.get("min_lr_ratio", c.min_lr_ratio);
  r.get("grad_clip", c.grad_clip);
  r.finish();
}

void to_json(json& j, const TrainConfig& c) {
  json task_options, model;
  task_options_to_json(task_options, c.task_options);
  nn::to_json(model, c.model);
  j = json{{"task", c.task},
           {"task_options", task_options},
           {"model", model},
           {"seq_len", c.seq_len},
           {"batch_size", c.batch_size},
           {"steps", c.steps},
           {"seed", c.seed},
           {"optim", c.optim},
           {"eval_interval", c.eval_interval},
           {"eval_batches", c.eval_batches},
           {"eval_problems", c.eval_problems},
           {"eval_seed", c.eval_seed},
           {"checkpoint_interval", c.checkpoint_interval},
           {"out_dir", c.out_dir},
           {"threads", c.threads}};
}

void from_json(const json& j, TrainConfig& c) {
  FieldReader r(j, "");
  r.get("task", c.task);
  r.get("seq_len", c.seq_len);
  r.get("batch_size", c.batch_size);
  r.get("steps", c.steps);
  r.get("seed", c.seed);
  r.get("eval_interval", c.eval_interval);
  r.get("eval_batches", c.eval_batches);
  r.get("eval_problems", c.eval_problems);
  r.get("eval_seed", c.eval_seed);
  r.get("checkpoint_interval", c.checkpoint_interval);
  r.get("out_dir", c.out_dir);
  r.get("threads", c.threads);
  r.finish({"task_options", "model", "optim"});
  if (j.contains("task_options")) task_options_from_json(j["task_options"], c.task_options);
  if (j.contains("optim")) from_json(j["optim"], c.optim);
  if (j.contains("model")) {
    // Missing model fields keep their current values: merge the given ones over the current config's JSON.
    json model;
    nn::to_json(model, c.model);
    if (!j["model"].is_object()) fail("model", j["model"].dump(), "a table of model fields");
    model.merge_patch(j["model"]);
    nn::from_json(model, c.model);
  }
}

void TrainConfig::validate() const {
  const std::vector<std::string> tasks = lab::task_names();
  if (std::find(tasks.begin(), tasks.end(), task) == tasks.end()) {
    std::string allowed;
    for (const std::string& t : tasks) allowed += (allowed.empty() ? "" : ", ") + t;
    fail("task", task, allowed);
  }
  check(seq_len >= 2 && seq_len <= (1 << 20), "seq_len", seq_len, "an integer in [2, 1048576]");
  check(batch_size >= 1, "batch_size", batch_size, "an integer >= 1");
  check(steps >= 1, "steps", steps, "an integer >= 1");
  check(std::isfinite(optim.lr) && optim.lr > 0, "optim.lr", optim.lr, "a finite number > 0");
  check(optim.beta1 >= 0 && optim.beta1 < 1, "optim.beta1", optim.beta1, "a number in [0, 1)");
  check(optim.beta2 >= 0 && optim.beta2 < 1, "optim.beta2", optim.beta2, "a number in [0, 1)");
  check(optim.eps > 0, "optim.eps", optim.eps, "a number > 0");
  check(optim.weight_decay >= 0 && std::isfinite(optim.weight_decay), "optim.weight_decay", optim.weight_decay,
        "a finite number >= 0");
  check(optim.warmup_steps >= 0, "optim.warmup_steps", optim.warmup_steps, "an integer >= 0");
  check(optim.min_lr_ratio >= 0 && optim.min_lr_ratio <= 1, "optim.min_lr_ratio", optim.min_lr_ratio,
        "a number in [0, 1]");
  check(optim.grad_clip >= 0, "optim.grad_clip", optim.grad_clip, "a number >= 0 (0 = no clipping)");
  check(eval_interval >= 0, "eval_interval", eval_interval, "an integer >= 0 (0 = only at the end)");
  check(eval_batches >= 0, "eval_batches", eval_batches, "an integer >= 0");
  check(eval_problems >= 0, "eval_problems", eval_problems, "an integer >= 0");
  check(checkpoint_interval >= 0, "checkpoint_interval", checkpoint_interval, "an integer >= 0");
  check(threads >= 0, "threads", threads, "an integer >= 0 (0 = automatic)");
  check(!out_dir.empty(), "out_dir", "\"\"", "a directory path");
  check(model.vocab_size >= 0, "model.vocab_size", model.vocab_size, "0 (from the task) or the task's vocabulary size");
  nn::ModelConfig m = model;
  if (m.vocab_size == 0) m.vocab_size = 2;  // the task fills it in; validate the rest now
  m.validate();
}

json toml_to_json(const std::string& toml_text, const std::string& source_name) {
  toml::table table;
  try {
    table = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "rotary: " << source_name << ":" << e.source().begin.line << ":" << e.source().begin.column
       << ": TOML syntax error: " << e.description();
    throw Error(os.str());
  }
  return toml_node_to_json(table, "");
}

TrainConfig load_config_file(const std::string& path) {
  json j = toml_to_json(lab::read_file(path), path);
  TrainConfig c;
  try {
    from_json(j, c);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (in " + path + ")");
  }
  return c;
}

bool is_bookkeeping_field(const std::string& p) {
  return p == "out_dir" || p == "threads" || p == "checkpoint_interval";
}

std::string first_difference(const json& a, const json& b, const std::string& prefix) {
  if (a.is_object() && b.is_object()) {
    std::set<std::string> keys;
    for (auto it = a.begin(); it != a.end(); ++it) keys.insert(it.key());
    for (auto it = b.begin(); it != b.end(); ++it) keys.insert(it.key());
    for (const std::string& k : keys) {
      const std::string path = prefix.empty() ? k : prefix + "." + k;
      if (is_bookkeeping_field(path)) continue;
      if (!a.contains(k) || !b.contains(k)) return path;
      std::string d = first_difference(a[k], b[k], path);
      if (!d.empty()) return d;
    }
    return "";
  }
  // Numbers compare by value (an integer 1 and a float 1.0 are the same setting).
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>() ? "" : prefix;
  return a == b ? "" : prefix;
}

std::string value_at(const json& j, const std::string& dotted_path) {
  const json* node = &j;
  std::istringstream in(dotted_path);
  std::string part;
  while (std::getline(in, part, '.')) {
    if (!node->is_object() || !node->contains(part)) return "<absent>";
    node = &(*node)[part];
  }
  return node->dump();
}

}  // namespace rotary::train
