// Fuzz target: a GGUF file as a model's description and tokenizer (rotary_engine/gguf_model.h read_gguf_model,
// rotary_tokenizers gguf_tokenizer) on any bytes the core's reader takes. Each is refused with a rotary::Error or
// succeeds; a description it reads passes Architecture::validate and its RopeSpec gives frequencies, every slot has a
// GGUF name, and a tokenizer it makes encodes and decodes a short text (ids inside its vocabulary). Seeds: the gguf
// target's corpus (fuzz/corpus/gguf, fuzz/gguf_seeds.py), whose files carry llama / qwen2 metadata and tokenizers.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "rotary/error.h"
#include "rotary/gguf.h"
#include "rotary_engine/gguf_model.h"
#include "rotary_tokenizers/tokenizer.h"

namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "broken invariant: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<rotary::GgufFile> file;
  try {
    file.emplace(rotary::GgufFile::from_bytes(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz"));
  } catch (const rotary::Error&) {
    return 0;
  }
  try {
    const rotary::engine::HfModelDescription d = rotary::engine::read_gguf_model(*file);
    d.arch.validate();
    if (d.rope.freqs().inv_freq.size() != size_t(d.rope.rotary_dim_resolved() / 2)) broken("rope pairs");
    for (const rotary::engine::HfTensorName& n : rotary::engine::gguf_tensor_names(d))
      if (n.stored.empty()) broken("a slot without a GGUF name");
  } catch (const rotary::Error&) {
  }
  try {
    const auto tok = rotary::tokenizers::gguf_tokenizer(*file);
    for (const int64_t id : tok->encode_for_model("Hello  world 123 <s>\n\xc3\xa9"))
      if (id < 0 || id >= tok->vocab_size()) broken("an id outside the vocabulary");
    (void)tok->decode(tok->encode("a b"));
  } catch (const rotary::Error&) {
  }
  return 0;
}
