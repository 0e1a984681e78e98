// core/src/decode_chunk.h (internal): one split-K task of the decode step and the Highway kernel that runs it
// (decode_chunk_hwy.cpp). decode.cpp plans the tasks and combines them; decode_baseline.cpp reuses both.
#pragma once

#include <cstdint>

#include "rotary/dtype.h"
#include "rotary/kv_cache.h"

namespace rotary::decode_detail {

// One split-K task: the G query heads of one kv head against keys [begin, end) of one sequence.
// Keys [begin, near_begin) ("plain") score q_plain . k_plain[j] and add p_j v_plain[j] to acc; keys
// [near_begin, end) ("near") score q_near . R(-d) k_near[j], d = q_pos - pos[j] (cos/sin row d of the near table),
// and add p_j v_near[j] to acc_near - turned by R(-d) first when rotate_near_values (RoPER with ReRoPE/Leaky).
struct ChunkArgs {
  const void* k_plain = nullptr;  // [n, row_stride] storage type
  const void* k_near = nullptr;   // [n, row_stride] storage type (un-rotated keys)
  const void* v_plain = nullptr;  // [n, row_stride] storage type
  const void* v_near = nullptr;   // [n, row_stride] storage type
  // KvStorage::Q8: the arrays' scales (element e of an array at scales[e / kQ8Block]); null otherwise.
  const float* k_plain_scales = nullptr;
  const float* k_near_scales = nullptr;
  const float* v_plain_scales = nullptr;
  const float* v_near_scales = nullptr;
  const int64_t* pos = nullptr;   // [n]
  int64_t begin = 0, end = 0, near_begin = 0, q_pos = 0;
  const void* q_plain = nullptr;  // [G, row_stride] compute type
  const void* q_near = nullptr;   // [G, row_stride] compute type
  int groups = 1;
  int64_t row_stride = 0;
  int half = 0, pairs = 0;
  const void* table = nullptr;  // [table_rows, 2 * half] compute type
  int64_t table_rows = 0;
  const double* inv_freq = nullptr;  // for distances past the table
  bool rotate_near_values = false;
  void* m = nullptr;         // [G] running max of the scaled scores
  void* l = nullptr;         // [G] running sum of exp(score - m)
  void* acc = nullptr;       // [G, row_stride] running sum of exp(score - m) v over plain keys
  void* acc_near = nullptr;  // [G, row_stride] the same over near keys; may equal acc
};

// Runs one task with the kernel for keys and values stored as `t` (compute type f32, f64 for F64) or as q8
// blocks (storage Q8, compute f32), on the best SIMD target dispatch allows.
void run_chunk(DType t, KvStorage storage, const ChunkArgs& a);

}  // namespace rotary::decode_detail
