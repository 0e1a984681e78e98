// lab/tasks/random.cpp: bounded integers from raw mt19937_64 words (see random.h for why).
#include "tasks/random.h"

#include "rotary/error.h"

namespace rotary::lab {

uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  check(n >= 1, "uniform_below n", n, ">= 1");
  // The high word of x * n is uniform in [0, n) except for the 2^64 mod n values of x whose low word falls below
  // that threshold; rejecting those makes every result equally likely.
  unsigned __int128 m = static_cast<unsigned __int128>(rng()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    while (low < threshold) {
      m = static_cast<unsigned __int128>(rng()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

int64_t uniform_int(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  check(lo <= hi, "uniform_int range", to_text(lo) + ".." + to_text(hi), "lo <= hi");
  const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;  // 0 means all 2^64 values
  const uint64_t draw = span == 0 ? rng() : uniform_below(rng, span);
  return static_cast<int64_t>(static_cast<uint64_t>(lo) + draw);
}

std::string random_string(std::mt19937_64& rng, std::string_view alphabet, int64_t count) {
  std::string s(static_cast<size_t>(count), '\0');
  for (char& c : s) c = alphabet[uniform_below(rng, alphabet.size())];
  return s;
}

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

std::mt19937_64 derived_rng(uint64_t seed, uint64_t stream, uint64_t index) {
  return std::mt19937_64(splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index));
}

}  // namespace rotary::lab
