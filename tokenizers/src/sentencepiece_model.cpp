// tokenizers/src/sentencepiece_model.cpp: tokenizer.model, a serialized sentencepiece ModelProto, read here
// (libsentencepiece cannot be linked next to libtorch, lab/common/process.h says why) and run as sentencepiece's
// BPE model runs it:
//   normalize  sentencepiece's normalizer without a character map (the "identity" rule Llama 2 uses): leading,
//              repeated and trailing spaces dropped if remove_extra_whitespaces, a space put in front if
//              add_dummy_prefix, spaces written as U+2581 if escape_whitespaces;
//   split      into characters (code points), user_defined pieces taken whole and never merged;
//   merge      repeatedly the adjacent pair whose concatenation is a piece with the HIGHEST score (the leftmost on
//              ties), through a priority queue as sentencepiece does; pieces of type UNUSED are split back into
//              the pair that made them;
//   ids        each symbol's piece; one that is no piece is <unk> (a run of them one <unk>), or its UTF-8 bytes
//              as <0xNN> pieces when trainer_spec.byte_fallback.
// The protobuf wire format is read with every length and varint checked against the buffer: a truncated or
// lying file is a rotary::Error naming the file, the message and the byte offset.
#include <algorithm>
#include <cstring>
#include <queue>
#include <unordered_map>

#include "rotary/error.h"
#include "tokenizer_parts.h"

namespace rotary::tokenizers {
namespace {

// The protobuf wire format (protobuf.dev/programming-guides/encoding): a message is a sequence of fields, each a
// varint key (field number << 3 | wire type) and a value: 0 varint, 1 eight bytes, 2 a varint length and that
// many bytes, 5 four bytes. Groups (3, 4) are obsolete and not expected here.
class WireReader {
 public:
  WireReader(std::string_view data, const std::string& source, std::string message, size_t base)
      : data_(data), source_(source), message_(std::move(message)), base_(base) {}

  bool done() const { return at_ == data_.size(); }
  size_t offset() const { return base_ + at_; }  // in the file, for error messages and nested readers

  uint64_t varint(std::string_view what) {
    uint64_t value = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (at_ == data_.size()) bad(what, "a varint running past the end of its message");
      const unsigned char byte = static_cast<unsigned char>(data_[at_++]);
      if (shift == 63 && byte > 1) bad(what, "a varint longer than 64 bits");
      value |= uint64_t(byte & 0x7F) << shift;
      if (!(byte & 0x80)) return value;
    }
    bad(what, "a varint longer than 10 bytes");
  }

  // The next field's number and wire type.
  std::pair<uint64_t, int> key() {
    const uint64_t k = varint("field key");
    if ((k >> 3) == 0) bad("field key", "field number 0");
    return {k >> 3, int(k & 7)};
  }

  std::string_view length_delimited(std::string_view what) {
    const uint64_t length = varint(what);
    if (length > data_.size() - at_)
      bad(what, "a length of " + std::to_string(length) + " bytes with " + std::to_string(data_.size() - at_) +
                    " left in its message");
    const std::string_view bytes = data_.substr(at_, size_t(length));
    at_ += size_t(length);
    return bytes;
  }

  uint32_t fixed32(std::string_view what) {
    if (data_.size() - at_ < 4) bad(what, "a 4-byte value running past the end of its message");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) value |= uint32_t(static_cast<unsigned char>(data_[at_ + i])) << (8 * i);
    at_ += 4;
    return value;
  }

  void skip(int wire_type, uint64_t number) {
    const std::string what = "field " + std::to_string(number);
    switch (wire_type) {
      case 0: varint(what); return;
      case 1:
        if (data_.size() - at_ < 8) bad(what, "an 8-byte value running past the end of its message");
        at_ += 8;
        return;
      case 2: length_delimited(what); return;
      case 5: fixed32(what); return;
      default: bad(what, "wire type " + std::to_string(wire_type));
    }
  }

  // The value of a field expected to have `wire_type`.
  void expect(int wire_type, int expected, std::string_view what) {
    if (wire_type != expected)
      bad(what, "wire type " + std::to_string(wire_type) + " (expected " + std::to_string(expected) + ")");
  }

  [[noreturn]] void bad(std::string_view what, const std::string& found) const {
    fail(source_ + ": " + message_ + "." + std::string(what), found + " at byte " + std::to_string(offset()),
         "a well-formed sentencepiece ModelProto");
  }

  const std::string& source() const { return source_; }

 private:
  std::string_view data_;
  size_t at_ = 0;
  const std::string& source_;
  std::string message_;
  size_t base_;
};

enum PieceType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

struct Piece {
  std::string text;
  float score = 0;
  int type = kNormal;
};

class SentencePieceModelTokenizer final : public Tokenizer {
 public:
  SentencePieceModelTokenizer(std::string_view bytes, const std::string& source);
  // A vocabulary given as arrays (a GGUF file's "llama" tokenizer): BPE, the same checks as a ModelProto's.
  SentencePieceModelTokenizer(const SentencePieceVocab& vocab, const std::string& source);

  std::vector<int64_t> encode(std::string_view text) const override;
  std::vector<int64_t> encode_fragment(std::string_view text) const;  // one text without special pieces in it
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return int64_t(pieces_.size()); }
  std::string kind() const override { return "sentencepiece_model_bpe"; }
  std::optional<int64_t> token_id(std::string_view token) const override {
    const int id = piece_id(token);
    return id < 0 ? std::nullopt : std::optional<int64_t>(id);
  }

 private:
  // sentencepiece's PieceToId without the <unk> default: control, unknown and byte pieces first, then the rest.
  int piece_id(std::string_view piece) const {
    if (const auto it = reserved_.find(std::string(piece)); it != reserved_.end()) return it->second;
    if (const auto it = mergeable_.find(std::string(piece)); it != mergeable_.end()) return it->second;
    return -1;
  }
  std::string normalize(std::string_view text) const;
  void read_piece(std::string_view bytes, size_t base);
  void read_trainer_spec(std::string_view bytes, size_t base);
  void read_normalizer_spec(std::string_view bytes, size_t base);
  void check_pieces();  // the checks of the pieces and specs, and the ids they give

  std::string source_;
  std::vector<Piece> pieces_;
  std::unordered_map<std::string, int> mergeable_;  // NORMAL, USER_DEFINED, UNUSED: what merges may produce
  std::unordered_map<std::string, int> reserved_;   // CONTROL, UNKNOWN, BYTE
  std::vector<std::string> user_defined_;           // matched whole in the text
  std::vector<std::string> special_in_text_;        // CONTROL / UNKNOWN pieces matched in the raw text (GGUF)
  int unk_id_ = -1;
  int byte_id_[256];
  // trainer_spec and normalizer_spec, with the proto's defaults where a field is absent.
  int model_type_ = 1;  // UNIGRAM
  bool byte_fallback_ = false;
  bool treat_whitespace_as_suffix_ = false;
  int64_t spec_bos_id_ = 1, spec_eos_id_ = 2;
  std::string unk_surface_ = " \xE2\x81\x87 ";
  bool add_dummy_prefix_ = true;
  bool remove_extra_whitespaces_ = true;
  bool escape_whitespaces_ = true;
};

bool as_bool(uint64_t v) { return v != 0; }

void SentencePieceModelTokenizer::read_piece(std::string_view bytes, size_t base) {
  WireReader in(bytes, source_, "pieces[" + std::to_string(pieces_.size()) + "]", base);
  Piece piece;
  while (!in.done()) {
    const auto [number, wire] = in.key();
    if (number == 1) {
      in.expect(wire, 2, "piece");
      piece.text = std::string(in.length_delimited("piece"));
    } else if (number == 2) {
      in.expect(wire, 5, "score");
      const uint32_t bits = in.fixed32("score");
      static_assert(sizeof(float) == sizeof(uint32_t));
      std::memcpy(&piece.score, &bits, sizeof bits);
    } else if (number == 3) {
      in.expect(wire, 0, "type");
      const uint64_t type = in.varint("type");
      if (type < 1 || type > 6) in.bad("type", "type " + std::to_string(type));
      piece.type = int(type);
    } else {
      in.skip(wire, number);
    }
  }
  pieces_.push_back(std::move(piece));
}

void SentencePieceModelTokenizer::read_trainer_spec(std::string_view bytes, size_t base) {
  WireReader in(bytes, source_, "trainer_spec", base);
  while (!in.done()) {
    const auto [number, wire] = in.key();
    const auto read_varint = [&, wire = wire](const char* name) {
      in.expect(wire, 0, name);
      return in.varint(name);
    };
    switch (number) {
      case 3: model_type_ = int(read_varint("model_type")); break;
      case 24: treat_whitespace_as_suffix_ = as_bool(read_varint("treat_whitespace_as_suffix")); break;
      case 35: byte_fallback_ = as_bool(read_varint("byte_fallback")); break;
      // int32 fields: negative values are written as 10-byte varints of the sign-extended value.
      case 41: spec_bos_id_ = int64_t(int32_t(read_varint("bos_id"))); break;
      case 42: spec_eos_id_ = int64_t(int32_t(read_varint("eos_id"))); break;
      case 44:
        in.expect(wire, 2, "unk_surface");
        unk_surface_ = std::string(in.length_delimited("unk_surface"));
        break;
      default: in.skip(wire, number);
    }
  }
}

void SentencePieceModelTokenizer::read_normalizer_spec(std::string_view bytes, size_t base) {
  WireReader in(bytes, source_, "normalizer_spec", base);
  std::string name;
  size_t charsmap_size = 0, rule_tsv_size = 0;
  while (!in.done()) {
    const auto [number, wire] = in.key();
    const auto read_varint = [&, wire = wire](const char* field) {
      in.expect(wire, 0, field);
      return in.varint(field);
    };
    switch (number) {
      case 1:
        in.expect(wire, 2, "name");
        name = std::string(in.length_delimited("name"));
        break;
      case 2:
        in.expect(wire, 2, "precompiled_charsmap");
        charsmap_size = in.length_delimited("precompiled_charsmap").size();
        break;
      case 3: add_dummy_prefix_ = as_bool(read_varint("add_dummy_prefix")); break;
      case 4: remove_extra_whitespaces_ = as_bool(read_varint("remove_extra_whitespaces")); break;
      case 5: escape_whitespaces_ = as_bool(read_varint("escape_whitespaces")); break;
      case 6:
        in.expect(wire, 2, "normalization_rule_tsv");
        rule_tsv_size = in.length_delimited("normalization_rule_tsv").size();
        break;
      default: in.skip(wire, number);
    }
  }
  // A character map (nmt_nfkc and the like) rewrites text before tokenization; running without it would give
  // other ids, so such models are refused rather than half supported.
  // The message names the field that holds the map (the name alone may well be "identity").
  const std::string which = " (normalizer " + (name.empty() ? std::string("without a name") : name) + ")";
  const char* allowed = "none (rotary runs sentencepiece's normalizer without a character map only)";
  if (charsmap_size != 0)
    fail(source_ + ": normalizer_spec.precompiled_charsmap", std::to_string(charsmap_size) + " bytes" + which, allowed);
  if (rule_tsv_size != 0)
    fail(source_ + ": normalizer_spec.normalization_rule_tsv", std::to_string(rule_tsv_size) + " bytes" + which,
         allowed);
}

SentencePieceModelTokenizer::SentencePieceModelTokenizer(std::string_view bytes, const std::string& source)
    : source_(source) {
  WireReader in(bytes, source_, "ModelProto", 0);
  while (!in.done()) {
    const auto [number, wire] = in.key();
    if (number == 1 || number == 2 || number == 3) {
      const char* name = number == 1 ? "pieces" : number == 2 ? "trainer_spec" : "normalizer_spec";
      in.expect(wire, 2, name);
      const std::string_view body = in.length_delimited(name);
      const size_t base = in.offset() - body.size();
      if (number == 1) read_piece(body, base);
      if (number == 2) read_trainer_spec(body, base);
      if (number == 3) read_normalizer_spec(body, base);
    } else {
      in.skip(wire, number);
    }
  }
  check_pieces();
}

SentencePieceModelTokenizer::SentencePieceModelTokenizer(const SentencePieceVocab& vocab, const std::string& source)
    : source_(source) {
  model_type_ = 2;  // BPE
  byte_fallback_ = vocab.byte_fallback;
  add_dummy_prefix_ = vocab.add_dummy_prefix;
  remove_extra_whitespaces_ = vocab.remove_extra_whitespaces;
  spec_bos_id_ = vocab.bos_id, spec_eos_id_ = vocab.eos_id;
  for (size_t i = 0; i < vocab.pieces.size(); ++i) {
    const int type = vocab.types[i];
    if (type < 1 || type > 6)
      fail(source_ + ": pieces[" + std::to_string(i) + "].type", std::to_string(type),
           "1 to 6 (NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE)");
    pieces_.push_back({vocab.pieces[i], vocab.scores[i], type});
  }
  check_pieces();
  if (vocab.special_in_text)
    for (const Piece& p : pieces_)
      if (p.type == kControl || p.type == kUnknown) special_in_text_.push_back(p.text);
}

void SentencePieceModelTokenizer::check_pieces() {
  if (pieces_.empty()) fail(source_ + ": pieces", "none", "a sentencepiece ModelProto with pieces");
  if (model_type_ != 2) {
    const char* names[] = {"?", "UNIGRAM", "BPE", "WORD", "CHAR"};
    fail(source_ + ": trainer_spec.model_type",
         model_type_ >= 1 && model_type_ <= 4 ? names[model_type_] : std::to_string(model_type_), "BPE");
  }
  if (treat_whitespace_as_suffix_) fail(source_ + ": trainer_spec.treat_whitespace_as_suffix", "true", "false");
  std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& p = pieces_[i];
    const std::string field = source_ + ": pieces[" + std::to_string(i) + "].piece";
    if (p.text.empty()) fail(field, "\"\"", "a non-empty piece");
    // A piece that ends inside a character (a user-defined "af\xC3") would split the text's characters, leaving
    // encode() at a continuation byte that no character starts: every piece is whole UTF-8 text, as
    // sentencepiece's trainer writes them.
    check_utf8(p.text, field);
    const bool mergeable = p.type == kNormal || p.type == kUserDefined || p.type == kUnused;
    if (!(mergeable ? mergeable_ : reserved_).emplace(p.text, int(i)).second)
      fail(field, "\"" + p.text + "\"", "a piece not defined before");
    if (p.type == kUserDefined) user_defined_.push_back(p.text);
    if (p.type == kUnknown) {
      if (unk_id_ >= 0) fail(field, "a second UNKNOWN piece \"" + p.text + "\"", "one UNKNOWN piece");
      unk_id_ = int(i);
    }
    if (p.type == kByte) {
      const int byte = byte_token_value(p.text);
      if (byte < 0) fail(field, "\"" + p.text + "\" of type BYTE", "<0xNN>");
      byte_id_[byte] = int(i);
    }
  }
  if (unk_id_ < 0) fail(source_ + ": pieces", "no piece of type UNKNOWN", "one UNKNOWN piece (<unk>)");
  if (byte_fallback_) {
    for (int b = 0; b < 256; ++b)
      if (byte_id_[b] < 0) fail(source_ + ": pieces", "no BYTE piece " + byte_token_name(b), "all 256 byte pieces "
                                                                                             "with byte_fallback");
  }
  for (const int64_t id : {spec_bos_id_, spec_eos_id_}) {
    if (id >= 0 && id < vocab_size() && pieces_[size_t(id)].type == kControl)
      (id == spec_bos_id_ ? bos_id : eos_id) = id;
  }
}

std::string SentencePieceModelTokenizer::normalize(std::string_view input) const {
  std::string out;
  // Leading spaces first, so that a text of spaces only comes out empty.
  if (remove_extra_whitespaces_)
    while (!input.empty() && input.front() == ' ') input.remove_prefix(1);
  if (input.empty()) return out;
  const std::string_view space = escape_whitespaces_ ? kSpaceMark : std::string_view(" ");
  if (add_dummy_prefix_) out += space;
  bool previous_was_space = remove_extra_whitespaces_;
  for (const char c : input) {
    if (c == ' ') {
      if (!previous_was_space) out += space;
      previous_was_space = remove_extra_whitespaces_;
    } else {
      out.push_back(c);
      previous_was_space = false;
    }
  }
  if (remove_extra_whitespaces_)
    while (out.size() >= space.size() && std::string_view(out).substr(out.size() - space.size()) == space)
      out.resize(out.size() - space.size());
  return out;
}

std::vector<int64_t> SentencePieceModelTokenizer::encode(std::string_view text) const {
  check_utf8(text, "text");
  if (special_in_text_.empty()) return encode_fragment(text);
  // Special pieces written in the text are their ids, and the text between them is encoded fragment by fragment,
  // each normalized as a text of its own (a dummy prefix after a special piece too), as llama.cpp's SPM tokenizer
  // (and Hugging Face's tokenizer.json of the same model, through its added tokens) does.
  std::vector<int64_t> ids;
  size_t start = 0;
  for (size_t at = 0; at < text.size();) {
    const std::string* match = nullptr;
    for (const std::string& piece : special_in_text_)
      if ((!match || piece.size() > match->size()) && text.substr(at, piece.size()) == piece) match = &piece;
    if (!match) {
      ++at;
      continue;
    }
    if (at > start) {
      const std::vector<int64_t> part = encode_fragment(text.substr(start, at - start));
      ids.insert(ids.end(), part.begin(), part.end());
    }
    ids.push_back(piece_id(*match));
    at += match->size(), start = at;
  }
  if (start < text.size()) {
    const std::vector<int64_t> part = encode_fragment(text.substr(start));
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

std::vector<int64_t> SentencePieceModelTokenizer::encode_fragment(std::string_view text) const {
  const std::string normalized = normalize(text);
  struct Symbol {
    int prev, next;
    bool frozen;         // a user_defined piece: never merged
    size_t begin, size;  // in `normalized`; size 0 once merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  for (size_t at = 0; at < normalized.size();) {
    size_t length = 0;
    for (const std::string& piece : user_defined_)
      if (piece.size() > length && std::string_view(normalized).substr(at, piece.size()) == piece)
        length = piece.size();
    const bool frozen = length > 0;
    if (!frozen) length = utf8_char_length(normalized, at);
    if (length == 0) fail(source_ + ": encode", "text split inside a character at byte " + std::to_string(at),
                          "pieces of whole UTF-8 characters");  // unreachable after the load checks: never loop
    const int index = int(symbols.size());
    symbols.push_back({index - 1, at + length < normalized.size() ? index + 1 : -1, frozen, at, length});
    at += length;
  }
  const auto piece_of = [&](const Symbol& s) { return std::string_view(normalized).substr(s.begin, s.size); };

  struct Candidate {
    float score;
    int left, right;
    size_t size;
  };
  // Highest score first; the leftmost on equal scores.
  const auto after = [](const Candidate& a, const Candidate& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(after)> agenda(after);
  std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> unmerge;  // UNUSED pieces
  const auto consider = [&](int left, int right) {
    if (left < 0 || right < 0 || symbols[size_t(left)].frozen || symbols[size_t(right)].frozen) return;
    const Symbol& l = symbols[size_t(left)];
    const Symbol& r = symbols[size_t(right)];
    const std::string_view joined = std::string_view(normalized).substr(l.begin, l.size + r.size);
    const auto it = mergeable_.find(std::string(joined));
    if (it == mergeable_.end()) return;
    agenda.push({pieces_[size_t(it->second)].score, left, right, joined.size()});
    if (pieces_[size_t(it->second)].type == kUnused) unmerge[joined] = {piece_of(l), piece_of(r)};
  };
  for (size_t i = 1; i < symbols.size(); ++i) consider(int(i) - 1, int(i));
  while (!agenda.empty()) {
    const Candidate top = agenda.top();
    agenda.pop();
    Symbol& left = symbols[size_t(top.left)];
    Symbol& right = symbols[size_t(top.right)];
    // Stale: one side has been merged away or grown since this pair was queued.
    if (left.size == 0 || right.size == 0 || left.size + right.size != top.size) continue;
    left.size += right.size;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = top.left;
    right.size = 0;
    consider(left.prev, top.left);
    consider(top.left, left.next);
  }

  std::vector<int64_t> ids;
  bool previous_unknown = false;  // sentencepiece writes a run of unknown pieces as one <unk>
  const auto emit = [&](auto& self, std::string_view piece) -> void {
    int id = piece_id(piece);
    if (id >= 0 && pieces_[size_t(id)].type == kUnused) {
      if (const auto it = unmerge.find(piece); it != unmerge.end()) {
        self(self, it->second.first);
        self(self, it->second.second);
        return;
      }
    }
    if (id < 0) id = unk_id_;
    const bool unknown = id == unk_id_;
    if (unknown && byte_fallback_) {
      for (const char byte : piece) ids.push_back(byte_id_[static_cast<unsigned char>(byte)]);
    } else if (!(unknown && previous_unknown)) {
      ids.push_back(id);
    }
    previous_unknown = unknown;
  };
  for (int index = symbols.empty() ? -1 : 0; index >= 0; index = symbols[size_t(index)].next)
    emit(emit, piece_of(symbols[size_t(index)]));
  return ids;
}

std::string SentencePieceModelTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text, bytes;
  // As sentencepiece: the space added in front (a leading U+2581) is dropped from the first piece that shows
  // anything, unless an earlier piece was that space alone.
  bool at_start = true, start_space_seen = false;
  for (const int64_t id : ids) {
    check(id >= 0 && id < vocab_size(), "token id", id, "[0, " + std::to_string(vocab_size()) + ")");
    const Piece& piece = pieces_[size_t(id)];
    if (piece.type == kByte) {
      bytes.push_back(char(byte_token_value(piece.text)));
      continue;
    }
    text += bytes;
    bytes.clear();
    if (start_space_seen || !text.empty()) at_start = false;
    start_space_seen = false;
    // Special pieces matched in text decode back to that text (the round trip of encode, as llama.cpp renders
    // special tokens and Hugging Face decodes added tokens); sentencepiece itself drops CONTROL pieces.
    if (!special_in_text_.empty() && (piece.type == kControl || piece.type == kUnknown)) {
      text += piece.text;
      continue;
    }
    if (piece.type == kControl) continue;
    if (piece.type == kUnknown) {
      text += unk_surface_;
      continue;
    }
    std::string_view surface = piece.text;
    if (at_start && (add_dummy_prefix_ || remove_extra_whitespaces_) && surface.substr(0, 3) == kSpaceMark) {
      surface.remove_prefix(kSpaceMark.size());
      start_space_seen = !remove_extra_whitespaces_;
    }
    for (size_t at = 0; at < surface.size();) {
      if (surface.substr(at, 3) == kSpaceMark) {
        text.push_back(' ');
        at += 3;
      } else {
        text.push_back(surface[at++]);
      }
    }
  }
  return text + bytes;
}

}  // namespace

std::unique_ptr<Tokenizer> parse_sentencepiece_model(std::string_view model_bytes, const std::string& source) {
  return std::make_unique<SentencePieceModelTokenizer>(model_bytes, source);
}

std::unique_ptr<Tokenizer> sentencepiece_from_vocab(const SentencePieceVocab& vocab, const std::string& source) {
  return std::make_unique<SentencePieceModelTokenizer>(vocab, source);
}

}  // namespace rotary::tokenizers
