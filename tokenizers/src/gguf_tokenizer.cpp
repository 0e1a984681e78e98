// tokenizers/src/gguf_tokenizer.cpp: the tokenizer a GGUF file's metadata holds (tokenizer.ggml.*, as llama.cpp's
// converter writes it) run by this library's own tokenizers, so that a .gguf file encodes as the model directory it
// came from does:
//   "gpt2"   byte-level BPE: tokens, token types, merges, and the pre-tokenizer by name (tokenizer.ggml.pre: the
//            model's split regex, which GGUF does not store) - rebuilt as the tokenizer.json it came from and read by
//            parse_tokenizer_json, so that one BPE engine runs both;
//   "llama"  sentencepiece BPE: pieces, scores, token types (sentencepiece_from_vocab), byte fallback where the
//            vocabulary has byte pieces, tokenizer.ggml.add_space_prefix / remove_extra_whitespaces.
// BOS / EOS from tokenizer.ggml.bos_token_id / eos_token_id, and add_bos_token / add_eos_token (default: llama.cpp's,
// BOS added for "llama", not for "gpt2").
#include <nlohmann/json.hpp>

#include <algorithm>
#include <unordered_set>

#include "rotary/error.h"
#include "rotary/gguf.h"
#include "tokenizer_parts.h"

namespace rotary::tokenizers {
namespace {

// llama.cpp's token types (gguf-py TokenType), as sentencepiece numbers its piece types.
enum TokenType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// tokenizer.ggml.pre names -> what the model's tokenizer.json does before BPE: the split regex (the same text
// the model's tokenizer.json has), an NFC normalizer, ignore_merges. llama.cpp's names (llama-vocab.cpp).
struct PreTokenizer {
  const char* names[3];
  const char* regex;  // null: ByteLevel with GPT-2's regex
  bool nfc;
  bool ignore_merges;
};
constexpr PreTokenizer kPreTokenizers[] = {
    {{"default", "gpt-2", nullptr}, nullptr, false, false},
    {{"llama-bpe", "llama3", "llama-v3"},
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     false, true},
    {{"qwen2", nullptr, nullptr},
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     true, false},
};

std::string known_pre_tokenizers() {
  std::string s;
  for (const PreTokenizer& p : kPreTokenizers)
    for (const char* n : p.names)
      if (n) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

const PreTokenizer& pre_tokenizer(const GgufFile& f) {
  const std::string name(f.get_optional_string("tokenizer.ggml.pre").value_or("default"));
  for (const PreTokenizer& p : kPreTokenizers)
    for (const char* n : p.names)
      if (n && name == n) return p;
  fail(f.source() + ": metadata tokenizer.ggml.pre", quoted_text(name), known_pre_tokenizers());
}

// Token types: absent means every token NORMAL; else one per token, each 1..6.
std::vector<int32_t> token_types(const GgufFile& f, size_t n) {
  if (!f.find("tokenizer.ggml.token_type")) return std::vector<int32_t>(n, kNormal);
  std::vector<int32_t> types = f.get_i32_array("tokenizer.ggml.token_type");
  const std::string field = f.source() + ": metadata tokenizer.ggml.token_type";
  if (types.size() != n)
    fail(field, std::to_string(types.size()) + " types", "one per token (" + std::to_string(n) + ")");
  for (size_t i = 0; i < n; ++i)
    if (types[i] < kNormal || types[i] > kByte)
      fail(field + "[" + std::to_string(i) + "]", std::to_string(types[i]),
           "1 to 6 (NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE)");
  return types;
}

// A token id key (uint32; llama.cpp writes them so) in [0, n), or -1 when absent.
int64_t token_id_key(const GgufFile& f, const std::string& key, size_t n) {
  const std::optional<uint32_t> id = f.get_optional<uint32_t>(key);
  if (!id) return -1;
  if (*id >= n) fail(f.source() + ": metadata " + key, std::to_string(*id), "a token id in [0, " + std::to_string(n) + ")");
  return *id;
}

std::unique_ptr<Tokenizer> byte_level_bpe(const GgufFile& f, const std::vector<std::string_view>& tokens,
                                          const std::vector<int32_t>& types) {
  using nlohmann::json;
  const PreTokenizer& pre = pre_tokenizer(f);
  json vocab = json::object(), added = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string token(tokens[i]);
    check_utf8(token, f.source() + ": metadata tokenizer.ggml.tokens[" + std::to_string(i) + "]");
    if (vocab.contains(token))
      fail(f.source() + ": metadata tokenizer.ggml.tokens[" + std::to_string(i) + "]", quoted_text(token),
           "a token not listed before (it is also id " + std::to_string(vocab[token].get<int64_t>()) + ")");
    vocab[token] = i;
    // CONTROL tokens are the special ones, USER_DEFINED the added non-special ones: both matched whole in raw text.
    if (types[i] == kControl || types[i] == kUserDefined)
      added.push_back({{"id", i}, {"content", token}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", types[i] == kControl}});
  }
  json merges = json::array();
  // (UTF-8 checked here: the merges pass through JSON text, which holds no other bytes)
  const std::vector<std::string_view> merge_list = f.get_strings("tokenizer.ggml.merges");
  for (size_t i = 0; i < merge_list.size(); ++i) {
    check_utf8(merge_list[i], f.source() + ": metadata tokenizer.ggml.merges[" + std::to_string(i) + "]");
    merges.push_back(std::string(merge_list[i]));
  }
  json t;
  t["added_tokens"] = added;
  t["normalizer"] = pre.nfc ? json{{"type", "NFC"}} : json(nullptr);
  if (pre.regex)
    t["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"}, {"pattern", {{"Regex", pre.regex}}}, {"behavior", "Isolated"},
                             {"invert", false}},
                            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  else
    t["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  t["decoder"] = {{"type", "ByteLevel"}};
  t["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", pre.ignore_merges}};
  return parse_tokenizer_json(t.dump(), f.source() + " (tokenizer.ggml.* as tokenizer.json)");
}

std::unique_ptr<Tokenizer> sentencepiece_bpe(const GgufFile& f, const std::vector<std::string_view>& tokens,
                                             const std::vector<int32_t>& types) {
  SentencePieceVocab v;
  for (std::string_view t : tokens) v.pieces.emplace_back(t);
  v.types = types;
  v.scores = f.find("tokenizer.ggml.scores") ? f.get_f32_array("tokenizer.ggml.scores")
                                             : std::vector<float>(tokens.size(), 0.0f);
  if (v.scores.size() != tokens.size())
    fail(f.source() + ": metadata tokenizer.ggml.scores", std::to_string(v.scores.size()) + " scores",
         "one per token (" + std::to_string(tokens.size()) + ")");
  v.add_dummy_prefix = f.get_optional<bool>("tokenizer.ggml.add_space_prefix").value_or(true);
  v.remove_extra_whitespaces = f.get_optional<bool>("tokenizer.ggml.remove_extra_whitespaces").value_or(false);
  v.byte_fallback = std::find(types.begin(), types.end(), kByte) != types.end();
  v.bos_id = token_id_key(f, "tokenizer.ggml.bos_token_id", tokens.size());
  v.eos_id = token_id_key(f, "tokenizer.ggml.eos_token_id", tokens.size());
  v.special_in_text = true;
  return sentencepiece_from_vocab(v, f.source() + " (tokenizer.ggml.*)");
}

}  // namespace

std::unique_ptr<Tokenizer> gguf_tokenizer(const GgufFile& f) {
  const std::string model(f.get_optional_string("tokenizer.ggml.model").value_or(""));
  if (model != "gpt2" && model != "llama")
    fail(f.source() + ": metadata tokenizer.ggml.model", model.empty() ? "missing" : quoted_text(model),
         "gpt2 (byte-level BPE), llama (sentencepiece BPE)");
  const std::vector<std::string_view> tokens = f.get_strings("tokenizer.ggml.tokens");
  if (tokens.empty()) fail(f.source() + ": metadata tokenizer.ggml.tokens", "[]", "at least one token");
  const std::vector<int32_t> types = token_types(f, tokens.size());
  std::unique_ptr<Tokenizer> tok = model == "gpt2" ? byte_level_bpe(f, tokens, types) : sentencepiece_bpe(f, tokens, types);
  // The file's ids and flags, where it has them, over what the tokenizer found itself.
  for (const auto& [key, id] : {std::pair{"tokenizer.ggml.bos_token_id", &tok->bos_id},
                                std::pair{"tokenizer.ggml.eos_token_id", &tok->eos_id}}) {
    const int64_t v = token_id_key(f, key, tokens.size());
    if (v >= 0) *id = v;
  }
  tok->add_bos = f.get_optional<bool>("tokenizer.ggml.add_bos_token").value_or(model == "llama");
  tok->add_eos = f.get_optional<bool>("tokenizer.ggml.add_eos_token").value_or(false);
  if (tok->add_bos && !tok->bos_id)
    fail(f.source() + ": metadata tokenizer.ggml.add_bos_token", "true", "false without tokenizer.ggml.bos_token_id");
  if (tok->add_eos && !tok->eos_id)
    fail(f.source() + ": metadata tokenizer.ggml.add_eos_token", "true", "false without tokenizer.ggml.eos_token_id");
  return tok;
}

}  // namespace rotary::tokenizers
