// tests/tokenizers/test_tokenizers.cpp: checkpoint tokenizers (tokenizers/).
//   - tokenizer.model against an independent oracle: small BPE models trained here with `spm_train` and encoded
//     with `spm_encode`, on many single-line texts (byte fallback, spaces, Unicode);
//   - the same models converted to tokenizer.json (Llama 2's layout: Prepend + Replace normalizer, byte_fallback,
//     Replace/ByteFallback/Fuse/Strip decoder), from the .vocab file spm_train writes (not through our protobuf
//     reader), against the same oracle: a cross-check of the tokenizer.json path;
//   - byte-level BPE on the fixtures of tests/data/hf_tokenizers (tests/hf/make_tokenizer_fixtures.py), with
//     splits and ids worked out by hand in the comments: no `tokenizers` library is available here;
//   - every kind of bad input, which must be a rotary::Error naming the file and the field.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/process.h"  // the sentencepiece programs, the oracle of tokenizer.model
#include "rotary/error.h"
#include "rotary_tokenizers/tokenizer.h"
#include "tokenizer_parts.h"

namespace rotary::tokenizers {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Ids = std::vector<int64_t>;

const fs::path kFixtures = fs::path(ROTARY_SOURCE_DIR) / "tests/data/hf_tokenizers";

// A call throws rotary::Error whose message contains every part.
void expect_error(const std::function<void()>& call, std::initializer_list<std::string> parts) {
  try {
    call();
    ADD_FAILURE() << "no rotary::Error; expected one naming " << *parts.begin();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
  }
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// A fresh directory under the system's temporary directory, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "rotary-tokenizers-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// ---------------------------------------------------------------------------------------------------------------
// sentencepiece: models trained by spm_train, encoded by spm_encode.

// Text to train on: sentences made of a small word list, so merges are plenty but many characters stay rare.
std::string training_text() {
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "then", "there",
                         "were", "three", "thin", "things", "that", "think", "hello", "world", "token", "tokens",
                         "merge", "merges", "in", "ing", "running", "singing", "café", "naïve", "über", "Zeus",
                         "Ζεύς", "42", "2024", "pi=3.14", "a,b", "x-y", "it's", "don't", "(ok)", "end."};
  std::mt19937 random(7);
  std::string text;
  for (int line = 0; line < 2000; ++line) {
    const int n = 3 + int(random() % 10);
    for (int w = 0; w < n; ++w) text += std::string(w ? " " : "") + words[random() % std::size(words)];
    text += "\n";
  }
  return text;
}

// Single-line texts for the oracle: hand-picked corner cases and random strings over an alphabet with characters
// spm_train never saw (byte fallback), runs of spaces and multi-byte characters.
std::vector<std::string> oracle_texts() {
  std::vector<std::string> texts = {
      "hello world", "the quick brown fox jumps over the lazy dog", "  two leading spaces", "trailing   ",
      "many     spaces    inside", " ", "   ", "x", "thinking things through", "café naïve über Ζεύς",
      "unseen: ÆØÅ 日本語 😀 €", "tab\there", "digits 1234567890 0.5", "it's don't won't", "((nested)) [brackets]",
      "theretherethere", "ingingining", "a b c d e f g", "über-naïve-café", "Zeus Ζεύς ζευς",
  };
  const std::vector<std::string> alphabet = {"a", "e", "t", "h", "r", "n", "i", "g", " ", " ", "  ", "é", "Ζ",
                                             "日", "😀", "q", ".", "'", "3", "ß", "\xc2\xa0"};
  std::mt19937 random(11);
  for (int i = 0; i < 300; ++i) {
    std::string text;
    const int n = 1 + int(random() % 24);
    for (int k = 0; k < n; ++k) text += alphabet[random() % alphabet.size()];
    texts.push_back(text);
  }
  return texts;
}

// spm_encode --output_format=id of each text (one line each; spm_encode encodes line by line).
std::vector<Ids> spm_encode_lines(const fs::path& model, const std::vector<std::string>& texts, const fs::path& dir) {
  const fs::path input = dir / "texts.txt";
  std::string joined;
  for (const std::string& t : texts) joined += t + "\n";
  write_file(input, joined);
  const std::string out = lab::run_command_or_fail(
      "spm_encode", {"spm_encode", "--model=" + model.string(), "--output_format=id"}, "apt-get install sentencepiece",
      input.string());
  std::vector<Ids> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    Ids ids;
    std::istringstream numbers(line);
    for (int64_t id; numbers >> id;) ids.push_back(id);
    lines.push_back(ids);
  }
  return lines;
}

struct SpmModel {
  fs::path model, vocab;
};

SpmModel train_spm(const fs::path& dir, const std::string& name, int vocab_size,
                   const std::vector<std::string>& extra_flags) {
  const fs::path corpus = dir / "corpus.txt";
  if (!fs::exists(corpus)) write_file(corpus, training_text());
  std::vector<std::string> argv = {"spm_train", "--input=" + corpus.string(), "--model_prefix=" + (dir / name).string(),
                                   "--model_type=bpe", "--vocab_size=" + std::to_string(vocab_size), "--character_coverage=1.0",
                                   "--normalization_rule_name=identity", "--num_threads=1", "--minloglevel=2"};
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  lab::run_command_or_fail("spm_train", argv, "apt-get install sentencepiece");
  return {dir / (name + ".model"), dir / (name + ".vocab")};
}

// The spm model as Llama 2's converted tokenizer.json lays it out, built from the .vocab file ("piece<TAB>score"
// per id): pieces -> vocab; every split of a piece into two pieces -> a merge, ranked by the merged piece's score
// (highest first), as Hugging Face's converter does; <unk> <s> </s> as added special tokens.
json llama2_style_json(const fs::path& vocab_file, bool metaspace) {
  std::vector<std::string> pieces;
  std::vector<double> scores;
  std::istringstream in(read_file(vocab_file));
  for (std::string line; std::getline(in, line);) {
    const size_t tab = line.find('\t');
    pieces.push_back(line.substr(0, tab));
    scores.push_back(std::stod(line.substr(tab + 1)));
  }
  json vocab = json::object();
  std::map<std::string, size_t> id_of;
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = i, id_of[pieces[i]] = i;
  const auto mergeable = [&](const std::string& p) {
    const auto it = id_of.find(p);
    return it != id_of.end() && it->second > 2 && !(p.size() == 6 && p.rfind("<0x", 0) == 0);
  };
  std::vector<std::tuple<double, size_t, size_t, std::string, std::string>> ranked;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!mergeable(pieces[i])) continue;
    for (size_t cut = 1; cut < pieces[i].size(); ++cut) {
      const std::string left = pieces[i].substr(0, cut), right = pieces[i].substr(cut);
      if (mergeable(left) && mergeable(right))
        ranked.emplace_back(-scores[i], id_of[left], id_of[right], left, right);
    }
  }
  std::sort(ranked.begin(), ranked.end());
  json merges = json::array();
  for (const auto& m : ranked) merges.push_back(json::array({std::get<3>(m), std::get<4>(m)}));
  const auto special = [](int id, const char* content) {
    return json{{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                {"normalized", false}, {"special", true}};
  };
  json t = {
      {"version", "1.0"},
      {"added_tokens", {special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")}},
      {"normalizer", json{{"type", "Sequence"},
                          {"normalizers", {{{"type", "Prepend"}, {"prepend", "▁"}},
                                           {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder", {{"type", "Sequence"},
                   {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                                 {{"type", "ByteFallback"}},
                                 {{"type", "Fuse"}},
                                 {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"continuing_subword_prefix", nullptr},
                 {"end_of_word_suffix", nullptr}, {"fuse_unk", true}, {"byte_fallback", true},
                 {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}}},
  };
  if (metaspace) {
    // The newer conversion: no normalizer, a Metaspace pre-tokenizer and decoder.
    t["normalizer"] = nullptr;
    t["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}, {"split", false}};
    t["decoder"] = {{"type", "Sequence"},
                    {"decoders", {{{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"},
                                   {"split", false}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}}}}};
  }
  return t;
}

class SentencePieceOracle : public ::testing::Test {
 protected:
  void SetUp() override {
    if (lab::find_in_path("spm_train").empty() || lab::find_in_path("spm_encode").empty())
      GTEST_SKIP() << "spm_train / spm_encode missing (apt-get install sentencepiece)";
  }
  TempDir dir_;
};

// Llama 2's settings: byte fallback, the dummy prefix, extra whitespace kept.
TEST_F(SentencePieceOracle, TokenizerModelMatchesSpmEncodeWithByteFallback) {
  const SpmModel spm = train_spm(dir_.path(), "llama2", 400, {"--byte_fallback=true", "--remove_extra_whitespaces=false"});
  const auto tokenizer = parse_sentencepiece_model(read_file(spm.model), spm.model.string());
  EXPECT_EQ(tokenizer->kind(), "sentencepiece_model_bpe");
  EXPECT_EQ(tokenizer->vocab_size(), 400);
  EXPECT_EQ(tokenizer->bos_id, 1);
  EXPECT_EQ(tokenizer->eos_id, 2);
  const std::vector<std::string> texts = oracle_texts();
  const std::vector<Ids> expected = spm_encode_lines(spm.model, texts, dir_.path());
  ASSERT_EQ(expected.size(), texts.size());
  size_t byte_pieces = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const Ids ids = tokenizer->encode(texts[i]);
    EXPECT_EQ(ids, expected[i]) << "text: '" << texts[i] << "'";
    EXPECT_EQ(tokenizer->decode(ids), texts[i]);
    for (const int64_t id : ids) byte_pieces += id >= 3 && id < 259;
  }
  EXPECT_GT(byte_pieces, 100u) << "the texts should exercise byte fallback";
  // Newlines: spm_encode cannot show them (it reads lines), but the text is one string: "\n" is byte 0x0A, id 3+10.
  const Ids with_newline = tokenizer->encode("hello\nworld");
  EXPECT_NE(std::find(with_newline.begin(), with_newline.end(), 3 + 0x0A), with_newline.end());
  EXPECT_EQ(tokenizer->decode(with_newline), "hello\nworld");
}

// sentencepiece's defaults: extra whitespace removed; a user-defined piece matched whole; no byte fallback (<unk>).
TEST_F(SentencePieceOracle, TokenizerModelMatchesSpmEncodeWithDefaultsAndUserSymbols) {
  const SpmModel spm = train_spm(dir_.path(), "plain", 250, {"--user_defined_symbols=<sep>,thin"});
  const auto tokenizer = parse_sentencepiece_model(read_file(spm.model), spm.model.string());
  std::vector<std::string> texts = oracle_texts();
  texts.push_back("a<sep>b thin<sep>thinking");
  const std::vector<Ids> expected = spm_encode_lines(spm.model, texts, dir_.path());
  ASSERT_EQ(expected.size(), texts.size());
  size_t unknowns = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const Ids ids = tokenizer->encode(texts[i]);
    EXPECT_EQ(ids, expected[i]) << "text: '" << texts[i] << "'";
    unknowns += size_t(std::count(ids.begin(), ids.end(), 0));
  }
  EXPECT_GT(unknowns, 10u) << "the texts should meet <unk>";
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("  hello   world ")), "hello world");
}

// The same model as Llama 2's tokenizer.json (built from the .vocab file) gives spm_encode's ids too.
TEST_F(SentencePieceOracle, ConvertedTokenizerJsonMatchesSpmEncode) {
  const SpmModel spm = train_spm(dir_.path(), "llama2", 400, {"--byte_fallback=true", "--remove_extra_whitespaces=false"});
  const fs::path model_dir = dir_.path() / "converted";
  fs::create_directories(model_dir);
  write_file(model_dir / "tokenizer.json", llama2_style_json(spm.vocab, false).dump());
  write_file(model_dir / "tokenizer_config.json",
             R"({"add_bos_token": true, "add_eos_token": false, "bos_token": {"content": "<s>"}, "eos_token": "</s>"})");
  const auto tokenizer = load_tokenizer(model_dir);
  EXPECT_EQ(tokenizer->kind(), "sentencepiece_bpe");
  EXPECT_TRUE(tokenizer->add_bos);
  EXPECT_EQ(tokenizer->bos_id, 1);
  EXPECT_EQ(tokenizer->eos_id, 2);
  const std::vector<std::string> texts = oracle_texts();
  const std::vector<Ids> expected = spm_encode_lines(spm.model, texts, dir_.path());
  ASSERT_EQ(expected.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const Ids ids = tokenizer->encode(texts[i]);
    EXPECT_EQ(ids, expected[i]) << "text: '" << texts[i] << "'";
    EXPECT_EQ(tokenizer->decode(ids), texts[i]);
  }
  Ids with_bos = expected[0];
  with_bos.insert(with_bos.begin(), 1);
  EXPECT_EQ(tokenizer->encode_for_model(texts[0]), with_bos);
  // "<s>" in the text is the special token, then the text after it is normalized on its own ("▁" prepended).
  const Ids special = tokenizer->encode("<s>hello");
  ASSERT_FALSE(special.empty());
  EXPECT_EQ(special[0], 1);
  EXPECT_EQ(Ids(special.begin() + 1, special.end()), tokenizer->encode("hello"));

  // The Metaspace layout (prepend_scheme "first") agrees with sentencepiece except at a leading space, which
  // `tokenizers` does not double: " hello" is encoded as "hello" is.
  const auto metaspace = parse_tokenizer_json(llama2_style_json(spm.vocab, true).dump(), "metaspace.json");
  for (size_t i = 0; i < texts.size(); ++i) {
    if (texts[i].empty() || texts[i][0] == ' ') continue;
    const Ids ids = metaspace->encode(texts[i]);
    EXPECT_EQ(ids, expected[i]) << "text: '" << texts[i] << "'";
    EXPECT_EQ(metaspace->decode(ids), texts[i]);
  }
  EXPECT_EQ(metaspace->encode(" hello world"), metaspace->encode("hello world"));
}

// ---------------------------------------------------------------------------------------------------------------
// byte-level BPE fixtures: token b (0..255) is byte b; merges (rank: id): Ġt 0:256, he 1:257, Ġthe 2:258,
// in 3:259, ing 4:260, ĠĠ 5:261, 12 6:262, 123 7:263, 's 8:264, ĊĊ 9:265, th 10:267; "Ġhello" 266 (no merge
// makes it); specials 300, 301.

// GPT-2's byte characters, written out again here: the pre-tokens of the raw `text`, as the model sees them.
std::string byte_level(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const unsigned b = static_cast<unsigned char>(c);
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    // The 68 others, in byte order, from U+0100: 0x00-0x20 (33), 0x7F-0xA0 (34), 0xAD.
    const unsigned code = printable ? b : b <= 0x20 ? 256 + b : b <= 0xA0 ? 289 + (b - 0x7F) : 323;
    append_utf8(out, char32_t(code));
  }
  return out;
}
std::vector<std::string> byte_level_all(const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  for (const std::string& p : pieces) out.push_back(byte_level(p));
  return out;
}

TEST(ByteLevelTable, MatchesGpt2) {
  EXPECT_EQ(byte_level(" "), "Ġ");        // U+0120
  EXPECT_EQ(byte_level("\n"), "Ċ");       // U+010A
  EXPECT_EQ(byte_level("\x7f"), "ġ");     // U+0121: 0x7F is the 34th non-printable byte
  EXPECT_EQ(byte_level("\xad"), "Ń");     // U+0143: the last of the 68
  EXPECT_EQ(byte_level("a~¡"), "a~Â¡");   // '¡' is C2 A1: Â (C2 printable) and ¡
}

std::unique_ptr<Tokenizer> fixture(const std::string& name) { return load_tokenizer(kFixtures / name); }

TEST(Llama3Style, PreTokenizesWithTheLlama3Regex) {
  const auto t = fixture("llama3_style");
  const auto splits = [&](const std::string& text) { return json_pre_tokens(*t, text); };
  // Worked by hand from the regex: alternatives are tried in order at each position.
  EXPECT_EQ(splits("Hello world"), byte_level_all({"Hello", " world"}));
  // Contractions, case-insensitive: (?i:'s|'t|...).
  EXPECT_EQ(splits("I'm can't WE'LL IT'S"), byte_level_all({"I", "'m", " can", "'t", " WE", "'LL", " IT", "'S"}));
  // Digits in groups of at most 3; the space before digits is a piece of its own (\s+ after \s+(?!\S) fails).
  EXPECT_EQ(splits("1234567 89"), byte_level_all({"123", "456", "7", " ", "89"}));
  // Punctuation runs: ` ?[^\s\p{L}\p{N}]+[\r\n]*`, taking the newlines after them.
  EXPECT_EQ(splits("hello!!! world...\n\nx"), byte_level_all({"hello", "!!!", " world", "...\n\n", "x"}));
  // Newlines: \s*[\r\n]+.
  EXPECT_EQ(splits("a\n\nb"), byte_level_all({"a", "\n\n", "b"}));
  // Spaces before a word: \s+(?!\S) leaves the last space to the word.
  EXPECT_EQ(splits("x   y"), byte_level_all({"x", "  ", " y"}));
  EXPECT_EQ(splits("trailing  "), byte_level_all({"trailing", "  "}));
  // A tab before a word joins it ([^\r\n\p{L}\p{N}]?\p{L}+).
  EXPECT_EQ(splits("\tx"), byte_level_all({"\tx"}));
  // Non-ASCII letters are \p{L}; emoji are not letters: a punctuation-like run.
  EXPECT_EQ(splits("Ünïcödé café Ζεύς"), byte_level_all({"Ünïcödé", " café", " Ζεύς"}));
  EXPECT_EQ(splits("😀😀 ok"), byte_level_all({"😀😀", " ok"}));
  EXPECT_EQ(splits("$100"), byte_level_all({"$", "100"}));
  // U+000B is \s for Oniguruma (Unicode White_Space; older ICU documents \s without it). At the first
  // VT: \s+(?!\S) takes one VT (the next is white space); the second joins "b" as [^\r\n\p{L}\p{N}]?\p{L}+.
  EXPECT_EQ(splits("a\v\vb"), byte_level_all({"a", "\v", "\vb"}));
  // U+0085 (NEL) likewise; U+00A0 (no-break space) is \s for both.
  EXPECT_EQ(splits("a\xc2\x85\xc2\x85!"), byte_level_all({"a", "\xc2\x85", "\xc2\x85", "!"}));
  // Special tokens are cut out before the regex runs.
  EXPECT_EQ(splits("<|begin_of_text|>hi there"), (std::vector<std::string>{"<|begin_of_text|>", "hi", byte_level(" there")}));
}

TEST(Llama3Style, EncodesWithMergesInRankOrder) {
  const auto t = fixture("llama3_style");
  EXPECT_EQ(t->kind(), "byte_level_bpe");
  EXPECT_EQ(t->vocab_size(), 302);
  // "the": pairs (t,h) rank 10 and (h,e) rank 1: "he" first, then (t,he) is no merge.
  EXPECT_EQ(t->encode("the"), (Ids{'t', 257}));
  // " the" is "Ġthe", a vocabulary entry: whole (ignore_merges; the merges would give it too).
  EXPECT_EQ(t->encode(" the"), (Ids{258}));
  // "Ġhello" is a vocabulary entry no merge reaches: ignore_merges takes it whole.
  EXPECT_EQ(t->encode(" hello"), (Ids{266}));
  // "testing": (i,n) rank 3, then (in,g) rank 4.
  EXPECT_EQ(t->encode("testing"), (Ids{'t', 'e', 's', 't', 260}));
  // "1234" -> "123" "4"; "4123" -> "412" "3": 4 (1,2)->12, and the 3 is another pre-token.
  EXPECT_EQ(t->encode("1234"), (Ids{263, '4'}));
  EXPECT_EQ(t->encode("4123"), (Ids{'4', 262, '3'}));
  EXPECT_EQ(t->encode("it's"), (Ids{'i', 't', 264}));
  EXPECT_EQ(t->encode("a\n\nb"), (Ids{'a', 265, 'b'}));
  EXPECT_EQ(t->encode("x   y"), (Ids{'x', 261, ' ', 'y'}));
  EXPECT_EQ(t->encode("<|begin_of_text|>the end<|end_of_text|>"), (Ids{300, 't', 257, ' ', 'e', 'n', 'd', 301}));
  EXPECT_EQ(t->encode("é😀"), (Ids{0xC3, 0xA9, 0xF0, 0x9F, 0x98, 0x80}));
  EXPECT_EQ(t->encode(""), Ids{});
  // BOS from the post_processor's template; ids from tokenizer_config.json.
  EXPECT_TRUE(t->add_bos);
  EXPECT_FALSE(t->add_eos);
  EXPECT_EQ(t->bos_id, 300);
  EXPECT_EQ(t->eos_id, 301);
  EXPECT_EQ(t->encode_for_model("the"), (Ids{300, 't', 257}));
}

TEST(Llama3Style, WithoutIgnoreMergesTheMergesDecide) {
  json j = json::parse(read_file(kFixtures / "llama3_style/tokenizer.json"));
  j["model"]["ignore_merges"] = false;
  const auto t = parse_tokenizer_json(j.dump(), "tokenizer.json");
  EXPECT_EQ(t->encode(" hello"), (Ids{' ', 257, 'l', 'l', 'o'}));
  EXPECT_EQ(t->encode(" the"), (Ids{258}));  // (Ġ,t) rank 0, (h,e) rank 1, then (Ġt,he) rank 2
}

TEST(Gpt2Style, SplitsWithTheGpt2RegexAndEncodes) {
  const auto t = fixture("gpt2_style");
  EXPECT_EQ(t->kind(), "byte_level_bpe");
  // Digits in one run (` ?\p{N}+`); contractions are case-sensitive; each newline alone before a letter.
  EXPECT_EQ(json_pre_tokens(*t, "4123 IT'S a\n\nb"),
            byte_level_all({"4123", " IT", "'", "S", " a", "\n", "\n", "b"}));
  EXPECT_EQ(t->encode("4123"), (Ids{'4', 263}));  // (1,2) rank 6, then (12,3) rank 7
  EXPECT_EQ(t->encode("a\n\nb"), (Ids{'a', '\n', '\n', 'b'}));
  EXPECT_EQ(t->encode(" hello"), (Ids{' ', 257, 'l', 'l', 'o'}));  // no ignore_merges
  EXPECT_EQ(t->encode("hi<|endoftext|>"), (Ids{'h', 'i', 300}));
  EXPECT_FALSE(t->add_bos);
  EXPECT_EQ(t->bos_id, 300);
  EXPECT_EQ(t->encode_for_model("hi"), (Ids{'h', 'i'}));
  // add_prefix_space: a space in front of each piece between special tokens.
  json j = json::parse(read_file(kFixtures / "gpt2_style/tokenizer.json"));
  j["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(parse_tokenizer_json(j.dump(), "tokenizer.json")->encode("the"), (Ids{258}));
}

TEST(ByteLevelBpe, DecodeRoundTripsArbitraryText) {
  for (const char* name : {"llama3_style", "gpt2_style"}) {
    const auto t = fixture(name);
    std::mt19937 random(3);
    for (int i = 0; i < 200; ++i) {
      std::string text;
      const int n = int(random() % 40);
      for (int k = 0; k < n; ++k) {
        // Any code point but surrogates: controls, spaces, letters of all scripts, emoji.
        char32_t c = random() % 5 == 0 ? char32_t(random() % 0x110000) : char32_t(random() % 0x180);
        if (c >= 0xD800 && c <= 0xDFFF) c = 'x';
        append_utf8(text, c);
      }
      EXPECT_EQ(t->decode(t->encode(text)), text) << name;
    }
    EXPECT_EQ(t->decode({'h', 'i', 300}), std::string("hi") + (std::string(name) == "gpt2_style" ? "<|endoftext|>"
                                                                                                   : "<|begin_of_text|>"));
  }
}

TEST(ByteLevelBpe, ByteFallbackAndUnknownInTokenizerJson) {
  // A sentencepiece-style model where 'z' is unknown: with byte_fallback it is <0x7A>; without, <unk>, fused.
  json j = {{"model", {{"type", "BPE"}, {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", true},
                       {"vocab", {{"<unk>", 0}, {"<0x7A>", 1}, {"a", 2}, {"b", 3}, {"ab", 4}}},
                       {"merges", {"a b"}}}}};
  EXPECT_EQ(parse_tokenizer_json(j.dump(), "t.json")->encode("abzzab"), (Ids{4, 1, 1, 4}));
  EXPECT_EQ(parse_tokenizer_json(j.dump(), "t.json")->encode("aéb"), (Ids{2, 0, 3}));  // no <0xC3> token
  j["model"]["byte_fallback"] = false;
  EXPECT_EQ(parse_tokenizer_json(j.dump(), "t.json")->encode("abzzab"), (Ids{4, 0, 4}));
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(parse_tokenizer_json(j.dump(), "t.json")->encode("abzzab"), (Ids{4, 0, 0, 4}));
  // No decoder: tokens joined with spaces, as `tokenizers` does.
  EXPECT_EQ(parse_tokenizer_json(j.dump(), "t.json")->decode({4, 2}), "ab a");
}

// ---------------------------------------------------------------------------------------------------------------
// Bad input.

json llama3_json() { return json::parse(read_file(kFixtures / "llama3_style/tokenizer.json")); }

TEST(TokenizerErrors, UnsupportedTokenizerJsonIsNamed) {
  const auto refused = [](const std::function<void(json&)>& edit, std::initializer_list<std::string> parts) {
    json j = llama3_json();
    edit(j);
    expect_error([&] { parse_tokenizer_json(j.dump(), "dir/tokenizer.json"); }, parts);
  };
  refused([](json& j) { j["model"]["type"] = "WordPiece"; }, {"dir/tokenizer.json: model.type = WordPiece", "BPE"});
  refused([](json& j) { j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Whitespace"}}; },
          {"pre_tokenizer.pretokenizers[0].type = Whitespace"});
  refused([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Contiguous"; },
          {"pre_tokenizer.pretokenizers[0].behavior = Contiguous"});
  refused([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+"; },
          {"pre_tokenizer.pretokenizers[0].pattern", "\\w"});
  refused([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
          {"pre_tokenizer.pretokenizers[0].pattern", "ICU"});
  refused([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, {"normalizer.type = Lowercase"});
  refused([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, {"decoder.type = WordPiece"});
  refused([](json& j) { j["model"]["merges"].push_back({"Ġt", "nowhere"}); },
          {"model.merges[11]", "\"nowhere\" is not in model.vocab"});
  refused([](json& j) { j["model"]["merges"][0] = "a b c"; }, {"model.merges[0]"});
  refused([](json& j) { j["model"]["dropout"] = 0.1; }, {"model.dropout = 0.1"});
  refused([](json& j) { j["model"]["vocab"]["x"] = -1; }, {"model.vocab[\"x\"] = -1"});
  refused([](json& j) { j["model"]["vocab"]["x"] = 5; }, {"= 5", "an id no other token has"});  // 5 is taken
  refused([](json& j) { j["added_tokens"][0]["single_word"] = true; }, {"added_tokens[0].single_word = true"});
  // Ids Hugging Face's tokenizers would not give (it numbers added tokens itself, from the vocabulary's size): a gap
  // after the vocabulary, a special token numbered out of order, a vocabulary token under another id.
  refused([](json& j) { j["model"]["vocab"].erase("<unused31>"); },  // 299 tokens: HF gives the first added 299
          {"added_tokens[0].id = 300", "\"<|begin_of_text|>\": 299", "299 tokens"});
  refused([](json& j) { std::swap(j["added_tokens"][0]["id"], j["added_tokens"][1]["id"]); },
          {"added_tokens[0].id = 301", ": 300"});
  refused([](json& j) { j["added_tokens"].push_back({{"id", 302}, {"content", "<unused5>"}, {"special", true}}); },
          {"added_tokens[2].id = 302", "\"<unused5>\": 273"});
  refused([](json& j) { j["added_tokens"].push_back({{"id", 305}, {"content", "<|new|>"}, {"special", true}}); },
          {"added_tokens[2].id = 305", ": 302"});
  json numbered = llama3_json();  // the ids Hugging Face gives: the next after the last, or the vocabulary's own
  numbered["added_tokens"].push_back({{"id", 302}, {"content", "<|new|>"}, {"special", true}});
  numbered["added_tokens"].push_back({{"id", 273}, {"content", "<unused5>"}, {"special", true}});
  EXPECT_EQ(parse_tokenizer_json(numbered.dump(), "ok.json")->encode("a<|new|><unused5>"), (Ids{'a', 302, 273}));
  refused([](json& j) { j["post_processor"] = {{"type", "RobertaProcessing"}}; },
          {"post_processor.type = RobertaProcessing"});
  refused([](json& j) { j.erase("model"); }, {"model = (missing)"});
  expect_error([] { parse_tokenizer_json("{\"model\": [", "bad.json"); }, {"bad.json", "malformed JSON"});
  const auto t = fixture("llama3_style");
  expect_error([&] { t->encode("bad \xff utf-8"); }, {"text = ", "byte 4"});
  expect_error([&] { t->decode({302}); }, {"token id = 302"});
}

TEST(TokenizerErrors, MissingFilesAndConfigFields) {
  TempDir dir;
  expect_error([&] { load_tokenizer(dir.path()); }, {"no tokenizer.json or tokenizer.model", dir.path().string()});
  fs::copy_file(kFixtures / "llama3_style/tokenizer.json", dir.path() / "tokenizer.json");
  write_file(dir.path() / "tokenizer_config.json", R"({"bos_token": "<nope>"})");
  expect_error([&] { load_tokenizer(dir.path()); }, {"tokenizer_config.json: bos_token = \"<nope>\""});
  write_file(dir.path() / "tokenizer_config.json", R"({"add_bos_token": "yes"})");
  expect_error([&] { load_tokenizer(dir.path()); }, {"tokenizer_config.json: add_bos_token = \"yes\""});
  write_file(dir.path() / "tokenizer_config.json", R"({"add_bos_token": false, "eos_token": {"content": "<|end_of_text|>"}})");
  const auto t = load_tokenizer(dir.path());
  EXPECT_FALSE(t->add_bos);
  EXPECT_EQ(t->eos_id, 301);
}

// A ModelProto written by hand: pieces <unk> (UNKNOWN), "a", "b", "ab"; trainer_spec model_type; normalizer_spec.
std::string varint(uint64_t v) {
  std::string out;
  do {
    out.push_back(char((v & 0x7F) | (v > 0x7F ? 0x80 : 0)));
    v >>= 7;
  } while (v);
  return out;
}
std::string field(int number, const std::string& bytes) { return varint(uint64_t(number) << 3 | 2) + varint(bytes.size()) + bytes; }
std::string piece(const std::string& text, float score, int type) {
  std::string bits(4, '\0');
  std::memcpy(bits.data(), &score, 4);
  return field(1, field(1, text) + varint(2 << 3 | 5) + bits + varint(3 << 3) + varint(uint64_t(type)));
}
std::string model_proto(int model_type) {
  return piece("<unk>", 0, 2) + piece("a", -1, 1) + piece("b", -2, 1) + piece("ab", -0.5f, 1) +
         field(2, varint(3 << 3) + varint(uint64_t(model_type))) + field(3, field(1, "identity"));
}

TEST(TokenizerErrors, SentencePieceModelBytes) {
  // The handwritten model works: "ab" is a piece ("▁" is not, so it stays <unk>).
  EXPECT_EQ(parse_sentencepiece_model(model_proto(2), "m")->encode("ab a"), (Ids{0, 3, 0, 1}));
  expect_error([] { parse_sentencepiece_model(model_proto(1), "dir/tokenizer.model"); },
               {"dir/tokenizer.model: trainer_spec.model_type = UNIGRAM", "BPE"});
  const std::string good = model_proto(2);
  for (size_t cut = 1; cut < good.size(); ++cut) {
    // Every truncation is an error or (at a message boundary) a smaller valid model; never a read past the end.
    try {
      parse_sentencepiece_model(good.substr(0, cut), "m");
    } catch (const Error&) {
    }
  }
  expect_error([] { parse_sentencepiece_model(std::string("\x0a\x05\x0a\x01", 4), "m"); },
               {"m: ModelProto.pieces", "length of 5 bytes with 2 left"});
  expect_error([] { parse_sentencepiece_model(std::string("\x20\x80", 2), "m"); },  // field 4, a varint
               {"m: ModelProto.field 4", "past the end"});
  expect_error([&] { parse_sentencepiece_model(good.substr(0, good.size() - 3), "m"); }, {"m: ", "normalizer_spec"});
  expect_error([] { parse_sentencepiece_model(std::string("\x0a\x02\x18\x09", 4), "m"); },
               {"m: pieces[0].type", "type 9"});
  expect_error([] { parse_sentencepiece_model("", "m"); }, {"m: pieces = none"});
  // A user-defined piece ending inside a character (found by the fuzzer: "af\xC3" left encode() at the
  // continuation byte of "caf\xC3\xA9" forever, growing its symbols until memory ran out) is refused at load.
  const std::string partial = model_proto(2) + piece("af\xC3", 0, 4);
  expect_error([&] { parse_sentencepiece_model(partial, "m"); },
               {"m: pieces[4].piece", "malformed UTF-8 sequence at byte 2"});
  const std::string nfkc = piece("<unk>", 0, 2) + field(2, varint(3 << 3) + varint(2)) +
                           field(3, field(1, "nmt_nfkc") + field(2, "xxxx"));
  expect_error([&] { parse_sentencepiece_model(nfkc, "m"); },
               {"m: normalizer_spec.precompiled_charsmap = 4 bytes (normalizer nmt_nfkc)", "allowed: none"});
  // A map under the name "identity": the message names the map, and never lists the rejected value as allowed.
  const std::string identity_with_map = piece("<unk>", 0, 2) + field(2, varint(3 << 3) + varint(2)) +
                                        field(3, field(1, "identity") + field(2, "xxxx"));
  try {
    parse_sentencepiece_model(identity_with_map, "m");
    ADD_FAILURE() << "a character map named identity was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("normalizer_spec.precompiled_charsmap = 4 bytes (normalizer identity)"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("allowed: identity"), std::string::npos) << msg;
  }
}

TEST(TokenIdFile, ReadsAndChecks) {
  TempDir dir;
  const fs::path file = dir.path() / "ids.txt";
  write_file(file, "1 2\n3\t\t4\n\n 0 ");
  EXPECT_EQ(read_token_id_file(file, 5), (Ids{1, 2, 3, 4, 0}));
  write_file(file, "1 2\n3 x4 5");
  expect_error([&] { read_token_id_file(file, 10); }, {file.string(), "token 4 (line 2) = \"x4\"", "[0, 10)"});
  write_file(file, "1 2\n\n9");
  expect_error([&] { read_token_id_file(file, 9); }, {"token 3 (line 3) = 9"});
  write_file(file, "-1");
  expect_error([&] { read_token_id_file(file, 9); }, {"token 1 (line 1) = \"-1\""});
  write_file(file, "99999999999999999999999");
  expect_error([&] { read_token_id_file(file, 9); }, {"token 1 (line 1)"});
  expect_error([&] { read_token_id_file(dir.path() / "missing.txt", 9); }, {"missing.txt"});
  // A directory (was an internal error from the stream) or a FIFO (open() waited forever) is refused by name.
  expect_error([&] { read_token_id_file(dir.path(), 9); }, {"token id file = " + dir.path().string() + " (a directory)"});
  ASSERT_EQ(::mkfifo((dir.path() / "fifo.txt").c_str(), 0600), 0);
  expect_error([&] { read_token_id_file(dir.path() / "fifo.txt", 9); }, {"fifo.txt (a FIFO)"});
}

// A tokenizer file that is there but is not a regular file is refused by name (not skipped, not waited on).
TEST(TokenizerErrors, FifoOrDirectoryInPlaceOfATokenizerFile) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir.path() / "tokenizer.json").c_str(), 0600), 0);
  expect_error([&] { load_tokenizer(dir.path()); }, {"tokenizer.json (a FIFO)"});
  fs::remove(dir.path() / "tokenizer.json");
  fs::create_directory(dir.path() / "tokenizer.model");
  expect_error([&] { load_tokenizer(dir.path()); }, {"tokenizer.model (a directory)"});
}

// The regex time limit holds for a whole text, not for each piece of it: a pattern that backtracks badly on every
// piece between added tokens (60 pieces, each well under a per-piece limit, over 60 s in all) stops within the
// one budget of the text.
TEST(TokenizerErrors, SplitRegexTimeIsBudgetedPerText) {
  json j = llama3_json();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "(a|aa)+b|\\s+|[^\\s]"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  const auto tokenizer = parse_tokenizer_json(j.dump(), "dir/tokenizer.json");
  const std::string separator = j["added_tokens"][0]["content"];
  std::string text;
  for (int piece = 0; piece < 60; ++piece) text += std::string(32, 'a') + separator;
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { tokenizer->encode(text); }, {"tokenizer split regex", "per text"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 45.0);
}

// What generate prints after the prompt: the continuation decoded together with the prompt's ids, so that the
// decoder's rules apply across the boundary (a sentencepiece decoder strips a text's leading space: the new ids
// alone would print "Paris" after "France is", "France isParis").
TEST(Decode, ContinuationKeepsTheSpaceAtTheBoundary) {
  const json j = {  // Llama 2's layout (tokenizers' conversion of a sentencepiece model)
      {"normalizer", {{"type", "Sequence"},
                      {"normalizers", {{{"type", "Prepend"}, {"prepend", "▁"}},
                                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}}},
      {"decoder", {{"type", "Sequence"},
                   {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                                 {{"type", "Fuse"}},
                                 {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model", {{"type", "BPE"}, {"unk_token", "<unk>"},
                 {"vocab", {{"<unk>", 0}, {"▁France", 1}, {"▁is", 2}, {"▁Paris", 3}, {".", 4}}},
                 {"merges", json::array()}}}};
  const auto t = parse_tokenizer_json(j.dump(), "t.json");
  EXPECT_EQ(t->decode({3}), "Paris");  // the decoder's own rule, which loses the space after a prompt
  EXPECT_EQ(t->decode_continuation({1, 2}, {3, 4}), " Paris.");
  EXPECT_EQ(t->decode_continuation({1, 2}, {}), "");
  EXPECT_EQ(t->decode_continuation({}, {3}), "Paris");
}

}  // namespace
}  // namespace rotary::tokenizers
