// pipegrid list: the registered partitioners, schedules and planners with their one-line descriptions.
#include <fmt/format.h>

#include "core/planner.h"
#include "core/strategy.h"
#include "tools/cli/cli.h"

namespace pipegrid::cli {

Command add_list_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand("list", "List the partitioners, schedules and planners");
  return {app, [] {
            fmt::print("partitioners:\n");
            for (const auto& p : partition_strategies()) fmt::print("  {:<12} {}\n", p.name, p.description);
            fmt::print("schedules:\n");
            for (const auto& s : schedule_strategies()) fmt::print("  {:<12} {}\n", s.name, s.description);
            fmt::print("planners:\n");
            for (const auto& p : planners()) fmt::print("  {:<12} {}\n", p.name, p.description);
            return kOk;
          }};
}

}  // namespace pipegrid::cli
