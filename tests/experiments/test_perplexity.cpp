// rotary perplexity's scoring: the loss of a window, with the LM head taken in chunks of positions, is the
// cross entropy of the full forward's logits (so chunking changes memory, not results), and the tail is the last
// L targets - on both runtimes of a checkpoint (the engine and the nn model), which agree with each other.
#include <gtest/gtest.h>

#include "experiments/perplexity.h"
#include "experiments/torch_checkpoint.h"
#include "rotary_nn/hf_checkpoint.h"

namespace rotary::experiments {
namespace {

// --engine torch: the nn model, installed as the torch build's rotary installs it.
const bool kTorchCheckpoints = (use_torch_checkpoints(), true);

TEST(perplexity, EngineTorchIsRefusedByNameUntilInstalled) {
  set_torch_checkpoint_loader(nullptr);
  CheckpointRunOptions o;
  o.engine = "torch";
  try {
    o.validate();
    ADD_FAILURE() << "--engine torch accepted without a loader";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without libtorch"), std::string::npos) << e.what();
  }
  use_torch_checkpoints();
  EXPECT_NO_THROW(o.validate());
}

TEST(perplexity, ChunkedHeadLossIsTheFullForwardsCrossEntropy) {
  const std::string dir = std::string(ROTARY_SOURCE_DIR) + "/tests/data/hf_checkpoints/llama2";
  nn::HfCheckpoint c = nn::load_hf_checkpoint(dir);
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
  // Both runtimes compute in float32 against this float64 cross entropy: float32 logits of size ~3 carry ~1e-6
  // absolute error (docs/engine.md), and the loss of a position moves by at most twice its largest logit error.
  for (const char* engine : {"engine", "torch"}) {
    CheckpointRunOptions run;
    run.engine = engine;
    CheckpointModel m(dir, run);
    std::vector<double> first;
    for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(30), int64_t(1000)}) {
      const WindowLoss w = window_loss(m, tokens, tail, chunk);
      ASSERT_EQ(int64_t(w.loss_by_position.size()), T);
      for (int64_t t = 0; t < T; ++t) EXPECT_NEAR(w.loss_by_position[size_t(t)], ce[t].item<double>(), 1e-5) << engine << " " << t;
      EXPECT_NEAR(w.full_loss, ce.mean().item<double>(), 1e-5) << engine;
      EXPECT_NEAR(w.tail_loss, ce.slice(0, T - tail).mean().item<double>(), 1e-5) << engine;
      // The head's chunks see the same hidden rows: the losses do not depend on the chunking beyond rounding.
      if (first.empty()) first = w.loss_by_position;
      for (int64_t t = 0; t < T; ++t) EXPECT_NEAR(w.loss_by_position[size_t(t)], first[size_t(t)], 1e-6) << engine;
    }
    EXPECT_THROW(window_loss(m, tokens, T + 1, 8), Error);
    EXPECT_THROW(window_loss(m, {1}, 1, 8), Error);
    EXPECT_THROW(window_loss(m, tokens, tail, 0), Error);
  }
}

TEST(perplexity, RunOptionsAreCheckedByFlag) {
  CheckpointRunOptions o;
  o.engine = "onnx";
  EXPECT_THROW(o.validate(), Error);
  o = {}, o.weights = "int4";
  EXPECT_THROW(o.validate(), Error);
  o = {}, o.kv_dtype = "f64";
  EXPECT_THROW(o.validate(), Error);
  o = {}, o.engine = "torch", o.weights = "q8";  // the nn model has float32 weights only: refused, not ignored
  EXPECT_THROW(o.validate(), Error);
  o = {}, o.weights = "q8", o.kv_dtype = "bf16";
  EXPECT_NO_THROW(o.validate());
  EXPECT_NE(o.key(), CheckpointRunOptions{}.key());  // cells computed with other weights are not reused
}

// A run is checked against the memory available before it starts: refused naming the flag, the bytes and what
// would shrink them; the estimate grows with the tokens, halves its cache part with a bf16 cache, and a scoring
// pass (perplexity) counts no cache at all: exactly the KV cache's bytes less - for this fixture (2 layers, 1 kv
// head, head_dim 16 kept as two halves of 8 rotary pairs, each padded to kv_cache.h's 16) keys and values of
// 32 floats per layer and token: 2 x 2 x 32 x 4 = 512 bytes per token in f32.
TEST(perplexity, RunsThatDoNotFitTheMemoryAreRefusedBeforeWork) {
  using Kind = CheckpointModel::RunKind;
  const std::string dir = std::string(ROTARY_SOURCE_DIR) + "/tests/data/hf_checkpoints/llama3";
  CheckpointModel f32(dir, {});
  CheckpointRunOptions half;
  half.kv_dtype = "bf16";
  CheckpointModel bf16(dir, half);
  const int64_t small = f32.memory_needed(16, Kind::Generate), large = f32.memory_needed(1 << 16, Kind::Generate);
  EXPECT_GT(small, 0);
  EXPECT_GT(large, small);
  EXPECT_LT(bf16.memory_needed(1 << 16, Kind::Generate), large);
  const int64_t cache = int64_t(512) << 16;
  EXPECT_EQ(large - f32.memory_needed(1 << 16, Kind::Score), cache);
  EXPECT_EQ(bf16.memory_needed(1 << 16, Kind::Generate) - bf16.memory_needed(1 << 16, Kind::Score), cache / 2);
  EXPECT_NO_THROW(f32.check_memory(1 << 16, Kind::Generate, "--lengths", large));
  for (Kind kind : {Kind::Generate, Kind::Score}) {
    const int64_t need = f32.memory_needed(1 << 16, kind);
    try {
      f32.check_memory(1 << 16, kind, "--lengths", need - 1);
      ADD_FAILURE() << "not refused";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("--lengths = 65536 tokens, needing"), std::string::npos) << m;
      // a smaller cache is offered only where there is one
      EXPECT_EQ(m.find("--kv-dtype bf16") != std::string::npos, kind == Kind::Generate) << m;
      EXPECT_NE(m.find("--weights q8"), std::string::npos) << m;
    }
  }
  // Weights converted at load are held already, out of what /proc/meminfo calls available: not counted again
  // (a 13B model in q8, 14.5 GB held, was refused at 8k tokens for the 8.7 GB left available); nor is q8 offered
  // to a model already in q8.
  CheckpointRunOptions q8_run;
  q8_run.weights = "q8";
  q8_run.activations = "f32";  // (q8 activations add their quantized copies: this tiny model's weights weigh less)
  CheckpointModel q8(dir, q8_run);
  EXPECT_LT(q8.memory_needed(1 << 16, Kind::Score), f32.memory_needed(1 << 16, Kind::Score));
  try {
    q8.check_memory(1 << 16, Kind::Score, "--lengths", 1);
    ADD_FAILURE() << "not refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--lengths = 65536 tokens, needing"), std::string::npos) << m;
    EXPECT_NE(m.find("converted weights held already"), std::string::npos) << m;
    EXPECT_EQ(m.find("--weights q8"), std::string::npos) << m;
  }
  CheckpointRunOptions torch_run;
  torch_run.engine = "torch";
  EXPECT_EQ(CheckpointModel(dir, torch_run).memory_needed(1 << 16, Kind::Score), 0);  // not estimated there
}

}  // namespace
}  // namespace rotary::experiments
