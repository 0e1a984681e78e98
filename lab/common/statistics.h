// lab/common/statistics.h: the summary statistics benchmarks and reports print, defined once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace rotary::lab {

// The median of `v` (for an even count the upper of the two middle values: a value that was measured); NaN for
// none.
inline double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace rotary::lab
