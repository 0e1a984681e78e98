// rotary: the command line of the lab (freqs, bench, and later train / eval / compare / generate).
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "rotary/error.h"

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

int main(int argc, char** argv) {
  CLI::App app{"rotary: rotary position embeddings (RoPE, RoPER, ReRoPE) - kernels, benchmarks and the lab"};
  app.require_subcommand(1);
  for (auto& fn : rotary::cli::command_registry()) fn(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a command's own exit status (3: non-finite loss, 128 + signal: interrupted)
  } catch (const CLI::ParseError& e) {
    // --help and friends exit 0; every usage error (unknown flag, a value that does not parse, a missing
    // subcommand) exits 2 like our own input errors, whatever CLI11's internal code for it is.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const rotary::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
