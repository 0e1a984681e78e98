// lab/cli/command.h: how a `rotary` subcommand plugs into the command line.
//
// Each command file defines a static CommandRegistrar; main() calls every registered function with the root
// CLI::App, so adding a command touches only its own file. Commands report bad input by throwing
// rotary::Error; main() prints the message and exits with status 2 (common/exit_status.h). Numeric options carry
// a validator from options.h.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
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

}  // namespace rotary::cli
