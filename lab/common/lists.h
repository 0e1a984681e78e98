// lab/common/lists.h: checks on the lists a user gives an experiment (encodings, methods, lengths, windows).
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "rotary/error.h"

namespace rotary::lab {

// rotary::Error naming `field` and the repeated item: a list that names one item twice would run (or count) it twice.
template <class T>
void check_unique(const std::vector<T>& items, std::string_view field) {
  std::set<T> seen;
  for (const T& item : items)
    if (!seen.insert(item).second) fail(field, to_text(item) + " (given twice)", "each item once");
}

}  // namespace rotary::lab
