// lab/cli/options.cpp: see options.h.
#include "cli/options.h"

#include <set>

#include "rotary/error.h"

namespace rotary::cli {
namespace {

std::string range_text(int64_t lo, int64_t hi) { return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]"; }

}  // namespace

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        const std::optional<int64_t> v = read_integer(s, lo, hi);
        if (!v) return "value " + escaped_text(s) + " is not a decimal integer in " + range_text(lo, hi);
        s = std::to_string(*v);
        return {};
      },
      "in " + range_text(lo, hi));
}

CLI::Validator unsigned_up_to(uint64_t hi) {
  return CLI::Validator(
      [hi](std::string& s) -> std::string {
        const std::optional<uint64_t> v = read_unsigned(s, hi);
        if (!v) return "value " + escaped_text(s) + " is not a decimal integer in [0, " + std::to_string(hi) + "]";
        s = std::to_string(*v);
        return {};
      },
      "in [0, " + std::to_string(hi) + "]");
}

CLI::Validator finite_in(double lo, double hi) {
  const std::string range = "[" + real_bound_text(lo) + ", " + real_bound_text(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        if (!read_real(s, lo, hi)) return "value " + escaped_text(s) + " is not a finite number in " + range;
        return {};
      },
      "finite in " + range);
}

CLI::Validator non_empty(const std::string& allowed) {
  return CLI::Validator(
      [allowed](std::string& s) -> std::string {
        return s.empty() ? "value \"\" (empty) is invalid; allowed: " + allowed : std::string();
      },
      "");
}

void check_given_only_with(const CLI::Option* flag, bool condition, const std::string& needs) {
  if (flag->count() && !condition) fail(flag->get_name(), flag->as<std::string>(), "only " + needs);
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
  check(!text.empty(), field, "\"\"", "a non-empty comma-separated list");
  std::vector<std::string> items;
  for (size_t begin = 0;;) {  // (std::getline would drop a trailing empty item: "256," must be refused too)
    const size_t comma = text.find(',', begin);
    items.push_back(text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < items.size(); ++i) {
    // An empty item is a typo ("256,,512", a trailing comma): dropping it would run less than was asked.
    if (items[i].empty())
      fail(field, text, "a comma-separated list without empty items (item " + std::to_string(i + 1) + " of " +
                            std::to_string(items.size()) + " is empty)");
    if (!seen.insert(items[i]).second)
      fail(field, text, "a comma-separated list naming each item once (" + items[i] + " twice)");
  }
  return items;
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
