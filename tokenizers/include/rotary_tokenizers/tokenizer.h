// rotary_tokenizers/tokenizer.h: a Hugging Face checkpoint's own tokenizer, read from its model directory and run
// here (no Python, no torch, no libsentencepiece), so that the lab can feed a pretrained model the ids it was
// trained on. docs/tokenizers.md says what is supported, how it is verified and what is refused.
//
// Two sources, in this order of preference:
//   tokenizer.json   the `tokenizers` library's file; model.type "BPE" only: byte-level BPE (GPT-2, Llama 3,
//                    Qwen2, GPT-NeoX, Mistral-Nemo) and sentencepiece-style BPE converted to JSON (Llama 2,
//                    Mistral 7B, TinyLlama). Run as `tokenizers` runs it: added tokens, normalizer,
//                    pre-tokenizer, BPE model, decoder.
//   tokenizer.model  a sentencepiece ModelProto, when there is no tokenizer.json; model_type BPE only. Run as
//                    sentencepiece runs it (its identity normalizer, score-ordered merges, byte fallback).
// Anything these files ask for that is not implemented is a rotary::Error naming the file, the field and its
// value: a tokenizer that silently produced other ids than the model was trained on would be worse than none.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rotary {
class GgufFile;  // rotary/gguf.h
}

namespace rotary::tokenizers {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // UTF-8 text -> token ids, without the model's BOS/EOS (special tokens written in the text, such as
  // "<|endoftext|>", are still recognised, as `tokenizers` does). The text is encoded as one string, newlines
  // included. Text that is not valid UTF-8 is a rotary::Error (both libraries take Unicode strings).
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  // Token ids -> text: each token's text through the tokenizer's decoder. Special tokens are kept as their text.
  // Byte tokens are joined into the bytes they stand for; where those bytes are not valid UTF-8 (a sequence cut
  // in the middle of a character) they are returned as they are, where the Python libraries would put U+FFFD.
  // An id outside [0, vocab_size()) or naming no token is a rotary::Error.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  // The text `continuation` adds after `prefix`: decode(prefix + continuation) with decode(prefix) taken off its
  // front, so the decoder's joining rules apply across the boundary (a sentencepiece decoder strips the leading
  // space of a text, so decode(continuation) alone loses the space before its first word). Where the decoded
  // prefix is not a prefix of the whole (a byte sequence completed across the boundary), decode(continuation).
  std::string decode_continuation(const std::vector<int64_t>& prefix, const std::vector<int64_t>& continuation) const;
  // One more than the largest id of any token (the model's embedding table may be larger still).
  virtual int64_t vocab_size() const = 0;
  // "byte_level_bpe" or "sentencepiece_bpe" (both from tokenizer.json), "sentencepiece_model_bpe"
  // (tokenizer.model).
  virtual std::string kind() const = 0;
  // The id of a token given by its text (a vocabulary entry, an added or special token), if there is one.
  virtual std::optional<int64_t> token_id(std::string_view token) const = 0;

  // The model's begin/end-of-sequence tokens and whether encode_for_model puts them around the text. Taken from
  // tokenizer_config.json (add_bos_token, add_eos_token, bos_token, eos_token) where it says, else from
  // tokenizer.json's post_processor (a TemplateProcessing "single" template SpecialToken $A SpecialToken), else
  // from tokenizer.model's trainer_spec (ids only: add_bos stays false without tokenizer_config.json).
  std::optional<int64_t> bos_id, eos_id;
  bool add_bos = false;
  bool add_eos = false;

  // What the model was trained on for a single text: BOS (if add_bos) + encode(text) + EOS (if add_eos).
  std::vector<int64_t> encode_for_model(std::string_view text) const;
};

// Loads the tokenizer of a Hugging Face model directory: tokenizer.json (+ tokenizer_config.json where present),
// or tokenizer.model (+ tokenizer_config.json) when there is no tokenizer.json. A missing, malformed or
// unsupported file is a rotary::Error naming the file and the field, e.g.
// "rotary: <dir>/tokenizer.json: model.type = WordPiece is invalid; allowed: BPE".
// A GGUF file (a regular file named *.gguf) in place of the directory: the tokenizer its metadata holds
// (gguf_tokenizer).
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& model_dir);

// The tokenizer a GGUF file's metadata holds (tokenizer.ggml.*, as llama.cpp's converter writes it): model "gpt2"
// (byte-level BPE; tokenizer.ggml.pre names the pre-tokenizer: default / gpt-2, llama-bpe, qwen2) or "llama"
// (sentencepiece BPE: pieces, scores, types); BOS / EOS ids and add_bos / add_eos from the file. rotary::Error naming
// the file and the key for a missing or malformed key and for a model or pre-tokenizer it does not know (listing
// those it does).
std::unique_ptr<Tokenizer> gguf_tokenizer(const GgufFile& file);

// For users whose checkpoint has no supported tokenizer: a text file of token ids, decimal numbers separated by
// any whitespace (spaces, newlines), each checked to be in [0, vocab_size). Anything else is a rotary::Error
// naming the file, the position (1-based token number and line) and the offending token.
std::vector<int64_t> read_token_id_file(const std::filesystem::path& path, int64_t vocab_size);

}  // namespace rotary::tokenizers
