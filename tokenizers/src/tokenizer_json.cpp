// tokenizers/src/tokenizer_json.cpp: tokenizer.json with model.type "BPE", run as Hugging Face `tokenizers` runs
// it (its Rust source was read for the order of the steps and their corner cases; no code is taken from it):
//   1. added tokens   matched in the raw text, leftmost then longest (those with normalized: true in the
//                     normalized text); each becomes its own id and the text between is tokenized on its own;
//   2. normalizer     Prepend, Replace (a string), NFC/NFD/NFKC/NFKD, or a Sequence of them;
//   3. pre-tokenizer  ByteLevel (the GPT-2 split regex when use_regex, then bytes as the GPT-2 characters),
//                     Split (a Regex or String pattern; Isolated, Removed, MergedWithPrevious, MergedWithNext),
//                     Metaspace (spaces as U+2581, prepend_scheme first/always/never, split or not), Sequence;
//   4. BPE            each pre-token: whole when ignore_merges and it is a vocabulary entry; else its characters
//                     (unknown ones as <0xNN> byte tokens with byte_fallback, else unk_token, fused with fuse_unk),
//                     merged by rank (the order of `merges`; the leftmost on equal ranks);
//   5. decoder        ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, or a Sequence of them.
// Split patterns are Oniguruma regexes in the file and run here with ICU's regex engine; the constructs whose
// meaning differs between the two are rewritten (\s, \S) or refused (see to_icu_pattern).
// Everything else a tokenizer.json may say is refused by name rather than ignored.
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "rotary/error.h"
#include "rotary/json_guard.h"
#include "tokenizer_parts.h"

namespace rotary::tokenizers {
namespace {

using nlohmann::json;

// The pattern ByteLevel splits with when use_regex is true (GPT-2's).
constexpr const char* kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The 256 characters GPT-2's byte-level BPE writes bytes as: printable Latin-1 bytes as themselves, the others
// (controls, space, 0x7F-0xA0, 0xAD) as U+0100 onwards in byte order, so that every token is printable text.
struct ByteCharacters {
  std::array<std::string, 256> of_byte;            // UTF-8 of the character for each byte
  std::unordered_map<char32_t, unsigned char> byte_of;  // the reverse
  ByteCharacters() {
    char32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? char32_t(b) : next_extra++;
      append_utf8(of_byte[size_t(b)], c);
      byte_of[c] = static_cast<unsigned char>(b);
    }
  }
};
const ByteCharacters& byte_characters() {
  static const ByteCharacters table;
  return table;
}

// The JSON of one tokenizer.json, read with every field checked through the core's JsonObject (one rule for every
// JSON reader, json_guard.h), addressed here by (object, path) as the nested file is walked: errors name the file
// and the field's path ("<file>: model.vocab").
class JsonFields {
 public:
  explicit JsonFields(std::string source) : source_(std::move(source)) {}
  [[noreturn]] void fail_at(const std::string& path, const std::string& value, std::string_view allowed) const {
    fail(source_ + ": " + path, value, allowed);
  }
  // `obj` (found at `path`) as a JsonObject naming its keys "<file>: <path>.<key>".
  JsonObject at(const json& obj, const std::string& path) const {
    return JsonObject(&obj, source_ + ": " + path + ".");
  }
  // obj[key] or nullptr when absent or null.
  const json* find(const json& obj, const char* key) const { return JsonObject(&obj, "").find(key); }
  const json& object(const json& v, const std::string& path) const {
    return *JsonObject::of(v, source_ + ": " + path).json();
  }
  std::string string(const json& obj, const char* key, const std::string& path) const {
    return at(obj, path).required_text(key);
  }
  bool boolean(const json& obj, const char* key, const std::string& path, bool otherwise) const {
    return at(obj, path).boolean(key).value_or(otherwise);
  }
  int64_t integer(const json& obj, const char* key, const std::string& path, int64_t low, int64_t high) const {
    return at(obj, path).required_integer(key, low, high);
  }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

// Token ids are u32 in `tokenizers`; we also keep them below 2^31 so they fit every index type downstream.
constexpr int64_t kMaxTokenId = (int64_t(1) << 31) - 1;

// An Oniguruma pattern (as tokenizer.json writes them) in ICU's syntax. The two engines agree on what these files
// use (\p{L}, \p{N}, classes, alternation, (?!...), (?i:...), {1,3}). \s is Unicode White_Space in Oniguruma
// (U+0009-000D, U+0085, Zl, Zp, Zs); ICU 72 matches the same set, but its documentation has long defined \s as
// [\t\n\f\r\p{Z}] (without U+000B and U+0085), so \s and \S are spelled out as \p{White_Space} and
// \P{White_Space}, whatever the ICU version.
// Escapes and anchors whose meaning differs in ways not worth chasing (\w, \b, \h, \R, \X, '.', '^', '$' outside
// a class) are refused.
std::string to_icu_pattern(const std::string& pattern, const JsonFields& fields, const std::string& path) {
  std::string out;
  int class_depth = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\') {
      if (i + 1 == pattern.size()) fields.fail_at(path, json(pattern).dump(), "a regex not ending in '\\'");
      const char e = pattern[++i];
      if (e == 's') {
        out += "\\p{White_Space}";
      } else if (e == 'S') {
        out += "\\P{White_Space}";
      } else if (std::string_view("wWbBhHRXK").find(e) != std::string_view::npos) {
        fields.fail_at(path, json(pattern).dump(),
                       std::string("a regex without \\") + e + " (its Oniguruma meaning is not ICU's)");
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[') ++class_depth;
    if (c == ']' && class_depth > 0) --class_depth;
    if (class_depth == 0 && (c == '.' || c == '^' || c == '$'))
      fields.fail_at(path, json(pattern).dump(),
                     std::string("a regex without '") + c + "' outside [...] (its Oniguruma meaning is not ICU's)");
    out += c;
  }
  return out;
}

// The regex work one text may cost, shared by every match made while encoding it: a pattern from the file may
// backtrack badly, and ICU's own time limit counts one find() at a time, so a text cut into many pieces (by added
// tokens, or by an earlier pre-tokenizer) could spend that limit once per piece. Counted in ICU's time units
// (roughly a millisecond of matching each, 10000 match steps), which its match callback reports one at a time:
// 10000 for any text, plus one per 10 bytes (1000 match steps a byte, far above what a pattern that does not
// backtrack spends, so a book-length text is never refused for its length).
struct RegexBudget {
  static constexpr int32_t kBaseUnits = 10000;
  explicit RegexBudget(size_t text_bytes)
      : units_left(int32_t(std::min<size_t>(size_t(kBaseUnits) + text_bytes / 10, size_t(1) << 30))) {}
  int32_t units_left;
};

// The match callback: one more unit spent; false (stop) once the text's budget is gone.
UBool spend_regex_unit(const void* context, int32_t /*steps*/) {
  RegexBudget& budget = *static_cast<RegexBudget*>(const_cast<void*>(context));
  return --budget.units_left > 0;
}

// A compiled split pattern and the matches it finds, as UTF-8 byte offsets.
class SplitPattern {
 public:
  SplitPattern(const std::string& pattern, bool literal, const JsonFields& fields, const std::string& path) {
    const std::string icu_pattern = literal ? pattern : to_icu_pattern(pattern, fields, path);
    UErrorCode status = U_ZERO_ERROR;
    UParseError where{};
    pattern_.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(icu_pattern),
                                              literal ? UREGEX_LITERAL : 0, where, status));
    if (U_FAILURE(status) || !pattern_)
      fields.fail_at(path, json(pattern).dump(),
                     std::string("a regex ICU compiles (") + u_errorName(status) + " at offset " +
                         std::to_string(where.offset) + ")");
  }

  // Matches in `text`, spending `budget` (the whole text's): rotary::Error once it is spent.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text, RegexBudget& budget) const {
    std::vector<std::pair<size_t, size_t>> matches;
    if (text.empty()) return matches;
    UErrorCode status = U_ZERO_ERROR;
    std::unique_ptr<icu::RegexMatcher> matcher(pattern_->matcher(status));
    UText* input = utext_openUTF8(nullptr, text.data(), int64_t(text.size()), &status);
    if (U_SUCCESS(status)) matcher->reset(input);
    // ICU counts time units only under a time limit; the callback, called once per unit, ends the match when the
    // text's budget is spent (before this limit, which is one unit past it).
    if (U_SUCCESS(status)) matcher->setTimeLimit(budget.units_left + 1, status);
    if (U_SUCCESS(status)) matcher->setMatchCallback(spend_regex_unit, &budget, status);
    while (U_SUCCESS(status) && budget.units_left > 0 && matcher->find(status)) {
      const int64_t start = matcher->start64(status), end = matcher->end64(status);
      if (U_SUCCESS(status)) matches.emplace_back(size_t(start), size_t(end));
    }
    utext_close(input);
    if (U_FAILURE(status) || budget.units_left <= 0)
      fail("tokenizer split regex", U_FAILURE(status) ? u_errorName(status) : "U_REGEX_STOPPED_BY_CALLER",
           "a pattern that splits the text within the time limit (" + std::to_string(RegexBudget::kBaseUnits) +
               " ICU time units, about as many milliseconds, per text plus one per 10 bytes of it)");
    return matches;
  }

 private:
  std::unique_ptr<icu::RegexPattern> pattern_;
};

// A piece of text on its way through the pipeline; `at_start` is whether it begins at byte 0 of the text the
// user gave (Metaspace's prepend_scheme "first" prepends only there).
struct Piece {
  std::string text;
  bool at_start;
};

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext };

// `text` cut at the matches of `pattern`, the matches handled as `behavior` says; empty pieces dropped.
std::vector<Piece> split_piece(const Piece& piece, const SplitPattern& pattern, SplitBehavior behavior,
                               RegexBudget& budget) {
  struct Span {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Span> spans;
  size_t previous = 0;
  for (const auto& [begin, end] : pattern.find_all(piece.text, budget)) {
    if (begin != previous) spans.push_back({previous, begin, false});
    spans.push_back({begin, end, true});
    previous = end;
  }
  if (previous != piece.text.size()) spans.push_back({previous, piece.text.size(), false});

  std::vector<Span> kept;
  if (behavior == SplitBehavior::kIsolated) {
    kept = spans;
  } else if (behavior == SplitBehavior::kRemoved) {
    for (const Span& s : spans)
      if (!s.is_match) kept.push_back(s);
  } else if (behavior == SplitBehavior::kMergedWithPrevious) {
    // A match joins the piece before it, unless that piece is itself a match.
    bool previous_match = false;
    for (const Span& s : spans) {
      if (s.is_match && !previous_match && !kept.empty())
        kept.back().end = s.end;
      else
        kept.push_back(s);
      previous_match = s.is_match;
    }
  } else {
    // A match joins the piece after it, unless that piece is itself a match (walked from the end).
    bool next_match = false;
    for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
      if (it->is_match && !next_match && !kept.empty())
        kept.back().begin = it->begin;
      else
        kept.push_back(*it);
      next_match = it->is_match;
    }
    std::reverse(kept.begin(), kept.end());
  }
  std::vector<Piece> out;
  for (const Span& s : kept)
    if (s.end > s.begin) out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
  return out;
}

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = text.find(from, at)) != std::string::npos; at = hit + from.size())
    out.append(text, at, hit - at).append(to);
  out.append(text, at, std::string::npos);
  text = std::move(out);
}

struct NormalizerStep {
  enum Kind { kPrepend, kReplace, kUnicode } kind;
  std::string a, b;                           // Prepend: a; Replace: a -> b
  const icu::Normalizer2* unicode = nullptr;  // NFC, NFD, NFKC, NFKD
};

struct PreTokenizerStep {
  enum Kind { kByteLevel, kSplit, kMetaspace } kind;
  bool add_prefix_space = false;  // ByteLevel
  std::shared_ptr<const SplitPattern> pattern;  // ByteLevel with use_regex, Split, Metaspace with split
  SplitBehavior behavior = SplitBehavior::kIsolated;
  std::string replacement;         // Metaspace
  std::string prepend_scheme;      // Metaspace: "first", "always", "never"
};

struct DecoderStep {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  std::string a, b;  // Replace: a -> b; Strip: a is the character; Metaspace: a is the replacement
  int64_t start = 0, stop = 0;  // Strip
  bool prepend = true;          // Metaspace: prepend_scheme is not "never"
};

struct AddedToken {
  int64_t id;
  std::string content;  // what is matched (the normalized content for normalized tokens)
  bool normalized, lstrip, rstrip;
};

bool is_white_space(std::string_view text, size_t at, size_t length) {
  return u_hasBinaryProperty(UChar32(utf8_code_point(text, at, length)), UCHAR_WHITE_SPACE);
}

class JsonBpeTokenizer final : public Tokenizer {
 public:
  JsonBpeTokenizer(std::string_view json_text, const std::string& source);

  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  // Added tokens (id >= 0) and the pre-tokens between them (id -1), in order: what encode hands the BPE model.
  std::vector<std::pair<std::string, int64_t>> pre_tokens(std::string_view text) const;
  int64_t vocab_size() const override { return vocab_size_; }
  std::string kind() const override { return byte_level_ ? "byte_level_bpe" : "sentencepiece_bpe"; }
  std::optional<int64_t> token_id(std::string_view token) const override {
    for (const AddedToken& t : added_)
      if (t.content == token) return t.id;
    const auto it = vocab_.find(std::string(token));
    return it == vocab_.end() ? std::nullopt : std::optional<int64_t>(it->second);
  }

 private:
  void read_added_tokens(const json& root);
  void read_normalizer(const json& v, const std::string& path);
  void read_pre_tokenizer(const json& v, const std::string& path);
  void read_model(const json& model);
  void read_decoder(const json& v, const std::string& path);
  void read_post_processor(const json& v, const std::string& path);

  std::string normalize(std::string text) const;
  // Splits `piece` at the added tokens matched by `normalized` ones (or the others); ids of matched tokens are
  // in `added_id`, -1 for text between them.
  void split_added(const Piece& piece, bool normalized, std::vector<std::pair<Piece, int64_t>>& out) const;
  // (`budget`: the regex work left for the text this piece is part of)
  std::vector<Piece> pre_tokenize(Piece piece, RegexBudget& budget) const;
  void bpe(const std::string& word, std::vector<int64_t>& ids) const;

  JsonFields fields_;
  std::vector<AddedToken> added_;
  std::unordered_map<int64_t, std::string> added_text_;  // id -> what decode shows
  std::vector<NormalizerStep> normalizer_;
  std::vector<PreTokenizerStep> pre_tokenizer_;
  std::vector<DecoderStep> decoder_;
  bool has_decoder_ = false;
  bool byte_level_ = false;
  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<int64_t, std::string> token_of_id_;
  struct Merge {
    uint32_t rank;
    int64_t merged_id;
  };
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank and result
  std::optional<int64_t> unk_id_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int64_t vocab_size_ = 0;
};

JsonBpeTokenizer::JsonBpeTokenizer(std::string_view json_text, const std::string& source) : fields_(source) {
  const json root = parse_json(json_text, source);
  fields_.object(root, "(top level)");
  const json* model = fields_.find(root, "model");
  if (!model) fields_.fail_at("model", "(missing)", "a BPE model object");
  read_model(fields_.object(*model, "model"));
  read_added_tokens(root);  // after the model: normalized contents go through the normalizer, read below
  if (const json* v = fields_.find(root, "normalizer")) read_normalizer(*v, "normalizer");
  for (AddedToken& t : added_) {
    if (t.normalized && !normalizer_.empty()) t.content = normalize(t.content);
    if (t.content.empty()) fields_.fail_at("added_tokens[id " + std::to_string(t.id) + "].content", "\"\"",
                                           "a non-empty token");
    added_text_[t.id] = t.content;
  }
  if (const json* v = fields_.find(root, "pre_tokenizer")) read_pre_tokenizer(*v, "pre_tokenizer");
  if (const json* v = fields_.find(root, "decoder")) {
    has_decoder_ = true;
    read_decoder(*v, "decoder");
  }
  if (const json* v = fields_.find(root, "post_processor")) read_post_processor(*v, "post_processor");
  for (const PreTokenizerStep& s : pre_tokenizer_) byte_level_ = byte_level_ || s.kind == PreTokenizerStep::kByteLevel;
}

void JsonBpeTokenizer::read_model(const json& model) {
  const std::string type = fields_.find(model, "type") ? fields_.string(model, "type", "model") : "(missing)";
  if (type != "BPE") fields_.fail_at("model.type", type, "BPE");
  if (const json* dropout = fields_.find(model, "dropout"); dropout && !(dropout->is_number() && *dropout == 0))
    fields_.fail_at("model.dropout", json_excerpt(*dropout), "null or 0 (BPE dropout samples; we encode exactly)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = fields_.find(model, key);
    if (v && !(v->is_string() && v->get_ref<const std::string&>().empty()))
      fields_.fail_at(std::string("model.") + key, json_excerpt(*v), "null or \"\"");
  }
  fuse_unk_ = fields_.boolean(model, "fuse_unk", "model", false);
  byte_fallback_ = fields_.boolean(model, "byte_fallback", "model", false);
  ignore_merges_ = fields_.boolean(model, "ignore_merges", "model", false);

  const json* vocab = fields_.find(model, "vocab");
  if (!vocab || !vocab->is_object())
    fields_.fail_at("model.vocab", vocab ? json_excerpt(*vocab) : "(missing)", "an object of token: id");
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const json& value = it.value();
    const std::optional<int64_t> given = json_integer(value, 0, kMaxTokenId);
    if (!given)
      fields_.fail_at("model.vocab[" + json_excerpt(json(it.key())) + "]", json_excerpt(value),
                      "an integer id in [0, 2^31 - 1]");
    const int64_t id = *given;
    vocab_.emplace(it.key(), id);
    if (!token_of_id_.emplace(id, it.key()).second)
      fields_.fail_at("model.vocab[" + json(it.key()).dump() + "]", std::to_string(id),
                      "an id no other token has (" + json(token_of_id_[id]).dump() + " has it)");
    vocab_size_ = std::max(vocab_size_, id + 1);
  }
  if (const json* unk = fields_.find(model, "unk_token")) {
    const std::string name = fields_.string(model, "unk_token", "model");
    const auto it = vocab_.find(name);
    if (it == vocab_.end()) fields_.fail_at("model.unk_token", json(name).dump(), "a token of model.vocab");
    unk_id_ = it->second;
    (void)unk;
  }

  const json* merges = fields_.find(model, "merges");
  if (!merges || !merges->is_array())
    fields_.fail_at("model.merges", merges ? json_excerpt(*merges) : "(missing)", "an array of merges");
  if (merges->size() > UINT32_MAX) fields_.fail_at("model.merges", "too many merges", "at most 2^32 - 1");
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const json& m = (*merges)[rank];
    const std::string path = "model.merges[" + std::to_string(rank) + "]";
    std::string left, right;
    // Two spellings occur: "a b" (a single space between) and ["a", "b"] (tokens that may contain spaces).
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        fields_.fail_at(path, json_excerpt(m), "\"left right\" with one space, or [\"left\", \"right\"]");
      left = s.substr(0, space), right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    } else {
      fields_.fail_at(path, json_excerpt(m), "\"left right\" with one space, or [\"left\", \"right\"]");
    }
    const auto id_of = [&](const std::string& token) {
      const auto it = vocab_.find(token);
      if (it == vocab_.end())
        fields_.fail_at(path, json_excerpt(m), "a merge of tokens of model.vocab into one (" + json(token).dump() +
                                                   " is not in model.vocab)");
      return it->second;
    };
    const int64_t left_id = id_of(left), right_id = id_of(right), merged_id = id_of(left + right);
    // A pair listed twice keeps its last rank, as a map filled in order does.
    merges_[uint64_t(left_id) << 32 | uint64_t(right_id)] = {uint32_t(rank), merged_id};
  }
}

void JsonBpeTokenizer::read_added_tokens(const json& root) {
  const json* list = fields_.find(root, "added_tokens");
  if (!list) return;
  if (!list->is_array()) fields_.fail_at("added_tokens", json_excerpt(*list), "an array of token objects");
  // Hugging Face's tokenizers (the Rust library under transformers) does not take an added token's id from the
  // file: a token the model's vocabulary has gets the vocabulary's id, any other the next id after the vocabulary
  // and the added tokens before it (it logs a warning when that differs from the file). Tokenizers.js takes the
  // file's id. Where the two differ the file means different ids to its two readers, so it is refused by name.
  const int64_t model_vocab = int64_t(vocab_.size());
  int64_t largest_added = -1;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    const json& t = fields_.object((*list)[i], path);
    AddedToken token;
    token.id = fields_.integer(t, "id", path, 0, kMaxTokenId);
    token.content = fields_.string(t, "content", path);
    if (token.content.empty()) fields_.fail_at(path + ".content", "\"\"", "a non-empty token");
    // `tokenizers` defaults normalized to the opposite of special.
    token.normalized = fields_.boolean(t, "normalized", path, !fields_.boolean(t, "special", path, false));
    token.lstrip = fields_.boolean(t, "lstrip", path, false);
    token.rstrip = fields_.boolean(t, "rstrip", path, false);
    if (fields_.boolean(t, "single_word", path, false))
      fields_.fail_at(path + ".single_word", "true", "false (word-boundary matching is not implemented)");
    // Where the vocabulary has the id for another token, decode would be ambiguous.
    if (const auto it = token_of_id_.find(token.id); it != token_of_id_.end() && it->second != token.content)
      fields_.fail_at(path + ".id", std::to_string(token.id),
                      "an id that model.vocab gives to the same token or to none (it has " +
                          json(it->second).dump() + ")");
    int64_t hf_id;
    if (const auto it = vocab_.find(token.content); it != vocab_.end()) {
      hf_id = it->second;
    } else if (const auto same = std::find_if(added_.begin(), added_.end(),
                                              [&](const AddedToken& a) { return a.content == token.content; });
               same != added_.end()) {
      hf_id = same->id;
    } else {
      hf_id = largest_added >= model_vocab ? largest_added + 1 : model_vocab;
    }
    if (token.id != hf_id)
      fields_.fail_at(path + ".id", std::to_string(token.id),
                      "the id Hugging Face's tokenizers gives " + json(token.content).dump() + ": " +
                          std::to_string(hf_id) +
                          " (the vocabulary's id, or the next after the vocabulary's " + std::to_string(model_vocab) +
                          " tokens and the added tokens before it; transformers would use that id, Tokenizers.js "
                          "this one)");
    largest_added = std::max(largest_added, hf_id);
    vocab_size_ = std::max(vocab_size_, token.id + 1);
    added_.push_back(std::move(token));
  }
}

void JsonBpeTokenizer::read_normalizer(const json& v, const std::string& path) {
  fields_.object(v, path);
  const std::string type = fields_.string(v, "type", path);
  if (type == "Sequence") {
    const json* list = fields_.find(v, "normalizers");
    if (!list || !list->is_array()) fields_.fail_at(path + ".normalizers", "(missing)", "an array of normalizers");
    for (size_t i = 0; i < list->size(); ++i) read_normalizer((*list)[i], path + ".normalizers[" + std::to_string(i) + "]");
  } else if (type == "Prepend") {
    normalizer_.push_back({NormalizerStep::kPrepend, fields_.string(v, "prepend", path), "", nullptr});
  } else if (type == "Replace") {
    const json* pattern = fields_.find(v, "pattern");
    if (!pattern || !pattern->is_object() || !fields_.find(*pattern, "String"))
      fields_.fail_at(path + ".pattern", pattern ? json_excerpt(*pattern) : "(missing)", "{\"String\": ...}");
    normalizer_.push_back({NormalizerStep::kReplace, fields_.string(*pattern, "String", path + ".pattern"),
                           fields_.string(v, "content", path), nullptr});
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                                : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                                : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                                 : icu::Normalizer2::getNFKDInstance(status);
    if (U_FAILURE(status)) fields_.fail_at(path + ".type", type, "a normalizer ICU provides here");
    normalizer_.push_back({NormalizerStep::kUnicode, "", "", n});
  } else {
    fields_.fail_at(path + ".type", type, "Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD");
  }
}

void JsonBpeTokenizer::read_pre_tokenizer(const json& v, const std::string& path) {
  fields_.object(v, path);
  const std::string type = fields_.string(v, "type", path);
  PreTokenizerStep step{};
  if (type == "Sequence") {
    const json* list = fields_.find(v, "pretokenizers");
    if (!list || !list->is_array()) fields_.fail_at(path + ".pretokenizers", "(missing)", "an array of pre-tokenizers");
    for (size_t i = 0; i < list->size(); ++i)
      read_pre_tokenizer((*list)[i], path + ".pretokenizers[" + std::to_string(i) + "]");
    return;
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::kByteLevel;
    step.add_prefix_space = fields_.boolean(v, "add_prefix_space", path, true);
    if (fields_.boolean(v, "use_regex", path, true))
      step.pattern = std::make_shared<SplitPattern>(kGpt2SplitPattern, false, fields_, path + ".use_regex");
  } else if (type == "Split") {
    step.kind = PreTokenizerStep::kSplit;
    if (fields_.boolean(v, "invert", path, false)) fields_.fail_at(path + ".invert", "true", "false");
    const json* pattern = fields_.find(v, "pattern");
    if (!pattern || !pattern->is_object() || pattern->size() != 1)
      fields_.fail_at(path + ".pattern", pattern ? json_excerpt(*pattern) : "(missing)",
                      "{\"Regex\": ...} or {\"String\": ...}");
    const bool literal = fields_.find(*pattern, "String") != nullptr;
    const std::string text = fields_.string(*pattern, literal ? "String" : "Regex", path + ".pattern");
    step.pattern = std::make_shared<SplitPattern>(text, literal, fields_, path + ".pattern");
    const std::string behavior = fields_.string(v, "behavior", path);
    if (behavior == "Isolated") step.behavior = SplitBehavior::kIsolated;
    else if (behavior == "Removed") step.behavior = SplitBehavior::kRemoved;
    else if (behavior == "MergedWithPrevious") step.behavior = SplitBehavior::kMergedWithPrevious;
    else if (behavior == "MergedWithNext") step.behavior = SplitBehavior::kMergedWithNext;
    else fields_.fail_at(path + ".behavior", behavior, "Isolated, Removed, MergedWithPrevious, MergedWithNext");
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerStep::kMetaspace;
    step.replacement = fields_.string(v, "replacement", path);
    if (step.replacement.empty() || utf8_char_length(step.replacement, 0) != step.replacement.size())
      fields_.fail_at(path + ".replacement", json(step.replacement).dump(), "one character");
    // Older files say add_prefix_space (true: "always"); newer ones prepend_scheme.
    if (fields_.find(v, "prepend_scheme")) {
      step.prepend_scheme = fields_.string(v, "prepend_scheme", path);
      if (step.prepend_scheme != "first" && step.prepend_scheme != "always" && step.prepend_scheme != "never")
        fields_.fail_at(path + ".prepend_scheme", step.prepend_scheme, "first, always, never");
    } else {
      step.prepend_scheme = fields_.boolean(v, "add_prefix_space", path, true) ? "always" : "never";
    }
    if (fields_.boolean(v, "split", path, true))
      step.pattern = std::make_shared<SplitPattern>(step.replacement, true, fields_, path + ".replacement");
    step.behavior = SplitBehavior::kMergedWithNext;
  } else {
    fields_.fail_at(path + ".type", type, "Sequence, ByteLevel, Split, Metaspace");
  }
  pre_tokenizer_.push_back(std::move(step));
}

void JsonBpeTokenizer::read_decoder(const json& v, const std::string& path) {
  fields_.object(v, path);
  const std::string type = fields_.string(v, "type", path);
  DecoderStep step{};
  if (type == "Sequence") {
    const json* list = fields_.find(v, "decoders");
    if (!list || !list->is_array()) fields_.fail_at(path + ".decoders", "(missing)", "an array of decoders");
    for (size_t i = 0; i < list->size(); ++i) read_decoder((*list)[i], path + ".decoders[" + std::to_string(i) + "]");
    return;
  } else if (type == "ByteLevel") {
    step.kind = DecoderStep::kByteLevel;
  } else if (type == "Replace") {
    step.kind = DecoderStep::kReplace;
    const json* pattern = fields_.find(v, "pattern");
    if (!pattern || !pattern->is_object() || !fields_.find(*pattern, "String"))
      fields_.fail_at(path + ".pattern", pattern ? json_excerpt(*pattern) : "(missing)", "{\"String\": ...}");
    step.a = fields_.string(*pattern, "String", path + ".pattern");
    step.b = fields_.string(v, "content", path);
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::kFuse;
  } else if (type == "Strip") {
    step.kind = DecoderStep::kStrip;
    step.a = fields_.string(v, "content", path);
    if (step.a.empty() || utf8_char_length(step.a, 0) != step.a.size())
      fields_.fail_at(path + ".content", json(step.a).dump(), "one character");
    step.start = fields_.integer(v, "start", path, 0, 1 << 20);
    step.stop = fields_.integer(v, "stop", path, 0, 1 << 20);
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::kMetaspace;
    step.a = fields_.string(v, "replacement", path);
    if (fields_.find(v, "prepend_scheme"))
      step.prepend = fields_.string(v, "prepend_scheme", path) != "never";
    else
      step.prepend = fields_.boolean(v, "add_prefix_space", path, true);
  } else {
    fields_.fail_at(path + ".type", type, "Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace");
  }
  decoder_.push_back(std::move(step));
}

void JsonBpeTokenizer::read_post_processor(const json& v, const std::string& path) {
  fields_.object(v, path);
  const std::string type = fields_.string(v, "type", path);
  if (type == "Sequence") {
    const json* list = fields_.find(v, "processors");
    if (!list || !list->is_array()) fields_.fail_at(path + ".processors", "(missing)", "an array of processors");
    for (size_t i = 0; i < list->size(); ++i)
      read_post_processor((*list)[i], path + ".processors[" + std::to_string(i) + "]");
    return;
  }
  if (type == "ByteLevel") return;  // offsets only
  if (type != "TemplateProcessing") fields_.fail_at(path + ".type", type, "Sequence, ByteLevel, TemplateProcessing");
  // "single": [{"SpecialToken": {"id": "<s>", ...}}, {"Sequence": {"id": "A", ...}}, ...]; "special_tokens":
  // {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}.
  const json* single = fields_.find(v, "single");
  const std::string allowed = "[SpecialToken] {Sequence A} [SpecialToken], each special token one id";
  if (!single || !single->is_array()) fields_.fail_at(path + ".single", "(missing)", allowed);
  const json* specials = fields_.find(v, "special_tokens");
  std::vector<int64_t> before, after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& item = (*single)[i];
    const std::string item_path = path + ".single[" + std::to_string(i) + "]";
    if (!item.is_object() || item.size() != 1) fields_.fail_at(item_path, json_excerpt(item), allowed);
    if (const json* seq = fields_.find(item, "Sequence")) {
      if (seen_sequence || !seq->is_object() || fields_.string(*seq, "id", item_path + ".Sequence") != "A")
        fields_.fail_at(item_path, json_excerpt(item), allowed);
      seen_sequence = true;
    } else if (const json* special = fields_.find(item, "SpecialToken")) {
      const std::string name = fields_.string(fields_.object(*special, item_path), "id", item_path + ".SpecialToken");
      const json* entry = specials && specials->is_object() ? fields_.find(*specials, name.c_str()) : nullptr;
      const json* ids = entry && entry->is_object() ? fields_.find(*entry, "ids") : nullptr;
      const std::optional<int64_t> id =
          ids && ids->is_array() && ids->size() == 1 ? json_integer((*ids)[0], 0, kMaxTokenId) : std::nullopt;
      if (!id)
        fields_.fail_at(path + ".special_tokens[" + json(name).dump() + "].ids",
                        ids ? json_excerpt(*ids) : "(missing)", "one token id");
      (seen_sequence ? after : before).push_back(*id);
    } else {
      fields_.fail_at(item_path, json_excerpt(item), allowed);
    }
  }
  if (!seen_sequence || before.size() > 1 || after.size() > 1)
    fields_.fail_at(path + ".single", json_excerpt(*single), allowed);
  if (!before.empty()) add_bos = true, bos_id = before[0];
  if (!after.empty()) add_eos = true, eos_id = after[0];
}

std::string JsonBpeTokenizer::normalize(std::string text) const {
  for (const NormalizerStep& step : normalizer_) {
    if (step.kind == NormalizerStep::kPrepend) {
      if (!text.empty()) text = step.a + text;
    } else if (step.kind == NormalizerStep::kReplace) {
      replace_all(text, step.a, step.b);
    } else {
      UErrorCode status = U_ZERO_ERROR;
      const icu::UnicodeString normalized = step.unicode->normalize(icu::UnicodeString::fromUTF8(text), status);
      if (U_FAILURE(status)) fail("text normalization", u_errorName(status), "success");
      text.clear();
      normalized.toUTF8String(text);
    }
  }
  return text;
}

void JsonBpeTokenizer::split_added(const Piece& piece, bool normalized,
                                   std::vector<std::pair<Piece, int64_t>>& out) const {
  const std::string& text = piece.text;
  size_t done = 0;  // text before this is in `out`
  for (size_t at = 0; at < text.size();) {
    const AddedToken* best = nullptr;
    for (const AddedToken& t : added_)
      if (t.normalized == normalized && (!best || t.content.size() > best->content.size()) &&
          text.compare(at, t.content.size(), t.content) == 0)
        best = &t;
    if (!best) {
      ++at;
      continue;
    }
    size_t begin = at, end = at + best->content.size();
    // lstrip / rstrip: the token takes the white space before / after it (not what an earlier token took).
    if (best->lstrip) {
      while (begin > done) {
        size_t prev = begin - 1;
        while (prev > done && (static_cast<unsigned char>(text[prev]) & 0xC0) == 0x80) --prev;
        if (!is_white_space(text, prev, begin - prev)) break;
        begin = prev;
      }
    }
    if (best->rstrip) {
      for (size_t length; end < text.size() && (length = utf8_char_length(text, end)) > 0 &&
                          is_white_space(text, end, length);)
        end += length;
    }
    if (begin > done) out.push_back({{text.substr(done, begin - done), piece.at_start && done == 0}, -1});
    out.push_back({{text.substr(begin, end - begin), false}, best->id});
    done = at = end;
  }
  if (done < text.size()) out.push_back({{text.substr(done), piece.at_start && done == 0}, -1});
}

std::vector<Piece> JsonBpeTokenizer::pre_tokenize(Piece piece, RegexBudget& budget) const {
  std::vector<Piece> pieces{std::move(piece)};
  const ByteCharacters& bytes = byte_characters();
  for (const PreTokenizerStep& step : pre_tokenizer_) {
    std::vector<Piece> next;
    for (Piece& p : pieces) {
      if (step.kind == PreTokenizerStep::kByteLevel) {
        if (step.add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, 1, ' ');
        std::vector<Piece> parts = step.pattern ? split_piece(p, *step.pattern, SplitBehavior::kIsolated, budget)
                                                : std::vector<Piece>{p};
        for (Piece& part : parts) {
          std::string mapped;
          for (const char c : part.text) mapped += bytes.of_byte[static_cast<unsigned char>(c)];
          next.push_back({std::move(mapped), part.at_start});
        }
      } else if (step.kind == PreTokenizerStep::kSplit) {
        for (Piece& part : split_piece(p, *step.pattern, step.behavior, budget)) next.push_back(std::move(part));
      } else {
        replace_all(p.text, " ", step.replacement);
        const bool starts_marked = p.text.compare(0, step.replacement.size(), step.replacement) == 0;
        if (!starts_marked && (step.prepend_scheme == "always" || (step.prepend_scheme == "first" && p.at_start)))
          p.text.insert(0, step.replacement);
        if (step.pattern) {
          for (Piece& part : split_piece(p, *step.pattern, step.behavior, budget)) next.push_back(std::move(part));
        } else if (!p.text.empty()) {
          next.push_back(std::move(p));
        }
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

void JsonBpeTokenizer::bpe(const std::string& word, std::vector<int64_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  // The word's characters as tokens.
  struct Symbol {
    int64_t id;
    int prev, next;
    size_t length;  // bytes of the word it covers; 0 once merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  const auto add = [&](int64_t id, size_t length) {
    symbols.push_back({id, int(symbols.size()) - 1, int(symbols.size()) + 1, length});
  };
  bool unk_pending = false;  // an unknown run waiting to be added (so that fuse_unk can extend it)
  size_t unk_length = 0;     // bytes it covers
  for (size_t at = 0; at < word.size();) {
    size_t length = utf8_char_length(word, at);
    if (length == 0) length = 1;  // unreachable: pieces are UTF-8
    const std::string character = word.substr(at, length);
    at += length;
    if (const auto it = vocab_.find(character); it != vocab_.end()) {
      if (unk_pending) add(*unk_id_, unk_length), unk_pending = false;
      add(it->second, length);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int64_t> byte_ids;
      for (const char b : character) {
        const auto it = vocab_.find(byte_token_name(static_cast<unsigned char>(b)));
        if (it == vocab_.end()) break;
        byte_ids.push_back(it->second);
      }
      // (As `tokenizers` does, a pending unknown is not flushed before byte tokens.)
      if (byte_ids.size() == character.size()) {
        for (const int64_t id : byte_ids) add(id, 1);
        continue;
      }
    }
    if (unk_id_) {
      if (unk_pending && fuse_unk_) {
        unk_length += length;
      } else {
        if (unk_pending) add(*unk_id_, unk_length);
        unk_pending = true, unk_length = length;
      }
    }
    // Without unk_token an unknown character is dropped, as `tokenizers` does.
  }
  if (unk_pending) add(*unk_id_, unk_length);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    uint32_t rank;
    int pos;
    int64_t merged_id;
  };
  // Lowest rank first; the leftmost on equal ranks.
  const auto after = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(after)> queue(after);
  const auto merge_of = [&](int64_t left, int64_t right) -> const Merge* {
    const auto it = merges_.find(uint64_t(left) << 32 | uint64_t(right));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i)
    if (const Merge* m = merge_of(symbols[i].id, symbols[i + 1].id)) queue.push({m->rank, int(i), m->merged_id});
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[size_t(top.pos)];
    if (left.length == 0 || left.next < 0) continue;
    Symbol& right = symbols[size_t(left.next)];
    // Stale: the pair at this position is no longer the one queued.
    const Merge* now = merge_of(left.id, right.id);
    if (!now || now->merged_id != top.merged_id) continue;
    left.id = top.merged_id;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (left.next >= 0) symbols[size_t(left.next)].prev = top.pos;
    if (left.prev >= 0)
      if (const Merge* m = merge_of(symbols[size_t(left.prev)].id, left.id)) queue.push({m->rank, left.prev, m->merged_id});
    if (left.next >= 0)
      if (const Merge* m = merge_of(left.id, symbols[size_t(left.next)].id)) queue.push({m->rank, top.pos, m->merged_id});
  }
  for (const Symbol& s : symbols)
    if (s.length > 0) ids.push_back(s.id);
}

std::vector<std::pair<std::string, int64_t>> JsonBpeTokenizer::pre_tokens(std::string_view text) const {
  check_utf8(text, "text");
  std::vector<std::pair<std::string, int64_t>> out;
  if (text.empty()) return out;
  // 1. Tokens matched in the raw text; 2. the rest normalized, and tokens matched in the normalized text.
  std::vector<std::pair<Piece, int64_t>> raw_split, split;
  split_added({std::string(text), true}, false, raw_split);
  for (auto& [piece, added_id] : raw_split) {
    if (added_id >= 0) {
      split.emplace_back(std::move(piece), added_id);
      continue;
    }
    const Piece normalized{normalize(std::move(piece.text)), piece.at_start};
    if (!normalized.text.empty()) split_added(normalized, true, split);
  }
  // 3. Pre-tokenize each piece between added tokens, all of them within one regex budget.
  RegexBudget budget(text.size());
  for (auto& [piece, added_id] : split) {
    if (added_id >= 0) {
      out.emplace_back(std::move(piece.text), added_id);
      continue;
    }
    for (Piece& word : pre_tokenize(std::move(piece), budget)) out.emplace_back(std::move(word.text), -1);
  }
  return out;
}

std::vector<int64_t> JsonBpeTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  for (const auto& [piece, added_id] : pre_tokens(text)) {
    if (added_id >= 0)
      ids.push_back(added_id);
    else
      bpe(piece, ids);
  }
  return ids;
}

std::string JsonBpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<std::string> tokens;
  for (const int64_t id : ids) {
    if (const auto it = added_text_.find(id); it != added_text_.end()) {
      tokens.push_back(it->second);
    } else if (const auto it2 = token_of_id_.find(id); it2 != token_of_id_.end()) {
      tokens.push_back(it2->second);
    } else {
      fail("token id", std::to_string(id), "an id of the vocabulary or an added token, in [0, " +
                                               std::to_string(vocab_size_) + ")");
    }
  }
  if (!has_decoder_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  const ByteCharacters& bytes = byte_characters();
  for (const DecoderStep& step : decoder_) {
    std::vector<std::string> next;
    if (step.kind == DecoderStep::kByteLevel) {
      // Each token's characters back to bytes; a token with a character outside the table stays as it is.
      std::string joined;
      for (const std::string& token : tokens) {
        std::string raw;
        bool mapped = true;
        for (size_t at = 0; at < token.size() && mapped;) {
          const size_t length = std::max<size_t>(1, utf8_char_length(token, at));
          const auto it = bytes.byte_of.find(utf8_code_point(token, at, length));
          if (it == bytes.byte_of.end()) mapped = false;
          else raw.push_back(char(it->second));
          at += length;
        }
        joined += mapped ? raw : token;
      }
      next.push_back(std::move(joined));
    } else if (step.kind == DecoderStep::kReplace) {
      for (std::string& token : tokens) replace_all(token, step.a, step.b), next.push_back(std::move(token));
    } else if (step.kind == DecoderStep::kByteFallback) {
      // Runs of <0xNN> tokens become the bytes they stand for.
      std::string run;
      for (std::string& token : tokens) {
        const int byte = byte_token_value(token);
        if (byte >= 0) {
          run.push_back(char(byte));
          continue;
        }
        if (!run.empty()) next.push_back(std::move(run)), run.clear();
        next.push_back(std::move(token));
      }
      if (!run.empty()) next.push_back(std::move(run));
    } else if (step.kind == DecoderStep::kFuse) {
      std::string joined;
      for (const std::string& token : tokens) joined += token;
      next.push_back(std::move(joined));
    } else if (step.kind == DecoderStep::kStrip) {
      // Up to `start` leading and `stop` trailing copies of the character, from each token.
      for (std::string& token : tokens) {
        std::string_view t = token;
        for (int64_t i = 0; i < step.start && t.substr(0, step.a.size()) == step.a; ++i) t.remove_prefix(step.a.size());
        for (int64_t i = 0; i < step.stop && t.size() >= step.a.size() && t.substr(t.size() - step.a.size()) == step.a;
             ++i)
          t.remove_suffix(step.a.size());
        next.emplace_back(t);
      }
    } else {
      // Metaspace: the replacement becomes a space, except in the first token where it is dropped.
      for (size_t i = 0; i < tokens.size(); ++i) {
        std::string token = tokens[i];
        replace_all(token, step.a, i == 0 && step.prepend ? "" : " ");
        next.push_back(std::move(token));
      }
    }
    tokens = std::move(next);
  }
  std::string text;
  for (const std::string& token : tokens) text += token;
  return text;
}

}  // namespace

std::vector<std::string> json_pre_tokens(const Tokenizer& tokenizer, std::string_view text) {
  const auto* json_tokenizer = dynamic_cast<const JsonBpeTokenizer*>(&tokenizer);
  if (!json_tokenizer) fail("tokenizer kind", tokenizer.kind(), "a tokenizer read from tokenizer.json");
  std::vector<std::string> pieces;
  for (auto& [piece, added_id] : json_tokenizer->pre_tokens(text)) pieces.push_back(std::move(piece));
  return pieces;
}

std::unique_ptr<Tokenizer> parse_tokenizer_json(std::string_view json_text, const std::string& source) {
  return std::make_unique<JsonBpeTokenizer>(json_text, source);
}

}  // namespace rotary::tokenizers
