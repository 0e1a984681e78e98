// tests/core/test_parse_number.cpp: the one rule for decimal numbers in text (rotary/parse_number.h) and the escaping
// of a user's text in messages (rotary/error.h: escaped_text, quoted_text, rotary::Error).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "expect_error.h"
#include "rotary/error.h"
#include "rotary/parse_number.h"
#include "rotary/settings.h"

namespace rotary {
namespace {

using test::expect_error;
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(ParseNumber, IntegersAreDecimalDigitsWithAnOptionalMinus) {
  EXPECT_EQ(read_integer("0"), 0);
  EXPECT_EQ(read_integer("42"), 42);
  EXPECT_EQ(read_integer("-7"), -7);
  EXPECT_EQ(read_integer("-0"), 0);
  EXPECT_EQ(read_integer("010"), 10);  // leading zeros are decimal, never octal
  EXPECT_EQ(read_integer("9223372036854775807"), kMax);
  EXPECT_EQ(read_integer("-9223372036854775808"), kMin);
}

TEST(ParseNumber, IntegersRefuseSignsSpacesPrefixesFractionsAndJunk) {
  for (const std::string bad : {"",    "+5", "+0",    " 5",  "5 ", "\t5", "5\n", "0x10", "0X10",  "0b1", "1e3",
                                "5.0", "5.", "12abc", "abc", "-",  "--5", "- 5", "5-",   "1,000", "١٢"})
    EXPECT_EQ(read_integer(bad), std::nullopt) << '"' << bad << '"';
  EXPECT_EQ(read_integer(std::string("5\0", 2)),
            std::nullopt);  // a NUL is junk, not the end of the text
}

TEST(ParseNumber, IntegersOutsideTheRangeOrPastInt64AreRefusedNeverWrapped) {
  EXPECT_EQ(read_integer("9223372036854775808"), std::nullopt);   // 2^63
  EXPECT_EQ(read_integer("-9223372036854775809"), std::nullopt);  // -2^63 - 1
  EXPECT_EQ(read_integer("18446744073709551617"),
            std::nullopt);  // 2^64 + 1 (would wrap to 1)
  EXPECT_EQ(read_integer(std::string(100, '9')), std::nullopt);
  EXPECT_EQ(read_integer("10", 0, 10), 10);
  EXPECT_EQ(read_integer("11", 0, 10), std::nullopt);
  EXPECT_EQ(read_integer("-1", 0, 10), std::nullopt);
  EXPECT_EQ(read_integer("0", 1, 10), std::nullopt);
}

TEST(ParseNumber, UnsignedTakesNoSignAndAllOf64Bits) {
  EXPECT_EQ(read_unsigned("18446744073709551615"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(read_unsigned("18446744073709551616"), std::nullopt);  // 2^64
  EXPECT_EQ(read_unsigned("-1"), std::nullopt);                    // (never 2^64 - 1)
  EXPECT_EQ(read_unsigned("-0"), std::nullopt);
  EXPECT_EQ(read_unsigned("+1"), std::nullopt);
  EXPECT_EQ(read_unsigned("7", 6), std::nullopt);
  EXPECT_EQ(read_unsigned("6", 6), 6u);
}

TEST(ParseNumber, RealsAreFiniteDecimalNumbersInRange) {
  EXPECT_EQ(read_real("1.5"), 1.5);
  EXPECT_EQ(read_real("-1e-3"), -1e-3);
  EXPECT_EQ(read_real(".5"), 0.5);
  EXPECT_EQ(read_real("5."), 5.0);
  EXPECT_EQ(read_real("1E3"), 1000.0);
  EXPECT_EQ(read_real("010"), 10.0);
  for (const std::string bad : {"", "nan", "NaN", "inf", "-inf", "infinity", "1e999", "-1e999", "+1", " 1", "1 ",
                                "0x1p3", "1.5x", ",", "1,5", "e3"})
    EXPECT_EQ(read_real(bad), std::nullopt) << '"' << bad << '"';
  EXPECT_EQ(read_real("1.5", 0, 1), std::nullopt);
  EXPECT_EQ(read_real("-0.1", 0, 1), std::nullopt);
  EXPECT_EQ(read_real("1", 0, 1), 1.0);
}

// The message names the field, shows the text (as written when it is all digits, quoted otherwise) and the range.
TEST(ParseNumber, ErrorsNameTheFieldTheTextAndTheRange) {
  expect_error([] { parse_integer("12abc", "ids.txt: token 3", 0, 9); },
               {"rotary: ids.txt: token 3 = \"12abc\" is invalid; allowed: a "
                "decimal integer in [0, 9]"});
  expect_error([] { parse_integer("99999999999999999999", "--lengths", 1, 1024); },
               {"--lengths = 99999999999999999999 is invalid; allowed: a decimal "
                "integer in [1, 1024]"});
  expect_error([] { parse_integer("", "RANK", 0, 7); }, {"RANK = \"\" is invalid"});
  expect_error([] { parse_integer("-1", "id", 0, 7); }, {"id = \"-1\" is invalid"});
  expect_error([] { parse_integer("7", "id", 0, 6, "decimal ids in [0, 7) separated by whitespace"); },
               {"id = 7 is invalid; allowed: decimal ids in [0, 7) separated by "
                "whitespace"});
  expect_error([] { parse_unsigned("-1", "seed", 100); },
               {"seed = \"-1\" is invalid; allowed: a decimal integer in [0, 100]"});
  expect_error([] { parse_real("nan", "lr", 0, 1); },
               {"lr = \"nan\" is invalid; allowed: a finite decimal number in [0, 1]"});
  expect_error(
      [] { parse_real("1e999", "x", -std::numeric_limits<double>::max(), std::numeric_limits<double>::max()); },
      {"x = \"1e999\" is invalid; allowed: a finite decimal number in [-max, "
       "max]"});
  EXPECT_EQ(parse_integer("-5", "x", -10, 10), -5);
  EXPECT_EQ(parse_unsigned("5", "x", 10), 5u);
  EXPECT_EQ(parse_real("0.25", "x", 0, 1), 0.25);
}

// A NUL in the text (issue 48, fault 6): the message shows every byte of it, the NUL escaped, and goes on after it.
TEST(ParseNumber, AMessageShowsTheWholeTextWithControlBytesEscaped) {
  try {
    parse_integer(std::string("3\0x9", 4), "ids.txt: token 2 (line 1)", 0, 9);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "rotary: ids.txt: token 2 (line 1) = \"3\\x00x9\" is invalid; "
              "allowed: a decimal integer in [0, 9]");
  }
  expect_error([] { parse_integer("\x1b[31m5", "x", 0, 9); }, {"x = \"\\x1b[31m5\" is invalid"});
  // A text of any length shows its first 100 bytes and its length.
  try {
    parse_integer(std::string(5000, 'z'), "x", 0, 9);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("x = \"" + std::string(100, 'z') + "...\" (5000 bytes) is invalid"), std::string::npos) << m;
  }
}

TEST(ParseNumber, EscapedAndQuotedText) {
  EXPECT_EQ(escaped_text(std::string("a\0b\x7f\n", 5)), "a\\x00b\\x7f\\x0a");
  EXPECT_EQ(escaped_text("a\tb\nc", "\n\t"), "a\tb\nc");
  EXPECT_EQ(escaped_text("Grüße \\ \""),
            "Grüße \\ \"");  // printable bytes, UTF-8 included, as they are
  EXPECT_EQ(quoted_text(""), "\"\"");
  EXPECT_EQ(quoted_text("abcdef", 3), "\"abc...\" (6 bytes)");
}

// rotary::Error escapes a NUL itself: what() is a C string, and a message holding one would be printed cut at it.
TEST(ParseNumber, AnErrorMessageIsNeverCutAtANul) {
  using namespace std::string_literals;
  const Error e("rotary: x = 1\0 2 is invalid\nsecond line\t(tab)"s);
  EXPECT_EQ(std::string(e.what()), "rotary: x = 1\\x00 2 is invalid\nsecond line\t(tab)");
}

// The callers in the core: a settings file's unsigned written as a decimal string (a seed past 2^63).
TEST(ParseNumber, SettingsReadAnUnsignedStringByTheRule) {
  const settings::Allowed seed = settings::unsigned_up_to(std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(settings::checked_value(seed, nlohmann::json("18446744073709551615"), "seed").get<uint64_t>(),
            std::numeric_limits<uint64_t>::max());
  for (const std::string bad : {"18446744073709551616", "-1", "+1", " 1", "0x10", "1e3", ""})
    expect_error([&] { settings::checked_value(seed, nlohmann::json(bad), "seed"); }, {"seed = "});
}

}  // namespace
}  // namespace rotary
