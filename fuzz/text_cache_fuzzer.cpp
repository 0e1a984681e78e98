// Fuzz target: what the text task reads from its cache directory and from the programs it runs, any of which a
// crash, a full disk or a user may have left in any state:
//   byte 0 % 4 == 0  a tokenizer table (bpe<V>.vocab), then after a NUL byte ids (int32, little endian) to decode
//                 1  the output of `spm_encode --output_format=id`
//                 2  a token id file (bpe<V>.<split>.ids), for the model hash kIdsModelHash
//                 3  the output of `bible` (the corpus)
// Only rotary::Error may come out (read_ids says false instead for a stale or broken ids file); an ids file it
// accepts must be exactly what write_ids writes for those ids.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "rotary/error.h"
#include "tasks/bpe_vocab.h"
#include "tasks/kjv_corpus.h"
#include "tasks/text_cache.h"

namespace {

// The hash the seed ids files carry (fuzz/corpus/text_cache/ids_*), so inputs reach past the hash check.
constexpr uint64_t kIdsModelHash = 0x0123456789abcdefULL;
constexpr int kSpmVocabSize = 2000;

void fuzz_vocab(const std::string& bytes) {
  const size_t nul = bytes.find('\0');
  const std::string table = bytes.substr(0, nul);
  std::vector<int32_t> ids;
  if (nul != std::string::npos) {
    ids.resize((bytes.size() - nul - 1) / sizeof(int32_t));
    if (!ids.empty()) std::memcpy(ids.data(), bytes.data() + nul + 1, ids.size() * sizeof(int32_t));
  }
  const rotary::lab::BpeVocab vocab("unused.model", table);
  std::vector<int32_t> every_id(size_t(vocab.size()));
  for (int32_t id = 0; id < vocab.size(); ++id) every_id[size_t(id)] = id;
  vocab.decode(every_id);
  vocab.decode(ids);
}

void fuzz_ids_file(const std::string& bytes) {
  std::vector<int32_t> ids;
  if (!rotary::lab::parse_ids(bytes, kIdsModelHash, ids)) return;
  // The layout write_ids writes (text_cache.h): magic, hash, count, ids.
  std::string expected(24 + ids.size() * sizeof(int32_t), '\0');
  const uint64_t count = ids.size();
  std::memcpy(expected.data(), "RTIDS001", 8);
  std::memcpy(expected.data() + 8, &kIdsModelHash, 8);
  std::memcpy(expected.data() + 16, &count, 8);
  if (!ids.empty()) std::memcpy(expected.data() + 24, ids.data(), ids.size() * sizeof(int32_t));
  if (expected != bytes) {
    std::fprintf(stderr, "parse_ids accepted %zu bytes that write_ids would not write for its %zu ids\n",
                 bytes.size(), ids.size());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 4) {
      case 0:
        fuzz_vocab(bytes);
        break;
      case 1:
        rotary::lab::parse_spm_ids(bytes, kSpmVocabSize);
        break;
      case 2:
        fuzz_ids_file(bytes);
        break;
      default:
        rotary::lab::parse_kjv(bytes);
        break;
    }
  } catch (const rotary::Error&) {
  }
  return 0;
}
