// lab/train/evaluate.cpp
#include "train/evaluate.h"

#include <algorithm>
#include <cmath>

#include "rotary/error.h"

namespace rotary::train {

Batch make_batch(const std::vector<lab::TrainSequence>& rows, int seq_len, size_t first, size_t count) {
  const int64_t b = static_cast<int64_t>(count), s = seq_len;
  std::vector<int64_t> tokens(static_cast<size_t>(b * (s + 1)));
  std::vector<float> mask(static_cast<size_t>(b * s));
  for (size_t i = 0; i < count; ++i) {
    const lab::TrainSequence& row = rows.at(first + i);
    check(row.tokens.size() == static_cast<size_t>(s + 1), "task row tokens", row.tokens.size(),
          "seq_len + 1 = " + std::to_string(s + 1) + " (task bug)");
    check(row.loss_mask.size() == static_cast<size_t>(s), "task row loss_mask", row.loss_mask.size(),
          "seq_len = " + std::to_string(s) + " (task bug)");
    std::copy(row.tokens.begin(), row.tokens.end(), tokens.begin() + static_cast<std::ptrdiff_t>(i * (s + 1)));
    std::copy(row.loss_mask.begin(), row.loss_mask.end(), mask.begin() + static_cast<std::ptrdiff_t>(i * s));
  }
  torch::Tensor all = torch::tensor(tokens, torch::kInt64).view({b, s + 1});  // [B, S+1]
  Batch batch;
  batch.inputs = all.slice(1, 0, s).contiguous();
  batch.targets = all.slice(1, 1, s + 1).contiguous();
  batch.mask = torch::tensor(mask, torch::kFloat32).view({b, s});
  return batch;
}

torch::Tensor token_losses(nn::Transformer& model, const Batch& batch) {
  torch::Tensor logits = model->forward(batch.inputs);  // [B, S, V]
  const int64_t v = logits.size(2);
  torch::Tensor ce = torch::nn::functional::cross_entropy(
      logits.reshape({-1, v}).to(torch::kFloat32), batch.targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));  // [B*S]
  return ce.view(batch.targets.sizes());                                         // [B, S]
}

HeldoutLoss heldout_loss(nn::Transformer& model, const lab::Task& task, int seq_len, int rows, int batch_size,
                         uint64_t seed) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  HeldoutLoss out;
  std::vector<double> sum_by_pos(static_cast<size_t>(seq_len), 0.0), w_by_pos(static_cast<size_t>(seq_len), 0.0);
  double sum = 0, weight = 0;
  for (int start = 0; start < rows; start += batch_size) {
    const int n = std::min(batch_size, rows - start);
    std::vector<lab::TrainSequence> seqs;
    for (int i = 0; i < n; ++i) seqs.push_back(task.heldout_sequence(seed, start + i, seq_len));
    Batch batch = make_batch(seqs, seq_len, 0, seqs.size());
    torch::Tensor weighted = (token_losses(model, batch) * batch.mask).to(torch::kFloat64);  // [n, S]
    torch::Tensor by_pos = weighted.sum(0), w = batch.mask.to(torch::kFloat64).sum(0);     // [S], [S]
    auto bp = by_pos.accessor<double, 1>();
    auto wp = w.accessor<double, 1>();
    for (int t = 0; t < seq_len; ++t) {
      sum_by_pos[t] += bp[t];
      w_by_pos[t] += wp[t];
    }
    sum += weighted.sum().item<double>();
    weight += batch.mask.to(torch::kFloat64).sum().item<double>();
  }
  if (was_training) model->train();
  out.loss = weight > 0 ? sum / weight : std::nan("");
  out.weight = weight;
  out.weight_by_position = w_by_pos;
  out.loss_by_position.resize(static_cast<size_t>(seq_len));
  for (int t = 0; t < seq_len; ++t) out.loss_by_position[t] = w_by_pos[t] > 0 ? sum_by_pos[t] / w_by_pos[t] : std::nan("");
  return out;
}

int64_t stop_token(const lab::Task& task) {
  const std::string stop = task.stop();
  if (stop.empty()) return -1;
  std::vector<int32_t> ids = task.vocab().encode(stop);
  return ids.size() == 1 ? ids[0] : -1;
}

void check_positions_suffice(const nn::ModelConfig& model, const lab::Task& task, int seq_len, int n, uint64_t seed) {
  if (model.encoding.kind != nn::EncodingKind::Learned) return;  // every other encoding takes any position
  const std::string allowed = "<= model.max_seq_len = " + std::to_string(model.max_seq_len) +
                              " with learned absolute positions (raise --max-seq-len)";
  check(seq_len <= model.max_seq_len, "seq_len", seq_len, allowed);
  const int64_t stop_id = stop_token(task);
  int longest = 0;
  for (const lab::EvalProblem& p : task.eval_problems(n, seed)) {
    // generate() feeds the prompt and all but the last of max_new tokens: prompt + max_new - 1 positions.
    const int prompt = static_cast<int>(task.vocab().encode(p.prompt).size());
    const int max_new = static_cast<int>(task.vocab().encode(p.answer).size()) + (stop_id >= 0 ? 1 : 0);
    longest = std::max(longest, prompt + max_new - 1);
  }
  check(longest <= model.max_seq_len, "eval_problems",
        std::to_string(n) + " (the longest needs " + std::to_string(longest) + " positions)",
        allowed + ", or fewer / shorter problems");
}

Accuracy exact_match(nn::Transformer& model, const lab::Task& task, int n, uint64_t seed, double temperature,
                     uint64_t sample_seed) {
  return exact_match(model, task, n, seed, sample_seed,
                     [&](const std::vector<int64_t>& prompt, int max_new, int64_t stop_id, uint64_t s) {
                       return model->generate(prompt, max_new, temperature, stop_id, s);
                     });
}

Accuracy exact_match(nn::Transformer& model, const lab::Task& task, int n, uint64_t seed, uint64_t sample_seed,
                     const GenerateFn& generate) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  Accuracy acc;
  const int64_t stop_id = stop_token(task);
  const std::vector<lab::EvalProblem> problems = task.eval_problems(n, seed);
  for (size_t i = 0; i < problems.size(); ++i) {
    const lab::EvalProblem& p = problems[i];
    std::vector<int32_t> prompt32 = task.vocab().encode(p.prompt);
    std::vector<int64_t> prompt(prompt32.begin(), prompt32.end());
    // Exactly the answer and the stop (tasks.h): a model that does not stop right after the answer runs out of
    // tokens without producing the stop and is scored wrong, as is one that stops early.
    const int answer_tokens = static_cast<int>(task.vocab().encode(p.answer).size());
    const int max_new = answer_tokens + (stop_id >= 0 ? 1 : 0);
    std::vector<int64_t> gen = generate(prompt, max_new, stop_id, sample_seed + i);
    std::vector<int32_t> gen32(gen.begin(), gen.end());
    ProblemResult r{p.prompt, p.answer, task.vocab().decode(gen32), false};
    // generate() leaves the stop token out; fewer tokens than asked for means it produced it.
    if (stop_id >= 0 && static_cast<int>(gen.size()) < max_new) r.generated += task.stop();
    r.correct = lab::exact_match(r.generated, p, stop_id >= 0 ? task.stop() : std::string());
    acc.correct += r.correct ? 1 : 0;
    acc.total += 1;
    acc.results.push_back(std::move(r));
  }
  if (was_training) model->train();
  return acc;
}

}  // namespace rotary::train
