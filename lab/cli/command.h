// lab/cli/command.h: how a `rotary` subcommand plugs into the command line.
//
// Each command file defines a static CommandRegistrar; main() calls every registered function with the root
// CLI::App, so adding a command touches only its own file. Commands report bad input by throwing
// rotary::Error; main() prints the message and exits with status 2 (common/exit_status.h). Numeric options carry
// a validator from options.h.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/options.h"

namespace rotary::cli {

using RegisterFn = std::function<void(CLI::App& root)>;

struct CommandRegistrar {
  explicit CommandRegistrar(RegisterFn fn);
};

// The registered functions, in registration order.
std::vector<RegisterFn>& command_registry();

// Returns the subcommand `name` of `parent`, creating it (with `description`) on first use; lets several files
// add children to a group such as `rotary bench`.
CLI::App& subcommand_group(CLI::App& parent, const std::string& name, const std::string& description);

// Writes every byte of `text` to stdout. Text a user or a model produced (a prompt file, a continuation) may hold
// NUL bytes, where printf("%s") would stop.
inline void write_stdout(std::string_view text) { std::fwrite(text.data(), 1, text.size(), stdout); }

}  // namespace rotary::cli
