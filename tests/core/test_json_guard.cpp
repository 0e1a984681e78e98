// rotary/json_guard.h: the nesting bound every JSON reader applies before parsing, the parse that turns every
// nlohmann exception into a rotary::Error, the excerpt that error messages show of a value, and JsonObject, the
// checked field reader every JSON reader uses (its one rule for integers).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "rotary/error.h"
#include "rotary/json_guard.h"
#include "expect_error.h"

namespace rotary {
namespace {

using nlohmann::json;

std::string error_of(const std::string& text, const std::string& source) {
  try {
    parse_json(text, source);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A value nested `depth` arrays deep, built in place (json::array({v}) would copy the whole value per level).
json nested_arrays(int depth) {
  json root = json::array();
  json* inner = &root;
  for (int i = 1; i < depth; ++i) {
    inner->push_back(json::array());
    inner = &inner->back();
  }
  return root;
}

TEST(json_guard, DepthCountsBracketsOutsideStringsOnly) {
  EXPECT_EQ(json_nesting_depth(""), 0);
  EXPECT_EQ(json_nesting_depth("1"), 0);
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}]})"), 4);
  // Brackets inside strings, escaped quotes and escaped backslashes before a closing quote do not count.
  EXPECT_EQ(json_nesting_depth(R"({"a": "[[[{{{", "b": "\"[[[", "c": "\\", "d": [[]]})"), 3);
  // Unbalanced text is measured as far as it goes; the parser reports what is wrong with it.
  EXPECT_EQ(json_nesting_depth("]]]][["), 2);
}

TEST(json_guard, DeepTextIsRefusedNamingSourceDepthAndMaximum) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string e = error_of(deep, "run.json");
  EXPECT_NE(e.find("run.json nesting depth = 100000"), std::string::npos) << e;
  EXPECT_NE(e.find("at most 64"), std::string::npos) << e;
  EXPECT_EQ(error_of(std::string(64, '[') + std::string(64, ']'), "run.json"), "");
  EXPECT_NE(error_of(std::string(65, '{'), "run.json").find("nesting depth = 65"), std::string::npos);
}

// nlohmann reports a number too large for a double as out_of_range, not parse_error: it must still come out as
// a rotary::Error naming the text.
TEST(json_guard, EveryParserErrorIsARotaryError) {
  const std::string overflow = error_of(R"({"steps": 1e400})", "run.json");
  EXPECT_NE(overflow.find("run.json = malformed JSON"), std::string::npos) << overflow;
  EXPECT_NE(overflow.find("1e400"), std::string::npos) << overflow;
  EXPECT_NE(error_of("{\"a\": 1,}", "run.json").find("run.json = malformed JSON"), std::string::npos);
  EXPECT_EQ(parse_json(R"({"a": [1, 2]})", "run.json"), json::parse(R"({"a": [1, 2]})"));
}

TEST(json_guard, ExcerptIsShortWhateverTheValue) {
  EXPECT_EQ(json_excerpt(json::parse(R"({"a": [1, "x"], "b": null})")), R"({"a":[1,"x"],"b":null})");
  json long_list = json::array();
  for (int i = 0; i < 100000; ++i) long_list.push_back(i);
  const std::string list = json_excerpt(long_list);
  EXPECT_EQ(list.size(), 100u);
  EXPECT_EQ(list.substr(0, 8), "[0,1,2,3");
  EXPECT_EQ(list.substr(97), "...");
  EXPECT_EQ(json_excerpt(json(std::string(1 << 20, 'x')), 10), "\"xxxxxx...");
  // dump() of this value recurses once per level and overflows the stack; the excerpt stops after 100 levels.
  const std::string deep = json_excerpt(nested_arrays(200000));
  EXPECT_EQ(deep, std::string(97, '[') + "...");
  // Strings that are not UTF-8 (nlohmann's dump throws on them) show with a replacement character.
  EXPECT_EQ(json_excerpt(json(std::string("a\xff"))), "\"a\xef\xbf\xbd\"");
}

// The one rule for integers (config.json, the HF model spec and tokenizer.json all read through it): JSON
// integers, and numbers written with a fraction whose value is integral, in range; nothing else.
TEST(json_guard, OneRuleForIntegers) {
  EXPECT_EQ(json_integer(json(4096)), 4096);
  EXPECT_EQ(json_integer(json(-3)), -3);
  EXPECT_EQ(json_integer(json::parse("4096.0")), 4096);   // Python's json.dumps(float(4096))
  EXPECT_EQ(json_integer(json::parse("-0.0")), 0);
  EXPECT_EQ(json_integer(json::parse("1e3")), 1000);
  EXPECT_EQ(json_integer(json::parse("9223372036854775807")), INT64_MAX);
  EXPECT_FALSE(json_integer(json::parse("9223372036854775808")));   // unsigned past 2^63 - 1
  EXPECT_FALSE(json_integer(json::parse("18446744073709551615")));  // would wrap to -1 as int64
  EXPECT_FALSE(json_integer(json::parse("4.5")));
  EXPECT_FALSE(json_integer(json::parse("1e300")));                 // integral, but no int64
  EXPECT_FALSE(json_integer(json::parse("9007199254740993.0")));    // past 2^53: not exact in the double
  EXPECT_FALSE(json_integer(json("4")));
  EXPECT_FALSE(json_integer(json(true)));
  EXPECT_FALSE(json_integer(json(nullptr)));
  EXPECT_EQ(json_integer(json(5), 1, 5), 5);
  EXPECT_FALSE(json_integer(json(6), 1, 5));
  EXPECT_FALSE(json_integer(json::parse("0.0"), 1, 5));
  EXPECT_EQ(json_integer_allowed(1, 5), "an integer in [1, 5]");
  EXPECT_EQ(json_integer_allowed(), "an integer");
}

TEST(json_guard, JsonObjectNamesTheFieldTheValueAndWhatIsAllowed) {
  const json j = json::parse(R"({"n": 7, "x": 0.5, "s": "a", "b": true, "l": [1, 2.5], "z": null, "o": {"k": 1},
                                 "f": 8.0, "bad_l": [1, "2"]})");
  const JsonObject o(&j, "config.json: ");
  EXPECT_EQ(o.integer("n"), 7);
  EXPECT_EQ(o.integer("f"), 8);
  EXPECT_EQ(o.number("x"), 0.5);
  EXPECT_EQ(o.text("s"), "a");
  EXPECT_EQ(o.boolean("b"), true);
  EXPECT_EQ(o.number_list("l"), (std::vector<double>{1, 2.5}));
  // Absent and null are both "not given".
  EXPECT_FALSE(o.integer("missing"));
  EXPECT_FALSE(o.integer("z"));
  EXPECT_FALSE(JsonObject(nullptr, "rope_scaling.").number("factor"));
  EXPECT_EQ(o.object("o").integer("k"), 1);
  EXPECT_EQ(o.object("o").path("k"), "config.json: o.k");
  EXPECT_FALSE(o.object("absent").integer("k"));

  test::expect_error([&] { o.integer("x"); }, {"config.json: x = 0.5", "allowed: an integer"});
  test::expect_error([&] { o.integer("n", 1, 5); }, {"config.json: n = 7", "an integer in [1, 5]"});
  test::expect_error([&] { o.number("s"); }, {"config.json: s = \"a\"", "a number"});
  test::expect_error([&] { o.text("n"); }, {"config.json: n = 7", "a string"});
  test::expect_error([&] { o.boolean("n"); }, {"config.json: n = 7", "true or false"});
  test::expect_error([&] { o.number_list("bad_l"); }, {"config.json: bad_l[1] = \"2\"", "a number"});
  test::expect_error([&] { o.number_list("n"); }, {"config.json: n = 7", "a list of numbers"});
  test::expect_error([&] { o.object("n"); }, {"config.json: n = 7", "a JSON object"});
  test::expect_error([&] { o.required_integer("missing", 0, 9); }, {"config.json: missing = (missing)",
                                                                     "an integer in [0, 9]"});
  test::expect_error([&] { o.required_text("z"); }, {"config.json: z = (missing)", "a string"});
  test::expect_error([&] { JsonObject::of(json::array(), "tokenizer.json: model"); },
                     {"tokenizer.json: model = []", "a JSON object"});
}

}  // namespace
}  // namespace rotary
