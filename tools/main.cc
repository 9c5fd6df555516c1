// The pipegrid command line. The only place that prints results and chooses exit statuses:
// 0 success, 2 bad input or usage (with a message naming file:line:column where there is one),
// 1 an internal failure.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <fstream>
#include <iostream>

#include "core/experiment.h"
#include "core/metrics.h"
#include "core/strategy.h"
#include "sim/replay.h"
#include "tools/builtin_example.h"
#include "tools/input/experiment_yaml.h"
#include "tools/output/report.h"

namespace pg = pipegrid;

namespace {

constexpr int kBadInput = 2;
constexpr int kInternal = 1;

int bad_input(const std::string& message) {
  fmt::print(std::cerr, "pipegrid: {}\n", message);
  return kBadInput;
}

struct RunOptions {
  std::string file;
  bool json = false;
  std::string trace;
  bool sim_log = false;
};

int cmd_run(const RunOptions& o) {
  pg::Result<pg::Experiment> exp = o.file.empty()
                                       ? pg::input::load_experiment_text(pg::kBuiltinExample, "<built-in example>")
                                       : pg::input::load_experiment_file(o.file);
  if (!exp) return bad_input(exp.error().message);
  const std::string where = o.file.empty() ? "<built-in example>" : o.file;
  pg::Result<pg::PreparedRun> run = pg::prepare(*exp);
  if (!run) return bad_input(fmt::format("{}: {}", where, run.error().message));
  pg::sim::ReplayOptions ro;
  ro.log = o.sim_log;
  pg::Result<pg::sim::Replay> replay = pg::sim::replay(exp->cluster, run->graph, ro);
  if (!replay) return bad_input(fmt::format("{}: {}", where, replay.error().message));
  const pg::Metrics metrics = pg::compute_metrics(exp->cluster, run->graph, replay->timeline);
  const pg::output::RunReport report{*exp, *run, replay->timeline, metrics};
  if (!o.trace.empty()) {
    std::ofstream out(o.trace);
    if (!out) return bad_input(fmt::format("cannot write the trace to \"{}\"", o.trace));
    pg::output::write_chrome_trace(out, report);
    if (!out) return bad_input(fmt::format("cannot write the trace to \"{}\"", o.trace));
  }
  if (o.json)
    std::cout << pg::output::to_json(report).dump(2) << "\n";
  else
    pg::output::print_summary(std::cout, report);
  return 0;
}

int cmd_list() {
  fmt::print("partitioners:\n");
  for (const auto& p : pg::partition_strategies()) fmt::print("  {:<12} {}\n", p.name, p.description);
  fmt::print("schedules:\n");
  for (const auto& s : pg::schedule_strategies()) fmt::print("  {:<12} {}\n", s.name, s.description);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipegrid: a discrete-event simulator of pipeline-parallel DNN training on GPU and FPGA clusters"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show the help of every subcommand");

  RunOptions run;
  CLI::App* run_cmd = app.add_subcommand("run", "Simulate one training iteration of an experiment");
  run_cmd->add_option("experiment", run.file, "Experiment file (YAML); without it, the built-in example");
  run_cmd->add_flag("--json", run.json, "Print one JSON object instead of the summary");
  run_cmd->add_option("--trace", run.trace, "Write a Chrome/Perfetto trace to this file");
  run_cmd->add_flag("--sim-log", run.sim_log, "Let SimGrid print its log (silent by default)");

  CLI::App* list_cmd = app.add_subcommand("list", "List the partitioners and schedules");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kBadInput;
  }
  try {
    if (*run_cmd) return cmd_run(run);
    if (*list_cmd) return cmd_list();
  } catch (const std::exception& e) {
    fmt::print(std::cerr, "pipegrid: internal error: {}\n", e.what());
    return kInternal;
  }
  return kBadInput;
}
