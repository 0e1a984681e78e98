// rotary: the command line of the lab (freqs, bench, and later train / eval / compare / generate).
#include <cstdio>
#include <string>
#include <exception>

#include "cli/command.h"
#include "common/exit_status.h"
#include "common/process.h"

namespace rotary::cli {

std::vector<RegisterFn>& command_registry() {
  static std::vector<RegisterFn> registry;
  return registry;
}

CommandRegistrar::CommandRegistrar(RegisterFn fn) { command_registry().push_back(std::move(fn)); }

CLI::App& subcommand_group(CLI::App& parent, const std::string& name, const std::string& description) {
  for (CLI::App* sub : parent.get_subcommands([](CLI::App*) { return true; }))
    if (sub->get_name() == name) return *sub;
  CLI::App* sub = parent.add_subcommand(name, description);
  sub->require_subcommand(1);
  return *sub;
}

}  // namespace rotary::cli

// Exit status: one policy for every command, in common/exit_status.h.
int main(int argc, char** argv) {
  rotary::lab::die_with_parent_if_asked();  // a `rotary train` that compare or a launcher started ends with it
  CLI::App app{"rotary: rotary position embeddings (RoPE, RoPER, ReRoPE) - kernels, benchmarks and the lab"};
  app.require_subcommand(1);
  std::string footer =
      "Exit status: 0 success; 2 bad input (flag, value or file; the message names it); 3 non-finite training loss; "
      "70 internal error (a bug: please report it); 71 out of memory; 128+N interrupted by signal N.";
#ifndef ROTARY_HAVE_TORCH
  // The commands of the torch layers register only in a build with libtorch: say so, rather than leave them unknown.
  footer += "\n\nThis rotary is built without libtorch (ROTARY_WITH_TORCH=OFF): the checkpoint commands run on the "
            "torch-free engine; train, eval, compare, extrapolate, decay, memory, reproduce, bench train and "
            "bench checkpoint --engine torch / generate of a lab run are absent (build them with scripts/build.sh).";
#endif
  app.footer(footer);
  for (auto& fn : rotary::cli::command_registry()) fn(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a command's own exit status (3: non-finite loss, 128 + signal: interrupted)
  } catch (const CLI::ParseError& e) {
    // --help and friends exit 0; every usage error (unknown flag, a value that does not parse or is out of range,
    // a missing subcommand) is reported like our own input errors and exits 2, whatever CLI11's code for it is.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "error: %s\nRun with --help for more information.\n", e.what());
    return rotary::lab::kExitBadInput;
  } catch (...) {
    return rotary::lab::report_exception(std::current_exception(), stderr);
  }
  return 0;
}
