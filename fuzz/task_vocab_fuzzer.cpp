// Fuzz target: the tokenizers of the character tasks (addition, substring_index, substring_search,
// kv_retrieval), whose encode takes any text a user prompts `rotary generate` with and whose decode takes any ids
// a model generates. (The text task's BPE vocabulary is fuzzed from its file in text_cache_fuzzer.cpp; its encode
// runs the spm_encode program.)
//
// Input: byte 0 picks the task, byte 1 the direction, the rest is the text to encode or the ids (int32, little
// endian) to decode. Only rotary::Error may come out, and what does come out must invert: decode(encode(text)) is
// the text, encode(decode(ids)) the ids without pads.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "rotary/error.h"
#include "tasks/task.h"

namespace {

const std::vector<std::unique_ptr<rotary::lab::Task>>& char_tasks() {
  static const auto* tasks = [] {
    auto* out = new std::vector<std::unique_ptr<rotary::lab::Task>>;
    for (const char* name : {"addition", "substring_index", "substring_search", "kv_retrieval"})
      out->push_back(rotary::lab::make_task(name));
    return out;
  }();
  return *tasks;
}

[[noreturn]] void finding(const std::string& task, const char* what) {
  std::fprintf(stderr, "%s: %s\n", task.c_str(), what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const rotary::lab::Task& task = *char_tasks()[data[0] % char_tasks().size()];
  const rotary::lab::Vocab& vocab = task.vocab();
  const bool encode_first = (data[1] & 1) == 0;
  data += 2;
  size -= 2;
  if (encode_first) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    std::vector<int32_t> ids;
    try {
      ids = vocab.encode(text);
    } catch (const rotary::Error&) {
      return 0;
    }
    for (const int32_t id : ids)
      if (id <= vocab.pad_id() || id >= vocab.size()) finding(task.name(), "encode gave a pad or out-of-range id");
    if (vocab.decode(ids) != text) finding(task.name(), "decode(encode(text)) != text");
  } else {
    std::vector<int32_t> ids(size / sizeof(int32_t));
    if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * sizeof(int32_t));
    std::string text;
    try {
      text = vocab.decode(ids);
    } catch (const rotary::Error&) {
      return 0;
    }
    std::vector<int32_t> without_pads;
    for (const int32_t id : ids)
      if (id != vocab.pad_id()) without_pads.push_back(id);
    if (vocab.encode(text) != without_pads) finding(task.name(), "encode(decode(ids)) != ids without pads");
  }
  return 0;
}
