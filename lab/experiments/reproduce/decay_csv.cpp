// lab/experiments/reproduce/decay_csv.cpp
#include "experiments/reproduce/decay_csv.h"

#include <sstream>
#include <vector>

#include "common/files.h"

namespace rotary::experiments::reproduce {

std::map<int64_t, double> read_measured_decay(const std::string& csv_path) {
  std::map<int64_t, double> out;
  std::istringstream in(lab::read_file(csv_path));
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream row(line);
    std::string cell;
    std::vector<std::string> cells;
    while (std::getline(row, cell, ',')) cells.push_back(cell);
    if (cells.size() < 5) continue;
    try {
      out[std::stoll(cells[0])] = std::stod(cells[4]);
    } catch (const std::exception&) {
    }
  }
  return out;
}

}  // namespace rotary::experiments::reproduce
