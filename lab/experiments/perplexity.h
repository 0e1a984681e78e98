// lab/experiments/perplexity.h: `rotary perplexity` - seed 004's measurement of a real checkpoint run past its
// context: for every test length T and method, the loss on the LAST L tokens of windows of T tokens (L: the
// context the checkpoint was trained at), so every length scores the same tokens and only the context before
// them grows ("longer context, lower loss" is the claim), and the loss over the whole window.
//
// Windows: the token stream (a text tokenized with the checkpoint's own tokenizer, or a token-id file) is cut into
// `windows` rows of T_max + 1 consecutive tokens; the window of length T is the last T + 1 tokens of a row, so the
// scored tokens are the same at every length. Each window runs one full forward through the fused kernels (memory
// linear in T: no T x T buffer) and the LM head in chunks of positions (no T x V logits).
//
// Methods (experiments/extrapolate_methods.h, kCheckpointMethods): native (the checkpoint's own rope), rope (its
// scaling removed), pi, ntk, ntk_mixed, dynamic, yarn (factor T / L), rerope and leaky_rerope (window w on the
// checkpoint's frequencies), each with or without log-n. dynamic runs as transformers runs a forward: every token
// uses the frequencies for the window's length.
//
// With a memory (PerplexitySpec::memory, --memory): every method also runs through a retrieval memory (the last W to
// 2W tokens exact, the top-k of the rest) and through that window alone - Unlimiformer's book evaluation beside
// full attention (Method::context).
//
// Layout of <out>: cells/<method>/T<len>.json (a rerun reuses each cell whose settings match), results.csv,
// report.md, loss_vs_length.png, loss_vs_position.png.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "experiments/cell_store.h"
#include "experiments/checkpoint_model.h"
#include "experiments/extrapolate_methods.h"
#include "rotary_nn/config.h"

namespace rotary::experiments {

struct PerplexitySpec {
  std::string model_dir;            // a Hugging Face model directory (rotary_nn/hf_checkpoint.h)
  std::string text_file;            // text, tokenized with the checkpoint's tokenizer...
  std::string tokens_file;          // ...or whitespace-separated token ids (exactly one of the two)
  std::vector<int64_t> lengths;     // test lengths T (empty: L, 2L, 4L)
  std::vector<std::string> methods{"native", "ntk", "yarn", "rerope"};
  std::vector<bool> logn{false};    // log-n variants of every method
  int64_t train_len = 0;            // L (0: the checkpoint's trained context)
  int64_t window = 0;               // rerope / leaky_rerope window w (0: L / 2)
  double leaky_k = 16;              // leaky_rerope k
  double dynamic_factor = 1;        // dynamic NTK factor (transformers' "dynamic" rope_scaling factor)
  int windows = 1;                  // rows of T_max + 1 tokens
  int64_t head_chunk = 512;         // positions per LM-head chunk
  int threads = 0;                  // threads (0: all cores)
  CheckpointRunOptions run;         // engine (default: the torch-free engine), weights, KV cache dtype
  CheckpointMemoryOptions memory;   // set: every method also through a retrieval memory and through its window
                                    // alone (Unlimiformer's book evaluation: full attention, memory, window)
  std::string out_dir = "runs/perplexity";
  std::string command_line;         // recorded in the report
};

// Checks every setting that can be checked before the model is read (rotary::Error naming the flag's field).
void validate(const PerplexitySpec& spec);

// The loss of one window: tokens [T + 1] (inputs [0, T), targets [1, T]).
struct WindowLoss {
  double tail_loss = 0;    // mean cross entropy over the last `tail` targets
  double full_loss = 0;    // over all T targets
  std::vector<double> loss_by_position;  // [T]
};
// The model's forward on one window (through the memory set on `model`, if any, a chunk at a time), the LM head
// taken `head_chunk` positions at a time (float32 logits, the cross entropy in double).
WindowLoss window_loss(CheckpointModel& model, const std::vector<int64_t>& tokens, int64_t tail, int64_t head_chunk);

struct PerplexityCell {
  Method method;
  int64_t length = 0;
  double tail_loss = 0;     // mean over windows and the last L targets
  double full_loss = 0;     // mean over windows and all targets
  int64_t tail_tokens = 0, full_tokens = 0;
  std::vector<double> loss_by_bin;  // mean loss of 64 equal stretches of positions (for the position plot)
  double seconds = 0;
  double tokens_per_s = 0;  // input tokens through the model per second
  bool reused = false;
};

struct PerplexityResult {
  std::string model_description;
  int64_t train_len = 0;
  int64_t stream_tokens = 0;
  std::vector<int64_t> lengths;
  std::vector<PerplexityCell> cells;
  std::string table;        // the tail-loss table (methods x lengths), as printed
  std::string report_md, csv;
  std::string plot_problem; // why there are no PNGs ("" when there are)
  RunOutcome run;
  double seconds = 0;
  // Cells whose loss is NaN or Inf ("<method> at T=<length>"), which are stored and reported as such: the command
  // exits with the status of a non-finite training loss when there is any.
  std::vector<std::string> non_finite;
};

PerplexityResult run_perplexity(const PerplexitySpec& spec, bool progress);

}  // namespace rotary::experiments
