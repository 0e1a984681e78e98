// lab/cli/command_line.h: this process's own command line, as reports quote it and data-parallel workers re-run it.
#pragma once

#include <fstream>
#include <string>
#include <vector>

namespace rotary::cli {

// The command line of this process, for reports and for re-executing it as data-parallel workers.
inline std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

inline std::string quoted_command_line() {
  std::string s;
  for (const std::string& a : own_command_line()) {
    const bool plain = !a.empty() && a.find_first_of(" \t\"'$\\`*?;&|<>()") == std::string::npos;
    s += (s.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  return s;
}

}  // namespace rotary::cli
