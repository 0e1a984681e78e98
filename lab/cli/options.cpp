// lab/cli/options.cpp: see options.h.
#include "cli/options.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

#include "rotary/error.h"

namespace rotary::cli {
namespace {

std::string range_text(int64_t lo, int64_t hi) { return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]"; }

std::string real_text(double v) {
  if (v == std::numeric_limits<double>::max()) return "max";
  if (v == -std::numeric_limits<double>::max()) return "-max";
  return to_text(v);
}

// from_chars reads decimal only, refuses '+' and spaces, and reports a value that does not fit instead of wrapping.
template <class T>
bool read_decimal(std::string_view text, T& out) {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out, 10);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

int64_t parse_integer(std::string_view text, std::string_view field, int64_t lo, int64_t hi) {
  int64_t v = 0;
  if (!read_decimal(text, v) || v < lo || v > hi)
    fail(field, std::string(text), "a decimal integer in " + range_text(lo, hi));
  return v;
}

uint64_t parse_unsigned(std::string_view text, std::string_view field, uint64_t hi) {
  uint64_t v = 0;
  if (!read_decimal(text, v) || v > hi)
    fail(field, std::string(text), "a decimal integer in [0, " + std::to_string(hi) + "]");
  return v;
}

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        int64_t v = 0;
        if (!read_decimal(s, v) || v < lo || v > hi)
          return "value " + s + " is not a decimal integer in " + range_text(lo, hi);
        s = std::to_string(v);
        return {};
      },
      "in " + range_text(lo, hi));
}

CLI::Validator unsigned_up_to(uint64_t hi) {
  return CLI::Validator(
      [hi](std::string& s) -> std::string {
        uint64_t v = 0;
        if (!read_decimal(s, v) || v > hi)
          return "value " + s + " is not a decimal integer in [0, " + std::to_string(hi) + "]";
        s = std::to_string(v);
        return {};
      },
      "in [0, " + std::to_string(hi) + "]");
}

CLI::Validator finite_in(double lo, double hi) {
  const std::string range = "[" + real_text(lo) + ", " + real_text(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        double v = 0;
        const char* begin = s.c_str();
        char* end = nullptr;
        errno = 0;
        v = std::strtod(begin, &end);
        // strtod also reads "nan", "inf" and hex floats, and 1e999 as inf with ERANGE: only finite values pass.
        if (s.empty() || end != begin + s.size() || !std::isfinite(v) || errno == ERANGE || v < lo || v > hi)
          return "value " + s + " is not a finite number in " + range;
        return {};
      },
      "finite in " + range);
}

CLI::Validator range_of(const settings::Allowed& a) {
  switch (a.kind) {
    case settings::Kind::Integer: return integer_in(a.int_lo, a.int_hi);
    case settings::Kind::Unsigned: return unsigned_up_to(a.uint_hi);
    case settings::Kind::Real: return finite_in(a.lo, a.hi);
    default: return CLI::Validator();
  }
}

std::vector<std::string> parse_name_list(const std::string& text, std::string_view field) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    if (!seen.insert(item).second) fail(field, text, "a comma-separated list naming each item once (" + item + " twice)");
    out.push_back(item);
  }
  check(!out.empty(), field, "\"" + text + "\"", "a non-empty comma-separated list");
  return out;
}

std::vector<int64_t> parse_integer_list(const std::string& text, std::string_view field, int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  std::set<int64_t> seen;
  for (const std::string& item : parse_name_list(text, field)) {
    out.push_back(parse_integer(item, field, lo, hi));
    if (!seen.insert(out.back()).second) fail(field, text, "a comma-separated list naming each value once");
  }
  return out;
}

}  // namespace rotary::cli
