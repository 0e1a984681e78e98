// content_hash64 (rotary/content_hash.h): a value of the bytes alone - the same for any thread count, address or
// chaining of the calls' seeds as documented - and a different one for a change of any byte, a block's boundary
// and the last byte of an uneven tail included.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "expect_error.h"
#include "rotary/content_hash.h"

namespace rotary {
namespace {

std::vector<unsigned char> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  for (unsigned char& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

TEST(ContentHash, TheSameBytesGiveTheSameValueOnAnyThreadsAndAddress) {
  // Three blocks and an uneven tail: every path (whole lanes, words, bytes; one block and several).
  const size_t n = 3 * kContentHashBlock + 37;
  const std::vector<unsigned char> a = random_bytes(n, 1);
  std::vector<unsigned char> shifted(n + 3);
  std::copy(a.begin(), a.end(), shifted.begin() + 3);  // the same bytes at an odd address
  const uint64_t h1 = content_hash64(a.data(), n, 0, 1);
  EXPECT_EQ(h1, content_hash64(a.data(), n, 0, 2));
  EXPECT_EQ(h1, content_hash64(a.data(), n, 0, 7));
  EXPECT_EQ(h1, content_hash64(shifted.data() + 3, n, 0, 3));
  for (size_t small : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(31), size_t(32), size_t(33), size_t(1000)})
    EXPECT_EQ(content_hash64(a.data(), small, 0, 1), content_hash64(shifted.data() + 3, small, 0, 4)) << small;
}

TEST(ContentHash, AnyChangedByteLengthOrSeedGivesAnotherValue) {
  const size_t n = 2 * kContentHashBlock + 13;
  std::vector<unsigned char> a = random_bytes(n, 2);
  const uint64_t original = content_hash64(a.data(), n);
  std::set<uint64_t> seen{original};
  for (size_t at : {size_t(0), size_t(7), size_t(31), kContentHashBlock - 1, kContentHashBlock, n - 13, n - 1}) {
    a[at] ^= 0x10;
    EXPECT_TRUE(seen.insert(content_hash64(a.data(), n)).second) << "flip at " << at;
    a[at] ^= 0x10;
  }
  EXPECT_EQ(content_hash64(a.data(), n), original);  // restored: the first value again
  // Lengths that differ only by zero bytes, blocks swapped, another seed.
  std::vector<unsigned char> zeros(64, 0);
  EXPECT_NE(content_hash64(zeros.data(), 32), content_hash64(zeros.data(), 33));
  EXPECT_NE(content_hash64(zeros.data(), 0), content_hash64(zeros.data(), 1));
  std::vector<unsigned char> swapped(a.begin() + kContentHashBlock, a.begin() + 2 * kContentHashBlock);
  swapped.insert(swapped.end(), a.begin(), a.begin() + kContentHashBlock);
  EXPECT_NE(content_hash64(swapped.data(), swapped.size()), content_hash64(a.data(), swapped.size()));
  EXPECT_NE(content_hash64(a.data(), n, 1), content_hash64(a.data(), n, 2));
  EXPECT_NE(content_hash_mix(5, 1), content_hash_mix(5, 2));
  EXPECT_NE(content_hash_mix(5, 1), content_hash_mix(6, 1));
}

TEST(ContentHash, AFileHashesAsItsBytesAndIsRefusedByNameWhenNotARegularFile) {
  const std::vector<unsigned char> a = random_bytes(kContentHashBlock + 5, 3);
  const std::string path = ::testing::TempDir() + "/rotary_content_hash_" + std::to_string(::getpid());
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(a.data()), std::streamsize(a.size()));
  int64_t bytes = -1;
  EXPECT_EQ(content_hash_file(path, "weights", &bytes), content_hash64(a.data(), a.size()));
  EXPECT_EQ(bytes, int64_t(a.size()));
  std::remove(path.c_str());
  test::expect_error([&] { content_hash_file(path, "weights"); }, {"weights = " + path, "No such file"});
  test::expect_error([&] { content_hash_file(::testing::TempDir(), "weights"); }, {"weights", "a directory"});
}

}  // namespace
}  // namespace rotary
