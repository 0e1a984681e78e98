// rotary/settings.h: settings declared once - reading one value against its allowed values, unknown fields,
// paths, nesting, the range check of a config built in code, and the TOML file.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "expect.h"
#include "rotary/error.h"
#include "rotary/settings.h"

namespace rotary::settings {
namespace {

using nlohmann::json;
using test::expect_error;

struct Inner {
  double rate = 0.5;
  std::optional<double> scale;
};
enum class Color { Red, Green };
struct Outer {
  int count = 3;
  uint64_t seed = 0;
  bool on = true;
  std::string name = "x";
  Color color = Color::Red;
  std::vector<double> weights;
  Inner inner;
};

const Table<Outer>& outer_settings() {
  static const Table<Outer> t = [] {
    Table<Inner> inner;
    inner.push_back(field<Inner>("rate", "--rate", "a rate", [](auto& i) -> auto& { return i.rate; }, reals(0, 1, true)));
    inner.push_back(field<Inner>("scale", "", "a scale", [](auto& i) -> auto& { return i.scale; }, optional_real()));
    Table<Outer> o;
    o.push_back(field<Outer>("count", "--count", "how many", [](auto& c) -> auto& { return c.count; },
                             integers(1, 10, "1 = one")));
    o.push_back(field<Outer>("seed", "--seed", "seed", [](auto& c) -> auto& { return c.seed; }, unsigned_up_to(UINT64_MAX)));
    o.push_back(field<Outer>("on", "--on", "on", [](auto& c) -> auto& { return c.on; }, boolean()));
    o.push_back(field<Outer>("name", "--name", "name", [](auto& c) -> auto& { return c.name; }, text(true)));
    o.push_back(choice<Outer>(
        "color", "--color", "color", [](auto& c) -> auto& { return c.color; },
        names([] { return std::vector<std::string>{"red", "green"}; }),
        [](Color c) { return c == Color::Red ? "red" : "green"; },
        [](const std::string& n) {
          if (n == "red" || n == "rouge") return Color::Red;
          if (n == "green") return Color::Green;
          throw Error("no such color");
        }));
    o.push_back(field<Outer>("weights", "", "weights", [](auto& c) -> auto& { return c.weights; }, real_list()));
    nest(o, "inner", inner, [](auto& c) -> auto& { return c.inner; });
    return o;
  }();
  return t;
}

TEST(settings, AllowedTextsSayWhatIsAllowed) {
  EXPECT_EQ(integers(1, 10, "1 = one").text(), "an integer in [1, 10] (1 = one)");
  EXPECT_EQ(reals(0, 1, true, false).text(), "a number in (0, 1]");
  EXPECT_EQ(real_above(0).text(), "a number > 0");
  EXPECT_EQ(any_real().text(), "a finite number");
  EXPECT_EQ(unsigned_up_to(7).text(), "an integer in [0, 7]");
  EXPECT_EQ(names([] { return std::vector<std::string>{"a", "b"}; }).text(), "one of a, b");
}

TEST(settings, ValuesAreCheckedAgainstTheirTypeAndRange) {
  const Allowed count = integers(1, 10);
  EXPECT_EQ(checked_value(count, json(4), "count"), json(4));
  EXPECT_EQ(checked_value(count, json(4.0), "count"), json(4));  // TOML's 4.0
  expect_error([&] { checked_value(count, json(4.5), "count"); }, "count = 4.5 is invalid; allowed: an integer in [1, 10]");
  expect_error([&] { checked_value(count, json(11), "count"); }, "count = 11");
  expect_error([&] { checked_value(count, json("4"), "count"); }, "count = \"4\"");
  // 2^63 as a double is beyond every int64 (INT64_MAX rounds up to it): refused, never cast.
  EXPECT_THROW([&] { checked_value(integers(0, INT64_MAX), json(9223372036854775808.0), "n"); }(), Error);
  EXPECT_EQ(checked_value(unsigned_up_to(UINT64_MAX), json(UINT64_MAX), "s"), json(UINT64_MAX));
  EXPECT_THROW([&] { checked_value(unsigned_up_to(UINT64_MAX), json(-1), "s"); }(), Error);
  EXPECT_THROW([&] { checked_value(real_above(0), json(0.0), "lr"); }(), Error);
  EXPECT_THROW([&] { checked_value(any_real(), json(std::nan("")), "x"); }(), Error);
  EXPECT_THROW([&] { checked_value(text(true), json(""), "out"); }(), Error);
  EXPECT_THROW([&] { checked_value(real_list(), json{1.0, "2"}, "w"); }(), Error);
  EXPECT_THROW([&] { checked_value(any_real(), json(), "x"); }(), Error);  // null only where optional
  EXPECT_EQ(checked_value(optional_real(), json(), "x"), json());
}

TEST(settings, JsonRoundTripKeepsAbsentFieldsAndNests) {
  Outer o;
  o.count = 7, o.seed = UINT64_MAX, o.on = false, o.name = "y", o.color = Color::Green, o.weights = {1, 2};
  o.inner.scale = 2.5;
  const json j = to_json(outer_settings(), o);
  EXPECT_EQ(j.at("inner").at("scale"), 2.5);
  EXPECT_EQ(j.at("color"), "green");
  Outer back;
  from_json(outer_settings(), j, back);
  EXPECT_EQ(to_json(outer_settings(), back), j);
  EXPECT_FALSE(to_json(outer_settings(), Outer{}).at("inner").contains("scale"));  // unset optional: absent
  Outer partial;
  from_json(outer_settings(), json{{"inner", {{"rate", 0.25}}}, {"color", "rouge"}}, partial);  // an alias
  EXPECT_EQ(partial.inner.rate, 0.25);
  EXPECT_EQ(partial.color, Color::Red);
  EXPECT_EQ(partial.count, 3);  // absent: kept
}

TEST(settings, UnknownFieldsAndBadNamesAreNamedWithTheirPrefix) {
  Outer o;
  expect_error([&] { from_json(outer_settings(), json{{"inner", {{"rat", 1}}}}, o, "cfg"); }, "config field = cfg.inner.rat is invalid; allowed: one of rate, scale");
  expect_error([&] { from_json(outer_settings(), json{{"cont", 1}}, o); }, "config field = cont");
  expect_error([&] { from_json(outer_settings(), json{{"inner", 3}}, o); }, "inner = 3 is invalid; allowed: a table of fields");
  expect_error([&] { from_json(outer_settings(), json{{"color", "blue"}}, o); }, "color = blue is invalid; allowed: one of red, green");
  expect_error([&] { from_json(outer_settings(), json{{"inner", {{"rate", 0}}}}, o, "cfg"); }, "cfg.inner.rate = 0 is invalid; allowed: a number in (0, 1]");
}

TEST(settings, CheckFindsAValueSetInCodeOutsideItsRange) {
  Outer o;
  EXPECT_NO_THROW(check(outer_settings(), o));
  o.inner.rate = 2;
  expect_error([&] { check(outer_settings(), o); }, "inner.rate = 2.0");
  o = Outer{};
  o.name = "";
  expect_error([&] { check(outer_settings(), o); }, "name");
}

TEST(settings, PathsAreSetAndFound) {
  json j = json::object();
  set_path(j, "a.b.c", 1);
  set_path(j, "a.d", 2);
  EXPECT_EQ(j, json::parse(R"({"a": {"b": {"c": 1}, "d": 2}})"));
  ASSERT_NE(find_path(j, "a.b.c"), nullptr);
  EXPECT_EQ(*find_path(j, "a.b.c"), 1);
  EXPECT_EQ(find_path(j, "a.x"), nullptr);
  EXPECT_EQ(find_path(j, "a.d.e"), nullptr);  // through a number
}

TEST(settings, TomlPutsTablesAfterTheRootKeysAndCommentsEachSetting) {
  Outer o;
  o.weights = {1.0, 2.5};
  const std::string toml = to_toml(outer_settings(), o, "header\nsecond line");
  EXPECT_EQ(toml.rfind("# header\n# second line\n", 0), 0u) << toml;
  EXPECT_NE(toml.find("# how many [--count]; an integer in [1, 10] (1 = one)\ncount = 3\n"), std::string::npos) << toml;
  EXPECT_NE(toml.find("weights = [1.0, 2.5]\n"), std::string::npos) << toml;
  EXPECT_NE(toml.find("\n[inner]\n"), std::string::npos) << toml;
  EXPECT_LT(toml.find("weights ="), toml.find("[inner]"));  // root keys before any table
  EXPECT_NE(toml.find("rate = 0.5\n"), std::string::npos) << toml;
  EXPECT_NE(toml.find("# scale = (unset)\n"), std::string::npos) << toml;
}

}  // namespace
}  // namespace rotary::settings
