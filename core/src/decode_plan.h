// core/src/decode_plan.h (internal): planning and combining of the decode step, shared by attention_decode
// (decode.cpp) and the re-rotating baseline (decode_baseline.cpp). C is the compute type: float, or double for
// F64 caches.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "rotary/kv_cache.h"

namespace rotary::decode_detail {

// What one sequence's tasks read.
struct SeqPlan {
  int64_t n = 0, q_pos = 0, near_begin = 0;
  const void* k_plain = nullptr;
  int64_t k_plain_head = 0;  // elements from one kv head's k_plain rows to the next
  const void* k_near = nullptr;
  const void* v_plain = nullptr;
  const void* v_near = nullptr;
  // KvStorage::Q8: each array's scales (the k_plain ones k_plain_head / kQ8Block apart per kv head); else null.
  const float* k_plain_scales = nullptr;
  const float* k_near_scales = nullptr;
  const float* v_plain_scales = nullptr;
  const float* v_near_scales = nullptr;
  bool rotate_near_values = false;
  int64_t chunks = 1, first_task = 0;
};

// Prepared queries of sequence b, softmax scale and log-n folded in: plain[Hq, row_stride] scores the plain keys,
// near[Hq, row_stride] (rotary part times a^2, as the table is a pure rotation) the near ones. `baseline`: the
// keys were re-rotated by R(-d), so plain = near.
template <class C>
void prepare_queries(const KvCache& cache, const DecodeParams& p, int64_t b, int64_t q_pos, double scale, bool baseline,
                     C* plain, C* near);

// Runs the split-K tasks of every sequence (decode_chunk.h) and combines them into p.o and p.lse. The rows are
// stored as `key_type` (or q8 blocks: key_storage Q8).
template <class C>
void decode_planned(std::span<const KvCache* const> caches, const DecodeParams& p, std::vector<SeqPlan>& plans,
                    const std::vector<C>& q_plain, const std::vector<C>& q_near, DType key_type,
                    KvStorage key_storage, int threads);

int resolve_threads(const DecodeParams& p);
double resolve_scale(const DecodeParams& p, int D);
int64_t resolve_q_pos(const KvCache& c, const DecodeParams& p, int64_t b);

}  // namespace rotary::decode_detail
