// lab/experiments/extrapolate_eval.cpp
#include "experiments/extrapolate_eval.h"

#include <cmath>
#include <fmt/format.h>

#include "rotary/error.h"
#include "train/evaluate.h"

namespace rotary::experiments {

using namespace train;  // the training engine these experiments run on

std::string mode_name(WindowMode m) { return m == WindowMode::Plain ? "text" : "repeated"; }

std::vector<std::vector<int32_t>> heldout_base_rows(const lab::Task& task, int n, int max_len) {
  check(n >= 1, "windows", n, ">= 1");
  const int64_t available = task.heldout_rows(max_len);
  check(available == 0 || n <= available, "windows", n,
        fmt::format("at most {} (the held-out rows of {} tokens task {} has)", available, max_len + 1, task.name()));
  std::vector<std::vector<int32_t>> rows;
  for (int i = 0; i < n; ++i) rows.push_back(task.heldout_sequence(/*seed=*/0, i, max_len).tokens);
  return rows;
}

std::vector<int32_t> make_window(const std::vector<int32_t>& row, int test_len, int train_len, WindowMode mode) {
  const size_t need = static_cast<size_t>(test_len) + 1;
  check(row.size() >= need, "test length", test_len, fmt::format("<= {} (the base rows' length - 1)", row.size() - 1));
  check(train_len >= 1 && train_len <= test_len, "train_len", train_len, "in [1, test length]");
  if (mode == WindowMode::Plain) return {row.end() - static_cast<std::ptrdiff_t>(need), row.end()};
  // The last L tokens, repeated: position t holds tail[t mod L].
  const std::vector<int32_t> tail(row.end() - train_len, row.end());
  std::vector<int32_t> w(need);
  for (size_t t = 0; t < need; ++t) w[t] = tail[t % static_cast<size_t>(train_len)];
  return w;
}

WindowScore score_windows(nn::Transformer& model, const std::vector<std::vector<int32_t>>& rows, int test_len,
                          int train_len, WindowMode mode, bool decode, int batch_size) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  const int64_t T = test_len, L = train_len, first_scored = T - L;
  std::vector<double> sum_by_pos(static_cast<size_t>(T), 0.0);
  std::vector<int64_t> n_by_pos(static_cast<size_t>(T), 0);
  double loss_sum = 0;
  int64_t correct = 0, tokens = 0;

  // logits [B, T, V] of windows [B, T + 1] -> running sums; positions [from, T) are scored or plotted.
  auto add = [&](const torch::Tensor& logits, const torch::Tensor& targets, int64_t from) {
    const int64_t v = logits.size(2);
    torch::Tensor lg = logits.slice(1, from, T);                             // [B, T - from, V]
    if (lg.scalar_type() != torch::kDouble) lg = lg.to(torch::kFloat32);
    const torch::Tensor tg = targets.slice(1, from, T);                      // [B, T - from]
    const torch::Tensor ce = torch::nn::functional::cross_entropy(
        lg.reshape({-1, v}), tg.reshape({-1}), torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone))
                                 .view(tg.sizes())
                                 .to(torch::kFloat64);                       // [B, T - from]
    const torch::Tensor hit = lg.argmax(-1).eq(tg);                          // [B, T - from]
    const torch::Tensor by_pos = ce.sum(0);                                  // [T - from]
    auto bp = by_pos.accessor<double, 1>();
    for (int64_t t = from; t < T; ++t) {
      sum_by_pos[t] += bp[t - from];
      n_by_pos[t] += ce.size(0);
    }
    const int64_t off = first_scored - from;  // the scored targets inside the slice
    loss_sum += ce.slice(1, off).sum().item<double>();
    correct += hit.slice(1, off).sum().item<int64_t>();
    tokens += ce.size(0) * L;
  };

  for (size_t start = 0; start < rows.size(); start += static_cast<size_t>(batch_size)) {
    const size_t n = std::min(rows.size() - start, static_cast<size_t>(batch_size));
    std::vector<int64_t> flat;
    for (size_t i = 0; i < n; ++i) {
      const std::vector<int32_t> w = make_window(rows[start + i], test_len, train_len, mode);
      flat.insert(flat.end(), w.begin(), w.end());
    }
    const torch::Tensor all = torch::tensor(flat, torch::kInt64).view({static_cast<int64_t>(n), T + 1});  // [n, T+1]
    const torch::Tensor inputs = all.slice(1, 0, T), targets = all.slice(1, 1, T + 1);                  // [n, T]
    if (!decode) {
      add(model->forward(inputs.contiguous()), targets, 0);
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      const torch::Tensor row = inputs[static_cast<int64_t>(i)].contiguous();  // [T]
      const std::vector<int64_t> ids(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + T);
      // At T = L there is nothing before the scored tokens: prefill one token (dynamic NTK is plain RoPE there).
      const torch::Tensor logits = model->decode_logits(ids, std::max<int64_t>(1, first_scored));  // [T, V]
      add(logits.unsqueeze(0), targets.slice(0, static_cast<int64_t>(i), static_cast<int64_t>(i) + 1),
          first_scored);
    }
  }
  if (was_training) model->train();

  WindowScore s;
  s.tokens = tokens;
  s.loss = tokens ? loss_sum / static_cast<double>(tokens) : std::nan("");
  s.accuracy = tokens ? static_cast<double>(correct) / static_cast<double>(tokens) : std::nan("");
  s.loss_by_position.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) s.loss_by_position[t] = n_by_pos[t] ? sum_by_pos[t] / n_by_pos[t] : std::nan("");
  return s;
}

int kv_pairs_for_length(int test_len) { return std::max(1, (test_len - 5) / 14); }

RetrievalScore score_retrieval(nn::Transformer& model, int test_len, int problems, uint64_t seed) {
  lab::TaskOptions opt;
  opt.kv_pairs = kv_pairs_for_length(test_len);
  const std::unique_ptr<lab::Task> task = lab::make_task("kv_retrieval", opt);
  check(task->vocab().size() == model->config().vocab_size, "model.vocab_size", model->config().vocab_size,
        fmt::format("{} (a model trained on kv_retrieval)", task->vocab().size()));
  const Accuracy acc = exact_match(model, *task, problems, seed, /*temperature=*/0.0, seed);
  RetrievalScore r;
  r.accuracy = acc.value();
  r.problems = acc.total;
  r.kv_pairs = opt.kv_pairs;
  double prompt = 0, distance = 0;
  for (const ProblemResult& p : acc.results) {
    prompt += static_cast<double>(p.prompt.size());  // one token per character
    // The queried key's value: '"key": "value"' in the object; the key is the text between '} ' and '='.
    const size_t close = p.prompt.rfind("} ");
    const std::string key = p.prompt.substr(close + 2, p.prompt.size() - close - 3);
    const size_t at = p.prompt.find("\"" + key + "\": \"");
    distance += static_cast<double>(p.prompt.size() - (at + key.size() + 5));
  }
  if (acc.total > 0) {
    r.prompt_tokens = prompt / acc.total;
    r.answer_distance = distance / acc.total;
  }
  return r;
}

}  // namespace rotary::experiments
