// The pipegrid command line: parses arguments and runs one subcommand (tools/cli/). The only
// place that chooses exit statuses: 0 success, 2 bad input or usage, 1 an internal failure.
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <iostream>
#include <vector>

#include "tools/cli/cli.h"

namespace pipegrid::cli {

int bad_input(const std::string& message) {
  fmt::print(std::cerr, "pipegrid: {}\n", message);
  return kBadInput;
}

}  // namespace pipegrid::cli

int main(int argc, char** argv) {
  namespace cli = pipegrid::cli;
  CLI::App app{
      "pipegrid: a discrete-event simulator of pipeline-parallel DNN training on GPU and FPGA clusters"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show the help of every subcommand");

  // One line per subcommand, in the order `--help` lists them.
  constexpr cli::Command (*kCommands[])(CLI::App&) = {
      &cli::add_run_command,      &cli::add_list_command,   &cli::add_schedule_command,
      &cli::add_workload_command, &cli::add_device_command, &cli::add_plan_command,
      &cli::add_cluster_command,
  };
  std::vector<cli::Command> commands;
  for (auto add : kCommands) commands.push_back(add(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? cli::kOk : cli::kBadInput;
  }
  try {
    for (const cli::Command& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const std::exception& e) {
    fmt::print(std::cerr, "pipegrid: internal error: {}\n", e.what());
    return cli::kInternal;
  }
  return cli::kBadInput;
}
