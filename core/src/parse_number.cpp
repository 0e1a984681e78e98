// core/src/parse_number.cpp: see rotary/parse_number.h.
#include "rotary/parse_number.h"

#include <charconv>
#include <cmath>
#include <system_error>

#include "rotary/error.h"

namespace rotary {
namespace {

// std::from_chars is the rule's reader: decimal only (base 10, general format), no leading '+' or whitespace, and a
// value past the type's range reported (errc::result_out_of_range) instead of wrapped or clamped. The whole text must
// be read: a number followed by anything ("12abc", "5.0" for an integer) is junk.
template <class T>
std::optional<T> read_whole(std::string_view text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || stop != end) return std::nullopt;
  return value;
}

}  // namespace

std::string real_bound_text(double v) {
  if (v == std::numeric_limits<double>::max()) return "max";
  if (v == -std::numeric_limits<double>::max()) return "-max";
  return to_text(v);
}

std::optional<int64_t> read_integer(std::string_view text, int64_t lo, int64_t hi) {
  const std::optional<int64_t> v = read_whole<int64_t>(text);
  return v && *v >= lo && *v <= hi ? v : std::nullopt;
}

std::optional<uint64_t> read_unsigned(std::string_view text, uint64_t hi) {
  const std::optional<uint64_t> v = read_whole<uint64_t>(text);  // (from_chars takes no '-' for an unsigned)
  return v && *v <= hi ? v : std::nullopt;
}

std::optional<double> read_real(std::string_view text, double lo, double hi) {
  // Decimal only: from_chars' general format reads "nan" and "inf" (refused below as not finite), never hex.
  const std::optional<double> v = read_whole<double>(text);
  return v && std::isfinite(*v) && *v >= lo && *v <= hi ? v : std::nullopt;
}

std::string number_text_for_message(std::string_view text) {
  // Quotes would only clutter "= 999999" (a number out of range); they show where anything else begins and ends.
  const bool plain =
      !text.empty() && text.size() <= 100 && text.find_first_not_of("0123456789") == std::string_view::npos;
  return plain ? std::string(text) : quoted_text(text);
}

int64_t parse_integer(std::string_view text, std::string_view field, int64_t lo, int64_t hi, std::string_view allowed) {
  const std::optional<int64_t> v = read_integer(text, lo, hi);
  if (!v)
    fail(field, number_text_for_message(text),
         allowed.empty() ? "a decimal integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"
                         : std::string(allowed));
  return *v;
}

uint64_t parse_unsigned(std::string_view text, std::string_view field, uint64_t hi, std::string_view allowed) {
  const std::optional<uint64_t> v = read_unsigned(text, hi);
  if (!v)
    fail(field, number_text_for_message(text),
         allowed.empty() ? "a decimal integer in [0, " + std::to_string(hi) + "]" : std::string(allowed));
  return *v;
}

double parse_real(std::string_view text, std::string_view field, double lo, double hi, std::string_view allowed) {
  const std::optional<double> v = read_real(text, lo, hi);
  if (!v)
    fail(field, number_text_for_message(text),
         allowed.empty() ? "a finite decimal number in [" + real_bound_text(lo) + ", " + real_bound_text(hi) + "]"
                         : std::string(allowed));
  return *v;
}

}  // namespace rotary
