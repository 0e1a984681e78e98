// rotary perplexity's scoring: the loss of a window, with the LM head taken in chunks of positions, is the
// cross entropy of the full forward's logits (so chunking changes memory, not results), and the tail is the last
// L targets.
#include <gtest/gtest.h>

#include "experiments/perplexity.h"
#include "rotary_nn/hf_checkpoint.h"

namespace rotary::experiments {
namespace {

TEST(perplexity, ChunkedHeadLossIsTheFullForwardsCrossEntropy) {
  nn::HfCheckpoint c = nn::load_hf_checkpoint(std::string(ROTARY_SOURCE_DIR) + "/tests/data/hf_checkpoints/llama2");
  c.model->to(torch::kDouble);
  std::vector<int64_t> tokens;
  for (int i = 0; i < 31; ++i) tokens.push_back((i * 37 + 11) % c.spec.config.vocab_size);
  const int64_t T = int64_t(tokens.size()) - 1, tail = 8;
  torch::Tensor ce;
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor all = torch::tensor(tokens);
    const torch::Tensor logits = c.model->forward(all.slice(0, 0, T).view({1, T}))[0];
    ce = torch::nn::functional::cross_entropy(logits, all.slice(0, 1, T + 1),
                                              torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  }
  for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(30), int64_t(1000)}) {
    const WindowLoss w = window_loss(c.model, tokens, tail, chunk);
    ASSERT_EQ(int64_t(w.loss_by_position.size()), T);
    for (int64_t t = 0; t < T; ++t) EXPECT_NEAR(w.loss_by_position[size_t(t)], ce[t].item<double>(), 1e-12) << t;
    EXPECT_NEAR(w.full_loss, ce.mean().item<double>(), 1e-12);
    EXPECT_NEAR(w.tail_loss, ce.slice(0, T - tail).mean().item<double>(), 1e-12);
  }
  EXPECT_THROW(window_loss(c.model, tokens, T + 1, 8), Error);
  EXPECT_THROW(window_loss(c.model, {1}, 1, 8), Error);
}

}  // namespace
}  // namespace rotary::experiments
