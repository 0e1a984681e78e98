// rotary/rope_table.h: rotate by cos / sin tables the caller gives (rope.h computes them from frequencies).
//
// This is the contract of flash-attn's apply_rotary_emb and of transformers' (and Liger's) apply_rotary_pos_emb:
// the model computed cos and sin once ([positions, width]) and each token picks a row. Token t of x [tokens,
// heads, head_dim] (a strided HeadsView, as in rope.h) uses row rows[t]; features [0, rotary_dim) rotate, the rest
// are copied (out of place) or left alone (in place). Pair i joins features (a, b) = rope_pair(layout, r, i).
//
// Table width (TableWidth): flash-attn's tables hold one cos / sin per pair ([rows, rotary_dim / 2]); transformers'
// hold one per feature ([rows, rotary_dim], the pair's value repeated: cat(freqs, freqs)). With per-feature tables
// feature a reads c_a, s_a and feature b reads c_b, s_b, which is exactly transformers' formula
//   y = x * cos + rotate_half(x) * sin:  y_a = x_a c_a - x_b s_a,  y_b = x_b c_b + x_a s_b
// even when a table's two halves differ (then it is not a rotation, but it is what transformers computes).
// Transpose gives the adjoint of that map (the gradient): y_a = x_a c_a + x_b s_b, y_b = x_b c_b - x_a s_a;
// for tables whose halves agree that is the rotation by the negated angle.
//
// The tables are float32 (float64 when dtype is F64): the torch layer converts the user's tables once per call.
// Arithmetic is float32 (float64 for F64 storage), each output rounded once to the storage type.
// rope_table_apply is the fast kernel (Highway SIMD, runtime dispatch, OpenMP over tokens);
// rope_table_apply_reference is the float64 oracle with the same contract.
#pragma once

#include <cstdint>

#include "rotary/dtype.h"
#include "rotary/rope.h"
#include "rotary/rope_spec.h"

namespace rotary {

enum class TableWidth : uint8_t {
  Pairs,     // [rows, rotary_dim / 2]: pair i reads entry i (flash-attn, Liger's rotary kernels)
  Features,  // [rows, rotary_dim]: feature j reads entry j (transformers' cos / sin)
};

struct RopeTableParams {
  int head_dim = 0;
  int rotary_dim = 0;                  // even, <= head_dim
  RopeLayout layout = RopeLayout::HalfSplit;
  TableWidth width = TableWidth::Pairs;
  const void* cos = nullptr;           // [table_rows, row_stride >= width], float32 (float64 for F64 storage)
  const void* sin = nullptr;
  int64_t table_rows = 0;
  int64_t row_stride = 0;              // elements from one table row to the next (the same for cos and sin)
  int64_t tokens = 0;
  const int64_t* rows = nullptr;       // [tokens]: the table row of each token, in [0, table_rows)
  DType dtype = DType::F32;            // storage of x
  HeadsView x_in, x_out;               // x_out.data == x_in.data rotates in place
  bool transpose = false;              // the adjoint (the gradient), see the file comment
  int threads = 0;                     // OpenMP threads at most; 0: omp_get_max_threads()

  // Entries per table row the width reads: rotary_dim / 2 or rotary_dim.
  int64_t table_width() const { return width == TableWidth::Pairs ? rotary_dim / 2 : rotary_dim; }
};

// Throws rotary::Error naming the first field that does not fit (dims, table shape, a row out of range, views).
void validate_rope_table_params(const RopeTableParams& p);

void rope_table_apply(const RopeTableParams& p);
void rope_table_apply_reference(const RopeTableParams& p);

}  // namespace rotary
