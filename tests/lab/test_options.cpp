// tests/lab/test_options.cpp: how every command reads numbers and lists (lab/cli/options.h). CLI11 2.1's own
// conversion wraps -1 into an unsigned, clamps past 64 bits, reads 010 as octal and takes nan: these must not.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cli/options.h"
#include "rotary/error.h"

namespace rotary::cli {
namespace {

// Runs `args` through a one-option app; returns "" and sets `out`, or CLI11's / our message.
template <class T>
std::string parse_option(const CLI::Validator& v, std::vector<std::string> args, T& out) {
  CLI::App app;
  app.add_option("--x", out)->transform(v);
  args.insert(args.begin(), "prog");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(Options, IntegersAreDecimalAndInRange) {
  int v = 0;
  EXPECT_EQ(parse_option(integer_in(2, 100), {"--x", "17"}, v), "");
  EXPECT_EQ(v, 17);
  EXPECT_EQ(parse_option(integer_in(2, 100), {"--x", "010"}, v), "");  // decimal ten, not octal eight
  EXPECT_EQ(v, 10);
  for (const char* bad : {"1", "101", "4294967298", "99999999999999999999", "0x10", "1e2", "12abc", "", " 5", "+5"})
    EXPECT_NE(parse_option(integer_in(2, 100), {"--x", bad}, v), "") << bad;
  EXPECT_NE(parse_option(integer_in(2, 100), {"--x", "101"}, v).find("in [2, 100]"), std::string::npos);
  uint64_t u = 0;
  EXPECT_NE(parse_option(unsigned_up_to(UINT64_MAX), {"--x", "-1"}, u), "");
  EXPECT_EQ(parse_option(unsigned_up_to(UINT64_MAX), {"--x", "18446744073709551615"}, u), "");
  EXPECT_EQ(u, UINT64_MAX);
  EXPECT_NE(parse_option(unsigned_up_to(UINT64_MAX), {"--x", "18446744073709551616"}, u), "");
  int64_t big = 0;
  EXPECT_EQ(parse_option(integer_in(INT64_MIN, INT64_MAX), {"--x", "-9223372036854775808"}, big), "");
  EXPECT_EQ(big, INT64_MIN);
}

TEST(Options, RealNumbersAreFiniteAndInRange) {
  double d = 0;
  EXPECT_EQ(parse_option(finite_in(0, 1), {"--x", "0.25"}, d), "");
  EXPECT_EQ(d, 0.25);
  for (const char* bad : {"nan", "inf", "-inf", "1e999", "1.5", "-0.1", "0.5x", ""})
    EXPECT_NE(parse_option(finite_in(0, 1), {"--x", bad}, d), "") << bad;
  EXPECT_EQ(parse_option(finite(), {"--x", "-1e300"}, d), "");
}

TEST(Options, ListsRefuseRepeatsAndBadItems) {
  EXPECT_EQ(parse_name_list("rope,roper", "--encodings"), (std::vector<std::string>{"rope", "roper"}));
  EXPECT_THROW(parse_name_list("rope,roper,rope", "--encodings"), Error);
  EXPECT_THROW(parse_name_list(",", "--encodings"), Error);
  EXPECT_THROW(parse_name_list("", "--encodings"), Error);
  EXPECT_EQ(parse_integer_list("1,2,8", "--lengths", 1, 1024), (std::vector<int64_t>{1, 2, 8}));
  EXPECT_THROW(parse_integer_list("1,4294967298", "--lengths", 1, 1024), Error);
  EXPECT_THROW(parse_integer_list("1,01", "--lengths", 1, 1024), Error);  // the same value twice
  try {
    parse_integer_list("2,x", "--lengths", 1, 1024);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--lengths = \"x\" is invalid"), std::string::npos) << e.what();
  }
}

// An empty item is a typo that would silently run less (issue 48): refused naming the flag and the item, wherever it
// is - a trailing comma too, which std::getline drops.
TEST(Options, ListsRefuseEmptyItems) {
  for (const auto& [text, item] : std::vector<std::pair<std::string, std::string>>{
           {"256,", "item 2 of 2"}, {"256,,512", "item 2 of 3"}, {",256", "item 1 of 2"}, {"4x4,", "item 2 of 2"}}) {
    try {
      parse_name_list(text, "--lengths");
      ADD_FAILURE() << text << ": no error";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("--lengths = " + text + " is invalid"), std::string::npos) << m;
      EXPECT_NE(m.find(item + " is empty"), std::string::npos) << m;
    }
  }
  EXPECT_THROW(parse_integer_list("256,", "--lengths", 1, 1024), Error);
}

// A text option given empty is refused (not read as "not given"); left out, it keeps its default.
TEST(Options, NonEmptyRefusesAnEmptyValueGiven) {
  std::string v = "default";
  CLI::App app;
  app.add_option("--weights", v)->check(non_empty("f32, f16"));
  const char* empty[] = {"prog", "--weights", ""};
  try {
    app.parse(3, empty);
    ADD_FAILURE() << "no error";
  } catch (const CLI::ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("--weights: value \"\" (empty) is invalid; allowed: f32, f16"),
              std::string::npos) << e.what();
  }
  CLI::App app2;
  app2.add_option("--weights", v)->check(non_empty("f32, f16"));
  const char* none[] = {"prog"};
  EXPECT_NO_THROW(app2.parse(1, none));
  EXPECT_EQ(v, "default");
}

// A flag that needs another is refused when given, even at its default value; not given, it passes.
TEST(Options, FlagsGivenOnlyWithTheirFlag) {
  int top_k = 32;
  CLI::App app;
  CLI::Option* flag = app.add_option("--top-k", top_k);
  const char* at_default[] = {"prog", "--top-k", "32"};
  app.parse(3, at_default);
  try {
    check_given_only_with(flag, false, "with --memory");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--top-k = 32 is invalid; allowed: only with --memory"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(check_given_only_with(flag, true, "with --memory"));
  CLI::App app2;
  CLI::Option* unset = app2.add_option("--top-k", top_k);
  const char* none[] = {"prog"};
  app2.parse(1, none);
  EXPECT_NO_THROW(check_given_only_with(unset, false, "with --memory"));
}

}  // namespace
}  // namespace rotary::cli
