// rotary/json_guard.h: the nesting bound every JSON reader applies before parsing, the parse that turns every
// nlohmann exception into a rotary::Error, and the excerpt that error messages show of a value.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "rotary/error.h"
#include "rotary/json_guard.h"

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

}  // namespace
}  // namespace rotary
