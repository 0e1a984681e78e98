// rotary/content_hash.h: a 64-bit hash of bytes by content, fast enough to identify gigabytes of weights on every
// run (a saved context's model, the perplexity cells' weights) where FNV-1a's byte at a time would take minutes.
//
// The bytes are cut into blocks of kContentHashBlock; each block is hashed on its own (four 64-bit lanes, a
// multiply-rotate round per word, as xxHash64's, then the block's length and a final avalanche), on as many threads
// as are given, and the blocks' hashes are folded in order. So the value depends only on the bytes - not on the
// thread count, the address or the machine (little-endian words, as every x86-64 and ARM64 reads them). Not
// cryptographic: it tells different weights apart, it does not resist someone forging a collision.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rotary {

inline constexpr size_t kContentHashBlock = size_t(1) << 20;

// The hash of `bytes` bytes at `data`, going on from `seed` (0 to start; chain calls by passing the last value).
// threads 0: OpenMP's default.
uint64_t content_hash64(const void* data, size_t bytes, uint64_t seed = 0, int threads = 0);

// A value folded into a running hash (a length, a dtype, a flag), so that metadata and content chain alike.
uint64_t content_hash_mix(uint64_t hash, uint64_t value);

// The hash of the regular file `path`'s bytes (mapped, not copied), and its size in *bytes when given. Errors name
// `field` (rotary/files.h's open_regular_file: missing, a directory, a FIFO, a symlink loop, ...).
uint64_t content_hash_file(const std::string& path, std::string_view field, int64_t* bytes = nullptr, int threads = 0);

}  // namespace rotary
