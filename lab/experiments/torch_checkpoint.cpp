// --engine torch: a checkpoint on the nn float32 model (rotary_nn/hf_checkpoint.h) behind CheckpointModel's
// TorchCheckpoint interface, installed by the torch build (use_torch_checkpoints).
#include <cstring>

#include "experiments/torch_checkpoint.h"

#include "experiments/checkpoint_model.h"
#include "rotary/content_hash.h"
#include "rotary_nn/hf_checkpoint.h"
#include "train/trainer.h"

namespace rotary::experiments {
namespace {

class NnCheckpoint final : public TorchCheckpoint {
 public:
  explicit NnCheckpoint(const std::string& model_dir) : c_(nn::load_hf_checkpoint(model_dir)) {}

  const nn::HfModelSpec& spec() const override { return c_.spec; }

  uint64_t weights_hash(int threads) const override {
    uint64_t h = 0;
    for (const auto& p : c_.model->named_parameters(/*recurse=*/true)) {  // (an ordered dict: by name)
      const torch::Tensor t = p.value().detach().to(torch::kFloat).contiguous();
      h = content_hash64(p.key().data(), p.key().size(), h);
      h = content_hash64(t.data_ptr<float>(), size_t(t.numel()) * sizeof(float), h, threads);
    }
    return h;
  }

  nn::EncodingConfig set_override(const nn::EncodingOverride& o) override {
    c_.model->set_override(o);
    return c_.model->active_encoding();
  }

  void hidden_states(const std::vector<int64_t>& tokens, float* out) override {
    torch::NoGradGuard no_grad;
    const int64_t T = int64_t(tokens.size());
    const torch::Tensor h =
        c_.model->hidden_states(torch::tensor(tokens, torch::kLong).view({1, T}))[0].to(torch::kFloat).contiguous();
    std::memcpy(out, h.data_ptr<float>(), size_t(h.numel()) * 4);
  }

  void project(const float* hidden, int64_t n, float* logits) override {
    torch::NoGradGuard no_grad;
    const torch::Tensor h = torch::from_blob(const_cast<float*>(hidden), {n, c_.spec.config.d_model}, torch::kFloat);
    const torch::Tensor l = c_.model->project(h).to(torch::kFloat).contiguous();
    std::memcpy(logits, l.data_ptr<float>(), size_t(l.numel()) * 4);
  }

  std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t max_new, double temperature,
                                int64_t stop_id, uint64_t seed, int64_t sample_vocab) override {
    return c_.model->generate(prompt, int(max_new), temperature, stop_id, seed, sample_vocab);
  }

 private:
  nn::HfCheckpoint c_;
};

}  // namespace

void use_torch_checkpoints() {
  set_torch_checkpoint_loader([](const std::string& model_dir, int threads) -> std::unique_ptr<TorchCheckpoint> {
    train::use_threads(threads);  // torch's and OpenBLAS's pools too
    return std::make_unique<NnCheckpoint>(model_dir);
  });
}

}  // namespace rotary::experiments
