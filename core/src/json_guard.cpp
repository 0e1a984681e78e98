// The nesting check in front of every JSON reader (see rotary/json_guard.h).
#include "rotary/json_guard.h"

#include <algorithm>

namespace rotary {

int json_nesting_depth(std::string_view json_text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < json_text.size(); ++i) {
    const char c = json_text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character (a '"' or '\\' among them) cannot end the string
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;  // an unmatched closer is the parser's to report
    }
  }
  return deepest;
}

void check_json_depth(std::string_view json_text, std::string_view source, int max_depth) {
  const int depth = json_nesting_depth(json_text);
  if (depth > max_depth)
    fail(std::string(source) + " nesting depth", std::to_string(depth),
         "at most " + std::to_string(max_depth) + " levels of arrays and objects inside each other");
}

}  // namespace rotary
