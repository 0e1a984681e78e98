// `rotary task show`: a sample training row of a task, with its loss mask, and a few eval problems; for checking
// formats by eye (docs/tasks.md describes them).
#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "cli/command.h"
#include "rotary/error.h"
#include "tasks/char_vocab.h"
#include "tasks/task.h"

namespace rotary::cli {
namespace {

struct TaskArgs {
  std::string task;
  int seq_len = 128;
  uint64_t seed = 0;
  int problems = 3;
  lab::TaskOptions options;
};

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

void run_task_show(const TaskArgs& a) {
  check(a.problems >= 0, "--problems", a.problems, ">= 0");
  const std::unique_ptr<lab::Task> task = lab::make_task(a.task, a.options);
  const lab::Vocab& vocab = task->vocab();
  std::printf("task %s: vocabulary of %d tokens (pad id %d), stop %s\n", task->name().c_str(), vocab.size(),
              vocab.pad_id(), quoted(task->stop()).c_str());

  std::mt19937_64 rng(a.seed);
  const lab::TrainSequence row = task->train_sequence(rng, a.seq_len);
  int targets = 0;
  for (const float w : row.loss_mask) targets += w > 0 ? 1 : 0;
  std::printf("\ntraining row (seq_len %d, seed %llu): %zu tokens, %d of %zu targets in the loss\n", a.seq_len,
              static_cast<unsigned long long>(a.seed), row.tokens.size(), targets, row.loss_mask.size());
  if (dynamic_cast<const lab::CharVocab*>(&vocab) != nullptr) {
    // One character per token: a second line marks with '^' the characters whose prediction is in the loss.
    std::string marks(row.tokens.size(), ' ');
    for (size_t t = 0; t < row.loss_mask.size(); ++t)
      if (row.loss_mask[t] > 0) marks[t + 1] = '^';
    write_stdout(vocab.decode(row.tokens) + "\n" + marks + "\n");
  } else {
    write_stdout(vocab.decode(row.tokens) + "\n");
    if (const int64_t rows = task->heldout_rows(a.seq_len); rows > 0)
      std::printf("(%lld held-out rows of this length)\n", static_cast<long long>(rows));
  }

  const auto problems = task->eval_problems(a.problems, a.seed);
  if (problems.empty()) return;
  std::printf("\neval problems (seed %llu): generate after the prompt; exact match = answer + stop\n",
              static_cast<unsigned long long>(a.seed));
  for (const lab::EvalProblem& p : problems)
    std::printf("  prompt %s\n  answer %s\n  final  %s\n\n", quoted(p.prompt).c_str(), quoted(p.answer).c_str(),
                quoted(p.final_answer).c_str());
}

const CommandRegistrar kRegisterTask([](CLI::App& root) {
  CLI::App& group = subcommand_group(root, "task", "The seeds' tasks: training rows and eval problems");
  auto args = std::make_shared<TaskArgs>();
  TaskArgs& a = *args;
  std::string names;
  for (const std::string& n : lab::task_names()) names += (names.empty() ? "" : ", ") + n;
  CLI::App* cmd = group.add_subcommand("show", "Print a sample training row (with its loss mask) and eval problems");
  cmd->add_option("--task", a.task, names)->required();
  cmd->add_option("--seq-len", a.seq_len, "row length (the row holds seq_len + 1 tokens)")->transform(integer_in(2, kMaxSequenceLength));
  cmd->add_option("--seed", a.seed, "seed of the row and the problems")->transform(unsigned_up_to(UINT64_MAX));
  cmd->add_option("--problems", a.problems, "eval problems to print")->transform(integer_in(0, 1 << 20));
  lab::TaskOptions& o = a.options;
  cmd->add_option("--max-digits", o.max_digits, "addition: most digits per operand")->transform(integer_in(1, 18));
  cmd->add_option("--min-string", o.min_string, "substring_index: shortest string")->transform(integer_in(1, kMaxSequenceLength));
  cmd->add_option("--max-string", o.max_string, "substring_index: longest string")->transform(integer_in(1, kMaxSequenceLength));
  cmd->add_option("--search-substring", o.search_substring, "substring_search: copied substring length")->transform(integer_in(1, kMaxSequenceLength));
  cmd->add_option("--search-eval-len", o.search_eval_len, "substring_search: eval context characters")->transform(integer_in(1, kMaxSequenceLength));
  cmd->add_option("--kv-pairs", o.kv_pairs, "kv_retrieval: pairs per object")->transform(integer_in(1, 1 << 16));
  cmd->add_option("--passkey-digits", o.passkey_digits, "passkey: distinct digits of the key")->transform(integer_in(1, 10));
  cmd->add_option("--passkey-eval-len", o.passkey_eval_len, "passkey: eval prompt characters")->transform(integer_in(1, 1 << 24));
  cmd->add_option("--text-vocab", o.text_vocab, "text: sentencepiece vocabulary size")->transform(integer_in(2, 1 << 20));
  cmd->add_option("--cache-dir", o.cache_dir, "text: cache directory (default $XDG_CACHE_HOME/rotary)");
  cmd->callback([args] { run_task_show(*args); });
});

}  // namespace
}  // namespace rotary::cli
