// lab/tasks/registry.cpp: task names -> tasks, and the exact-match scoring shared by the trainer and tests.
#include <string>

#include "rotary/error.h"
#include "tasks/char_task.h"

namespace rotary::lab {

std::vector<std::string> task_names() {
  return {"addition", "substring_index", "substring_search", "kv_retrieval", "text"};
}

std::unique_ptr<Task> make_task(const std::string& name, const TaskOptions& options) {
  if (name == "addition") return make_addition_task(options);
  if (name == "substring_index") return make_substring_index_task(options);
  if (name == "substring_search") return make_substring_search_task(options);
  if (name == "kv_retrieval") return make_kv_retrieval_task(options);
  if (name == "text") return make_text_task(options);
  std::string allowed;
  for (const std::string& n : task_names()) allowed += (allowed.empty() ? "" : ", ") + n;
  fail("task", name, allowed);
}

bool exact_match(const std::string& generated, const EvalProblem& problem, const std::string& stop) {
  return generated.compare(0, problem.answer.size() + stop.size(), problem.answer + stop) == 0;
}

bool final_answer_match(const std::string& generated, const EvalProblem& problem, const std::string& stop) {
  std::string before_stop = generated.substr(0, problem.answer.size());
  if (!stop.empty()) {
    const size_t at = generated.find(stop);
    if (at == std::string::npos) return false;  // the answer never ended
    before_stop = generated.substr(0, at);
  }
  const std::string& want = problem.final_answer;
  return before_stop.size() >= want.size() &&
         before_stop.compare(before_stop.size() - want.size(), want.size(), want) == 0;
}

}  // namespace rotary::lab
