// tests/core/cases_rope.h: the frequencies the rope cases use, shared with the property tests of
// test_rope_kernels.cpp.
#pragma once

#include <vector>

#include "op_harness.h"
#include "rotary/rope_spec.h"

namespace rotary::test {

// inv_freq[i] = base^(-2i / (2 pairs)): the default RoPE frequencies over `pairs` pairs.
std::vector<double> default_inv_freq(int pairs, double base = 10000.0);
// Head dim D, rotary dim r, default frequencies.
RopeFreqs rope_test_freqs(int D, int r, RopeLayout layout, double attention_factor = 1.0);

}  // namespace rotary::test
