// lab/tasks/random.h: portable random draws for the task generators.
//
// std::uniform_int_distribution and friends are implementation-defined (libstdc++ and libc++ give different
// numbers for the same engine state), so a task seeded the same way would train on different data on another
// standard library. std::mt19937_64 itself is fully specified, so we draw raw 64-bit words from it and turn them
// into bounded integers ourselves (Lemire, "Fast Random Integer Generation in an Interval", 2019).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>

namespace rotary::lab {

// Uniform in [0, n) for n >= 1, unbiased (Lemire's multiply-and-reject).
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n);

// Uniform in [lo, hi] (inclusive), lo <= hi.
int64_t uniform_int(std::mt19937_64& rng, int64_t lo, int64_t hi);

// `count` characters drawn uniformly from `alphabet`.
std::string random_string(std::mt19937_64& rng, std::string_view alphabet, int64_t count);

// A generator for stream `stream` (one per purpose: held-out rows, eval problems) and item `index` of a user
// seed; splitmix64 mixes the three so nearby seeds and indices give unrelated states.
std::mt19937_64 derived_rng(uint64_t seed, uint64_t stream, uint64_t index);

// The purposes, kept distinct so held-out rows and eval problems never reuse each other's draws.
inline constexpr uint64_t kHeldoutStream = 0x68656c646f7574ULL;  // "heldout"
inline constexpr uint64_t kEvalStream = 0x6576616cULL;           // "eval"

}  // namespace rotary::lab
