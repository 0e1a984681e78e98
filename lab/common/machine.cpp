// lab/common/machine.cpp
#include "common/machine.h"

#include <fstream>

namespace rotary::lab {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace rotary::lab
