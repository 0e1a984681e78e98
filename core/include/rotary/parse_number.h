// rotary/parse_number.h: the one rule for a decimal number written as text - in a flag, a settings file, a token id
// file, a checkpoint, an environment variable, a search name ("pages64"), a temporary file's pid.
//
// An integer is an optional '-' and decimal digits, nothing else: no '+', no spaces around it (a reader splits its text
// first and hands over one item), no "0x" (hex is refused, never read as 0), no fraction or exponent ("5.0", "1e3").
// Leading zeros are decimal: "010" is ten, never octal eight. A value outside [lo, hi] is refused, and so is one past
// int64 / uint64 (2^63, -2^63-1, a hundred digits): never wrapped, clamped or read as far as it fits. An unsigned
// integer takes no sign at all ("-0" is refused too). A real number is std::from_chars' decimal form (an optional '-',
// digits with an optional '.' and fraction, an optional exponent: "-1.5e-3", ".5"), finite and inside [lo, hi]: no '+',
// no spaces, no hex float, and "nan", "inf" and a value past the double range ("1e999") are refused.
//
// read_* say whether the text follows the rule (std::nullopt if not), for a reader with a message of its own; parse_*
// throw rotary::Error "rotary: <field> = <text> is invalid; allowed: <allowed>", where <text> is as written when it is
// all digits (an id past the vocabulary reads "= 999999") and otherwise quoted_text (error.h): in double quotes ("-1",
// "1e3", " 5"), control bytes escaped ("3\x00" for a 3 and a NUL), at most 100 bytes. <allowed> defaults to "a decimal
// integer in [lo, hi]" / "a finite decimal number in [lo, hi]"; a caller whose range has a meaning of its own says so
// instead ("decimal token ids in [0, 32000) separated by whitespace").
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace rotary {

std::optional<int64_t> read_integer(std::string_view text, int64_t lo = std::numeric_limits<int64_t>::min(),
                                    int64_t hi = std::numeric_limits<int64_t>::max());
std::optional<uint64_t> read_unsigned(std::string_view text, uint64_t hi = std::numeric_limits<uint64_t>::max());
std::optional<double> read_real(std::string_view text, double lo = -std::numeric_limits<double>::max(),
                                double hi = std::numeric_limits<double>::max());

int64_t parse_integer(std::string_view text, std::string_view field, int64_t lo, int64_t hi,
                      std::string_view allowed = {});
uint64_t parse_unsigned(std::string_view text, std::string_view field, uint64_t hi, std::string_view allowed = {});
double parse_real(std::string_view text, std::string_view field, double lo, double hi, std::string_view allowed = {});

// How a parse_* message shows `text`: as written if it is 1 to 100 digits, quoted_text otherwise.
std::string number_text_for_message(std::string_view text);

// A bound of a real range as messages and --help print it: "max" / "-max" for the largest finite double (a range
// without that end), to_text otherwise.
std::string real_bound_text(double v);

}  // namespace rotary
