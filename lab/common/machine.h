// lab/common/machine.h: what the benchmarks record about the machine they ran on.
#pragma once

#include <string>

namespace rotary::lab {

// The "model name" of /proc/cpuinfo's first processor; "unknown" without one.
std::string cpu_model();

}  // namespace rotary::lab
