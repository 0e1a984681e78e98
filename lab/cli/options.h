// lab/cli/options.h: how numbers and lists are read from the command line, the same way for every command.
//
// CLI11 2.1's own conversion reads "-1" into an unsigned as 2^64-1, clamps 99999999999999999999 to INT64_MAX,
// reads "010" as octal 8 and takes "nan" and "1e999" (inf) as numbers. Every numeric option therefore carries one of
// these validators, which read by rotary/parse_number.h's one rule for numbers in text: an integer is decimal and
// inside its range (never wrapped or clamped), a real number is decimal, finite and inside its range (no '+', no
// spaces, no hex), and the range is printed by --help. tests/cli/test_hostile_input.sh checks that every
// numeric option of every command has one.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "common/limits.h"
#include "rotary/parse_number.h"
#include "rotary/settings.h"

namespace rotary::cli {

// A decimal integer (optional '-', digits) that fits [lo, hi]; rotary::Error naming `field`, the text and the range.
// The one rule of rotary/parse_number.h, which the validators below follow too.
using rotary::parse_integer;
using rotary::parse_unsigned;

// Validators for add_option(...)->transform(...): they rewrite the accepted text to plain decimal, so CLI11's own
// conversion then reads exactly the value checked. (Not ->check(): CLI11 runs a check on a copy, and would then
// read "010" as octal itself.)
CLI::Validator integer_in(int64_t lo, int64_t hi);
CLI::Validator unsigned_up_to(uint64_t hi);
CLI::Validator finite_in(double lo, double hi);  // rejects nan and inf
inline CLI::Validator finite() {
  return finite_in(-std::numeric_limits<double>::max(), std::numeric_limits<double>::max());
}

// For add_option(...)->check(...) of a text option whose empty value would read as "not given" (--weights "",
// --save-context ""): an explicitly given empty value is a typo, refused naming the flag and `allowed`.
CLI::Validator non_empty(const std::string& allowed);

// A flag that means something only with another (--top-k with --memory): given without it - counted by CLI11, so
// also when given at its default value - it is refused, never silently ignored. rotary::Error
// "<flag> = <value> is invalid; allowed: only <needs>", e.g. needs = "with --memory".
void check_given_only_with(const CLI::Option* flag, bool condition, const std::string& needs);

// The validator of a declared setting's range (rotary/settings.h): integer_in, unsigned_up_to or finite_in (an open
// end such as lr > 0 is then refused when the value is applied). Non-numeric kinds: no validator.
CLI::Validator range_of(const settings::Allowed& allowed);

// "a,b,c" -> items; rotary::Error naming `field` if the list is empty, an item is empty ("a,,b", "a,": a typo that
// would silently run less) or one repeats (a list of settings that names one twice would run or count it twice).
std::vector<std::string> parse_name_list(const std::string& text, std::string_view field);
std::vector<int64_t> parse_integer_list(const std::string& text, std::string_view field, int64_t lo, int64_t hi);

// Limits shared with the run config and the experiments (common/limits.h).
using lab::kMaxSequenceLength;
using lab::kMaxThreads;

}  // namespace rotary::cli
