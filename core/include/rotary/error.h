// rotary/error.h: the one exception type of the library.
//
// Every rejection of bad input names the field, the value it had and what is allowed, so a user can fix
// the call without reading our code: "rotary: rotary_dim = 7 is invalid; allowed: an even number in [2, 128]".
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace rotary {

// `text` with each control byte (below 0x20, and 0x7f) that `keep` does not list written as \xNN: a message quoting
// a user's text shows all of it - a NUL would end what() there, a terminal escape would act on the terminal.
inline std::string escaped_text(std::string_view text, std::string_view keep = {}) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if ((byte >= 0x20 && byte != 0x7f) || keep.find(ch) != std::string_view::npos) {
      out.push_back(ch);
    } else {
      out.append("\\x").push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 15]);
    }
  }
  return out;
}

// A user's text as a message quotes it: escaped_text in double quotes, at most `limit` bytes of it (as json_excerpt
// stops after a hundred characters), then "..." and the whole length. 12<NUL>ab shows as "12\x00ab" (the quotes
// included), 5000 x's as "xxx..." (5000 bytes).
inline std::string quoted_text(std::string_view text, size_t limit = 100) {
  std::string out(1, '"');
  out.append(escaped_text(text.substr(0, limit)));
  if (text.size() <= limit) return out.append(1, '"');
  return out.append("...\" (").append(std::to_string(text.size())).append(" bytes)");
}

class Error : public std::invalid_argument {
 public:
  // Control bytes but line breaks and tabs escaped (escaped_text): what() is a C string, and a message holding a
  // NUL - a user's text quoted without escaping - would be printed cut at it.
  explicit Error(const std::string& what) : std::invalid_argument(escaped_text(what, "\n\t")) {}
};

// Formats any streamable value for an error message.
template <class T>
std::string to_text(const T& value) {
  std::ostringstream os;
  os.precision(17);
  os << value;
  return os.str();
}

// Throws rotary::Error("rotary: <field> = <value> is invalid; allowed: <allowed>").
[[noreturn]] inline void fail(std::string_view field, const std::string& value, std::string_view allowed) {
  std::string msg = "rotary: ";
  msg.append(field).append(" = ").append(value).append(" is invalid; allowed: ").append(allowed);
  throw Error(msg);
}

template <class T>
inline void check(bool ok, std::string_view field, const T& value, std::string_view allowed) {
  if (!ok) fail(field, to_text(value), allowed);
}

// a * b for counts and sizes that come from a user (lengths x windows, rows x width): rotary::Error naming
// `field` with both factors and `allowed` when the product does not fit in int64, so an overflowed product never
// passes a bound check and then sizes a copy or an allocation.
inline int64_t checked_mul(int64_t a, int64_t b, std::string_view field, std::string_view allowed) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) fail(field, to_text(a) + " x " + to_text(b) + " (past 2^63)", allowed);
  return product;
}
// The same for a sum (the file readers' offsets: offset + length).
inline int64_t checked_add(int64_t a, int64_t b, std::string_view field, std::string_view allowed) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) fail(field, to_text(a) + " + " + to_text(b) + " (past 2^63)", allowed);
  return sum;
}

}  // namespace rotary
