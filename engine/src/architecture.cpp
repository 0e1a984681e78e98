// The architecture's checks and the tensors it reads (no kernels: the readers of model descriptions and their fuzz
// targets use these without the engine's model).
#include <string>

#include "rotary/error.h"
#include "rotary_engine/model.h"

namespace rotary::engine {

void Architecture::validate() const {
  check(vocab_size >= 1 && vocab_size <= (int64_t(1) << 31), "vocab_size", vocab_size, "1..2^31");
  check(d_model >= 1 && d_model <= (1 << 16), "d_model", d_model, "1..65536");
  check(n_layers >= 1 && n_layers <= 1024, "n_layers", n_layers, "1..1024");
  check(n_heads >= 1 && n_heads <= 1024, "n_heads", n_heads, "1..1024");
  check(n_kv_heads >= 1 && n_heads % n_kv_heads == 0, "n_kv_heads", n_kv_heads,
        "a divisor of n_heads = " + std::to_string(n_heads));
  check(head_dim >= 16 && head_dim <= 256, "head_dim", head_dim, "16..256 (the fused attention kernels')");
  check(d_ff >= 1 && d_ff <= (int64_t(1) << 20), "d_ff", d_ff, "1..2^20");
  check(norm_eps > 0 && norm_eps < 1, "norm_eps", norm_eps, "(0, 1)");
  check(!fused_qkv || n_kv_heads == n_heads, "n_kv_heads", n_kv_heads,
        "n_heads with a fused qkv projection (GPT-NeoX has no grouped keys)");
  check(sliding_window >= 0, "sliding_window", sliding_window, ">= 0 (0: none)");
}

std::vector<TensorSlot> tensor_slots(const Architecture& a) {
  const int64_t d = a.d_model, hq = a.n_heads * a.head_dim, hkv = a.n_kv_heads * a.head_dim, ff = a.d_ff;
  std::vector<TensorSlot> out;
  // A block's tensors are named "layers.<i>.<part>.weight|bias"; the others "<part>.weight|bias", the embedding
  // and the head "embed" and "lm_head".
  auto add = [&](int64_t layer, const std::string& part, bool bias, std::vector<int64_t> shape) {
    std::string name = layer >= 0 ? "layers." + std::to_string(layer) + "." + part : part;
    if (part != "embed" && part != "lm_head") name += bias ? ".bias" : ".weight";
    out.push_back({std::move(name), std::move(shape), layer, part, bias});
  };
  auto norm = [&](int64_t layer, const std::string& part) {
    add(layer, part, false, {d});
    if (a.norm == NormKind::LayerNorm) add(layer, part, true, {d});
  };
  auto linear = [&](int64_t layer, const std::string& part, int64_t rows, int64_t cols, bool bias) {
    add(layer, part, false, {rows, cols});
    if (bias) add(layer, part, true, {rows});
  };
  add(-1, "embed", false, {a.vocab_size, d});
  for (int64_t i = 0; i < a.n_layers; ++i) {
    norm(i, "attn_norm");
    if (a.fused_qkv) {
      linear(i, "qkv", 3 * hq, d, a.qkv_bias);
    } else {
      linear(i, "q", hq, d, a.qkv_bias);
      linear(i, "k", hkv, d, a.qkv_bias);
      linear(i, "v", hkv, d, a.qkv_bias);
    }
    linear(i, "o", d, hq, a.out_bias);
    norm(i, "mlp_norm");
    if (a.mlp == MlpKind::SwiGlu) linear(i, "gate", ff, d, a.mlp_bias);
    linear(i, "up", ff, d, a.mlp_bias);
    linear(i, "down", d, ff, a.mlp_bias);
  }
  norm(-1, "final_norm");
  if (!a.tie_embeddings) add(-1, "lm_head", false, {a.vocab_size, d});
  return out;
}

}  // namespace rotary::engine
