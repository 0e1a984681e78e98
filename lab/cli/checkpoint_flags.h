// lab/cli/checkpoint_flags.h: the flags that choose how a Hugging Face checkpoint runs (--engine, --weights,
// --kv-dtype, --activations) and its retrieval memory (--memory, --memory-window, --top-k, --memory-dtype), declared once for
// every command that runs one (perplexity, generate, bench checkpoint).
#pragma once

#include <CLI/CLI.hpp>

#include <vector>

#include "cli/options.h"
#include "experiments/checkpoint_model.h"

namespace rotary::cli {

// Returns the four options (a command that also runs other models refuses them there).
inline std::vector<CLI::Option*> add_checkpoint_run_flags(CLI::App& app, experiments::CheckpointRunOptions& o) {
  return {app.add_option("--engine", o.engine,
                 "engine: the torch-free engine, weights used in place (default); torch: the nn model with float32 "
                 "copies of the weights (the reference path)"),
          app.add_option("--weights", o.weights,
                 "engine: convert the weight matrices at load to f32, f16, bf16, q8 (int8 blocks of 32 with an "
                 "f16 scale, llama.cpp's Q8_0 numbers: 1.0625 bytes a weight), or one of llama.cpp's block formats "
                 "q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k (the bytes its quantizer writes; Q4_K 4.5 bits a weight; rows of whole "
                 "blocks: 32 weights, 256 for the k-quants); default: as stored")
              ->check(non_empty("f32, f16, bf16, q8, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k (leave --weights out for the "
                                "weights as stored)")),
          app.add_option("--kv-dtype", o.kv_dtype, "engine: KV cache storage f32, bf16, f16, or q8 (int8 blocks of 32 with a float scale: 1.125 bytes a "
                 "feature; rows stored for decoding, so not perplexity's one-pass scoring; default f32)"),
          app.add_option("--activations", o.activations,
                 "engine: the linear layers' activations: auto (default) - q8 when every matrix is q8 or a block "
                 "format (as llama.cpp's products take them), f32 otherwise; f32; bf16 - rounded to bf16 as "
                 "llama.cpp's bf16 products do, for the CPU's bf16 dot products (bf16 weights only); or q8 - "
                 "quantized per block of 32 as llama.cpp's Q8_0 products do, for the CPU's integer products "
                 "(--weights q8 or a block format, or a GGUF file's blocks as stored)")};
}

// The memory flags, kept for the checks that need to know which were given.
struct CheckpointMemoryFlags {
  CLI::Option *memory = nullptr, *window = nullptr, *top_k = nullptr, *dtype = nullptr, *search = nullptr,
              *page_size = nullptr;
  std::vector<CLI::Option*> all() const { return {memory, window, top_k, dtype, search, page_size}; }
  // rotary::Error naming a flag given without the one it needs (even at its default value): --memory-window,
  // --top-k, --memory-dtype and --search without --memory; --page-size without a page search.
  void check_given_together(const experiments::CheckpointMemoryOptions& o) const {
    for (const CLI::Option* flag : {window, top_k, dtype, search})
      check_given_only_with(flag, o.enabled(), "with --memory (it sets the retrieval memory that --memory turns on)");
    check_given_only_with(page_size, experiments::is_paged_search(o.search),
                          "with --search pages, kdtree, pages<P> or kdtree<P> (the page search's rows per page; "
                          "--search is " + o.search + ")");
  }
};

// A command that takes them calls check_given_together before its work (one that also runs other models refuses
// them there).
inline CheckpointMemoryFlags add_checkpoint_memory_flags(CLI::App& app, experiments::CheckpointMemoryOptions& o) {
  CheckpointMemoryFlags f;
  f.memory = app.add_option("--memory", o.policy,
                 "a retrieval memory past a window of exact tokens (seed 001): exact (retrieved keys at their true "
                 "positions), rerope (at distance w: the ReRoPE window with --kind rerope, else the memory window), "
                 "none (unrotated), unlimiformer; engine only")
                 ->check(non_empty("exact, rerope, none, unlimiformer (leave --memory out for no memory)"));
  f.window = app.add_option("--memory-window", o.window,
                 "--memory: tokens kept exact, W to 2W (default half the trained context)")
                 ->transform(integer_in(1, kMaxAbsPosition));
  f.top_k = app.add_option("--top-k", o.top_k, "--memory: memory rows retrieved per head and token (default 32; 0: "
                                               "the window alone)")
                ->transform(integer_in(0, 1 << 20));
  f.dtype = app.add_option("--memory-dtype", o.dtype, "--memory: the memory's keys and values f32, bf16, f16 (default "
                                                      "f32)");
  f.search = app.add_option("--search", o.search,
                 "--memory: how the top-k is found: exact (scan every row; default), pages / kdtree (rotary/"
                 "memory_pages.h: pages of consecutive tokens / of alike keys, certified exact), pages<P> / "
                 "kdtree<P> (the best P pages only), graph / graph<W> (rotary/memory_graph.h: keys linked by the "
                 "queries that rank them, learnt from the prompt's; search width W, default 128), faiss-flat / "
                 "faiss-hnsw / faiss-ivf (FAISS's exact scan, "
                 "HNSW graph, IVF lists: lab/memory/memory_index.h's defaults)");
  f.page_size = app.add_option("--page-size", o.page_size, "--search pages / kdtree: rows per page (default 32)")
                    ->transform(integer_in(1, 65536));
  return f;
}

}  // namespace rotary::cli
