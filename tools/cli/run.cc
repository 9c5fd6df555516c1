// pipegrid run [EXPERIMENT.yaml] [--json] [--trace FILE] [--sim-log]
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <fstream>
#include <iostream>
#include <memory>

#include "core/experiment.h"
#include "core/metrics.h"
#include "sim/replay.h"
#include "tools/builtin_example.h"
#include "tools/cli/cli.h"
#include "tools/input/experiment_yaml.h"
#include "tools/output/report.h"

namespace pipegrid::cli {
namespace {

struct RunOptions {
  std::string file;
  bool json = false;
  std::string trace;
  bool sim_log = false;
};

int run(const RunOptions& o) {
  Result<Experiment> exp = o.file.empty() ? input::load_experiment_text(kBuiltinExample, "<built-in example>")
                                          : input::load_experiment_file(o.file);
  if (!exp) return bad_input(exp.error().message);
  const std::string where = o.file.empty() ? "<built-in example>" : o.file;
  Result<PreparedRun> prepared = prepare(*exp);
  if (!prepared) return bad_input(fmt::format("{}: {}", where, prepared.error().message));
  sim::ReplayOptions ro;
  ro.log = o.sim_log;
  Result<sim::Replay> replay = sim::replay(exp->cluster, prepared->graph, ro);
  if (!replay) return bad_input(fmt::format("{}: {}", where, replay.error().message));
  const Metrics metrics = compute_metrics(exp->cluster, prepared->graph, replay->timeline);
  const output::RunReport report{*exp, *prepared, replay->timeline, metrics};
  if (!o.trace.empty()) {
    std::ofstream out(o.trace);
    if (out) output::write_chrome_trace(out, report);
    if (!out) return bad_input(fmt::format("cannot write the trace to \"{}\"", o.trace));
  }
  if (o.json)
    std::cout << output::to_json(report).dump(2) << "\n";
  else
    output::print_summary(std::cout, report);
  return kOk;
}

}  // namespace

Command add_run_command(CLI::App& parent) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* app = parent.add_subcommand("run", "Simulate one training iteration of an experiment");
  app->add_option("experiment", o->file, "Experiment file (YAML); without it, the built-in example");
  app->add_flag("--json", o->json, "Print one JSON object instead of the summary");
  app->add_option("--trace", o->trace, "Write a Chrome/Perfetto trace to this file");
  app->add_flag("--sim-log", o->sim_log, "Let SimGrid print its log (silent by default)");
  return {app, [o] { return run(*o); }};
}

}  // namespace pipegrid::cli
