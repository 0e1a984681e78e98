// lab/experiments/extrapolate_methods.h: the inference-time methods of `rotary extrapolate` (seed 004's table) and the
// encoding override that realises each one on a RoPE model trained at length L and run at length T (torch-free).
//
//   rope          plain RoPE, positions beyond L extrapolated ("Baseline")
//   pi            position interpolation: linear scaling, factor T / L
//   ntk           fixed NTK-aware: base' = base * (T / L)^(r / (r - 2))
//   ntk_mixed     Su's per-pair mix: inv_j / exp(a j^b), factor T / L
//   dynamic       HF dynamic NTK over max_position_embeddings = L: each token uses the base for its own length
//                 (scored by decoding, see extrapolate_eval.h)
//   yarn          NTK-by-parts + attention factor, factor T / L, original context L
//   rerope        ReRoPE(w): distances >= w clipped to w
//   leaky_rerope  Leaky ReRoPE(w, k): distances beyond w grow by 1/k per token
// Each with or without log-n (q_n *= max(1, ln(n + 1) / ln L)): "log n" on a model trained with it, "log n†" when
// only the test adds it (seed 004's notation).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rotary_nn/config.h"

namespace rotary::experiments {

inline constexpr std::string_view kExtrapolateMethods[] = {"rope", "pi",     "ntk",    "ntk_mixed",
                                                           "dynamic", "yarn", "rerope", "leaky_rerope"};
// `rotary perplexity` on a real checkpoint adds "native": the checkpoint's own rope as its config.json says
// (Llama 3.1's llama3 scaling, Qwen's yarn, or none). There the factor methods replace the checkpoint's scaling
// (they start from its unscaled frequencies, "rope" included), and rerope / leaky_rerope keep it (their windows
// sit on the checkpoint's own frequencies).
inline constexpr std::string_view kCheckpointMethods[] = {"native",  "rope", "pi",     "ntk",         "ntk_mixed",
                                                          "dynamic", "yarn", "rerope", "leaky_rerope"};

struct Method {
  std::string name;     // one of kExtrapolateMethods
  bool logn = false;    // log-n query scaling at test time
  int64_t window = 0;   // rerope, leaky_rerope
  double leaky_k = 0;   // leaky_rerope
  double dynamic_factor = 1;  // dynamic: HF's factor (1: base' = base * (S / L)^(r / (r - 2)) at length S > L)
  // Checkpoints (rotary perplexity --memory): what each query attends to. "": the whole window (full attention);
  // "memory": the last memory_window to 2x that many tokens exact and the top-k rows of a retrieval memory of the
  // rest (policy memory_policy); "window": those tokens alone (top-k 0: the memory's baseline).
  std::string context;
  std::string memory_policy;   // exact, rerope, none, unlimiformer (rotary/kv_memory.h)
  int64_t memory_window = 0;   // W
  int memory_top_k = 0;
  std::string memory_dtype = "f32";
  std::string memory_search = "exact";  // exact, pages, kdtree, pages<P>, kdtree<P>, faiss-flat / -hnsw / -ivf
  int64_t memory_page_size = 32;

  // Machine name for files and CSV: "rerope_w64_logn".
  std::string key() const;
  // Row label in seed 004's style: "ReRoPE-w64-log n†" (trained_logn: the model was trained with log-n, so
  // "log n" has no dagger and a method without it is "no log n").
  std::string label(bool trained_logn) const;
};

// Throws rotary::Error listing the choices for an unknown name (checkpoint: kCheckpointMethods, else
// kExtrapolateMethods).
void check_method_name(const std::string& name, const std::string& field, bool checkpoint = false);

// The override that runs `m` on a model whose trained encoding is `trained` (kind rope; rope.head_dim and
// rotary_dim resolved) at test length test_len, trained at train_len. Every field the method does not change
// is the trained one, so at test_len == train_len the factor-based methods (pi, ntk, ntk_mixed, dynamic, yarn)
// compute plain RoPE. A trained scaling (a real checkpoint's) is replaced by the factor methods and kept by
// native, rerope and leaky_rerope; the lab's own models train without one.
nn::EncodingOverride method_override(const Method& m, const nn::EncodingConfig& trained, int64_t train_len,
                                     int64_t test_len);

// True when the method's frequencies change with the current length (dynamic NTK): a full-window forward would
// give every token the frequencies of the whole window, so it is scored by decoding instead.
bool length_dependent_method(const Method& m);

}  // namespace rotary::experiments
