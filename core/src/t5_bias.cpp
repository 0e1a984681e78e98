// core/src/t5_bias.cpp: T5's relative position buckets (rotary/t5_bias.h).
#include "rotary/t5_bias.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "rotary/error.h"

namespace rotary {

void validate_t5_buckets(int num_buckets, int max_distance, bool bidirectional) {
  check(num_buckets >= 2 && num_buckets <= 4096 && (!bidirectional || num_buckets % 2 == 0), "t5_num_buckets",
        num_buckets, bidirectional ? "an even number in [2, 4096]" : "an integer in [2, 4096]");
  const int exact = (bidirectional ? num_buckets / 2 : num_buckets) / 2;
  check(max_distance > exact, "t5_max_distance", max_distance,
        "an integer > " + std::to_string(exact) + " (the exact buckets' range: the log buckets start there)");
}

int t5_relative_bucket(int64_t query_pos, int64_t key_pos, bool bidirectional, int num_buckets, int max_distance) {
  int64_t n = query_pos - key_pos;  // how far back the key is
  int bucket = 0;
  if (bidirectional) {
    num_buckets /= 2;
    if (n < 0) bucket += num_buckets;  // keys after the query get the upper half
    n = n < 0 ? -n : n;
  } else {
    n = std::max<int64_t>(n, 0);
  }
  const int max_exact = num_buckets / 2;
  if (n < max_exact) return bucket + int(n);
  // float32 throughout, as Hugging Face computes it (a float64 log could land on the other side of an integer).
  const float scaled = std::log(float(n) / float(max_exact)) / std::log(float(max_distance) / float(max_exact)) *
                       float(num_buckets - max_exact);
  const int64_t large = max_exact + int64_t(scaled);  // truncation toward zero, as .to(torch.long); scaled >= 0
  return bucket + int(std::min<int64_t>(large, num_buckets - 1));
}

}  // namespace rotary
