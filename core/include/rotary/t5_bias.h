// rotary/t5_bias.h: T5's relative position buckets (Raffel et al. 2020, "Exploring the limits of transfer
// learning"; seed 002 compares rotary with it). A learned bias per head and bucket is added to every attention
// score; the bucket of a key-query offset is exact for small distances and logarithmic up to max_distance:
//
//   n = query_pos - key_pos                      (causal: n < 0, a key after its query, is bucket 0)
//   bidirectional: half the buckets for keys after the query (offset num_buckets / 2), n = |n|
//   n < max_exact = buckets / 2:  bucket n
//   otherwise:                    max_exact + floor(ln(n / max_exact) / ln(max_distance / max_exact)
//                                                   * (buckets - max_exact)),  at most buckets - 1
//
// computed in float32 as Hugging Face's T5Attention._relative_position_bucket does, so buckets match T5
// checkpoints exactly. Defaults (T5): 32 buckets, max_distance 128; causal: distance 7 -> 7, 16 -> 16, 32 -> 21,
// 64 -> 26, 127 and beyond -> 31.
#pragma once

#include <cstdint>

namespace rotary {

// rotary::Error naming the field unless 2 <= num_buckets <= 4096 (even when bidirectional) and
// max_distance > the exact range (num_buckets / 2, halved again when bidirectional).
void validate_t5_buckets(int num_buckets, int max_distance, bool bidirectional);

// The bucket in [0, num_buckets) of a key at key_pos seen from a query at query_pos (arguments as validated).
int t5_relative_bucket(int64_t query_pos, int64_t key_pos, bool bidirectional, int num_buckets, int max_distance);

}  // namespace rotary
