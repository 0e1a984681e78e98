// core/src/kv_memory_impl.h (internal): KvMemory's state, shared by kv_memory.cpp (the memory: storage, policies,
// append, the search query) and kv_memory_file.cpp (save, open, open_bytes).
#pragma once

#include <cstdint>
#include <vector>

#include "mapped_file.h"
#include "rotary/kv_memory.h"

namespace rotary {

struct KvMemory::Impl {
  KvMemoryConfig config;
  RopeFreqs freqs;
  // Owned storage per kv head, [size, D]: f32 in keys / values, bf16 or f16 bits in keys16 / values16.
  std::vector<std::vector<float>> keys, values;
  std::vector<std::vector<uint16_t>> keys16, values16;
  std::vector<int64_t> positions;
  // A memory read by open_bytes (open(): from its file's mapping): the storage is borrowed, read-only, and these
  // point into it. `map`: the mapping open() made, owned (unmapped with the memory); empty for open_bytes' caller's
  // bytes.
  bool borrowed = false;
  detail::MappedFile map;
  int64_t mapped_size = 0;
  const int64_t* mapped_positions = nullptr;
  std::vector<const void*> mapped_keys, mapped_values;
};

}  // namespace rotary
