// pipegrid run [EXPERIMENT.yaml|-] [--json] [--trace FILE] [--tasks FILE] [--memory FILE] [--plot DIR]
// [--sim-log]
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "core/experiment.h"
#include "core/file_io.h"
#include "core/metrics.h"
#include "sim/replay.h"
#include "tools/builtin_example.h"
#include "tools/builtin_plot_script.h"
#include "tools/cli/cli.h"
#include "tools/cli/progress.h"
#include "tools/input/experiment_yaml.h"
#include "tools/output/report.h"
#include "tools/output/safe_write.h"
#include "tools/process/isolated_replay.h"
#include "tools/process/process.h"

namespace pipegrid::cli {
namespace {

struct RunOptions {
  std::string file;
  bool json = false;
  std::string trace;
  std::string tasks;
  std::string memory;
  std::string plot;
  bool sim_log = false;
  std::vector<std::string> overrides;  // --set KEY=VALUE
};

// Writes a file with `write`, all or nothing (output::write_file_safely).
Status write_file(const std::string& path, const std::function<void(std::ostream&)>& write) {
  std::ostringstream out;
  write(out);
  return output::write_file_safely(path, out.str());
}

// The experiment named on the command line: none (the built-in example), "-" (standard input; the
// paths inside resolve against the current directory) or a file.
Result<Experiment> load(const std::string& file, const std::vector<std::string>& overrides) {
  if (file.empty()) return input::load_experiment_text(kBuiltinExample, "<built-in example>", overrides);
  if (file == "-") {
    Result<std::string> text = read_input_stream(std::cin, "<stdin>");
    if (!text) return text.error();
    return input::load_experiment_text(*text, "<stdin>", overrides);
  }
  return input::load_experiment_file(file, overrides);
}

// The --plot files, in DIR.
struct PlotFiles {
  std::string tasks, memory, script;
};
PlotFiles plot_files(const std::string& dir) {
  namespace fs = std::filesystem;
  return {(fs::path(dir) / "tasks.csv").string(), (fs::path(dir) / "memory.csv").string(),
          (fs::path(dir) / "plot_timeline.py").string()};
}

int simulate(const Result<Experiment>& exp, const std::string& where, const RunOptions& o,
             const PlotFiles& plot);

int run(const RunOptions& o) {
  const PlotFiles plot = o.plot.empty() ? PlotFiles{} : plot_files(o.plot);
  if (Status s = output::check_distinct_outputs({{"--trace", o.trace},
                                                 {"--tasks", o.tasks},
                                                 {"--memory", o.memory},
                                                 {"--plot", plot.tasks},
                                                 {"--plot", plot.memory},
                                                 {"--plot", plot.script}},
                                                {{"the experiment file", o.file}});
      !s)
    return bad_input(s.error().message);
  Result<Experiment> exp = load(o.file, o.overrides);
  if (!exp) return bad_input(exp.error().message);
  const std::string where = o.file.empty() ? "<built-in example>" : o.file == "-" ? "<stdin>" : o.file;
  return simulate(exp, where, o, plot);
}

int simulate(const Result<Experiment>& exp, const std::string& where, const RunOptions& o,
             const PlotFiles& plot) {
  const process::SimGridJudge judge;
  // The replay finds a deadlock itself (ro.schedule), so prepare does not run the graph first.
  Progress progress("planning");
  Result<PreparedRun> prepared = prepare(*exp, &judge, /*prove_deadlock_free=*/false);
  progress.done();
  if (!prepared) return bad_input(fmt::format("{}: {}", where, prepared.error().message));
  for (const std::string& w : output::plan_warnings(*exp, *prepared))
    fmt::print(std::cerr, "pipegrid: warning: {}\n", w);
  sim::ReplayOptions ro;
  ro.log = o.sim_log;
  ro.schedule = &prepared->schedule;
  Progress replaying("simulating");
  Result<sim::Replay> replay = sim::replay(exp->cluster, prepared->graph, ro);
  replaying.done();
  if (!replay) return bad_input(fmt::format("{}: {}", where, replay.error().message));
  const Metrics metrics = compute_metrics(exp->cluster, prepared->graph, replay->timeline);
  const output::RunReport report{*exp, *prepared, replay->timeline, metrics};
  auto writer = [&](void (*fn)(std::ostream&, const output::RunReport&)) {
    return [&report, fn](std::ostream& out) { fn(out, report); };
  };
  struct Output {
    const std::string& path;
    void (*fn)(std::ostream&, const output::RunReport&);
  };
  for (const Output& out :
       {Output{o.trace, &output::write_chrome_trace}, Output{o.tasks, &output::write_tasks_csv},
        Output{o.memory, &output::write_memory_csv}})
    if (!out.path.empty())
      if (Status s = write_file(out.path, writer(out.fn)); !s) return bad_input(s.error().message);
  if (o.json)
    std::cout << output::to_json(report).dump(2) << "\n";
  else
    output::print_summary(std::cout, report);
  if (!o.plot.empty()) {
    // The folder itself is created (not its parents, like every output's folder).
    const std::string dir = o.plot;
    const auto& [tasks, memory, script] = plot;
    std::error_code ec;
    std::filesystem::create_directory(dir, ec);
    if (ec) return bad_input(fmt::format("cannot create the folder \"{}\": {}", dir, ec.message()));
    Status s = write_file(tasks, writer(&output::write_tasks_csv));
    if (s) s = write_file(memory, writer(&output::write_memory_csv));
    if (s) s = write_file(script, [](std::ostream& out) { out << kPlotScript; });
    if (!s) return bad_input(s.error().message);
    std::optional<std::string> py = process::python_with("matplotlib");
    if (!py) {
      fmt::print(
          std::cerr,
          "pipegrid: --plot needs python3 with matplotlib (Debian: sudo apt-get install python3-matplotlib; "
          "or set PIPEGRID_PYTHON); the data is in {} and {}, the script in {}\n",
          tasks, memory, script);
      return kOk;
    }
    // The figures' title: the experiment's name, or where it came from when it has none.
    const std::string title = exp->name.empty() ? fmt::format("unnamed experiment ({})", where) : exp->name;
    const int rc = process::spawn({*py, script, "--tasks", tasks, "--memory", memory, "--out", dir, "--title", title},
                                  process::Output::ToStderr);
    if (rc != 0) {
      fmt::print(std::cerr, "pipegrid: the plotting script failed (status {}); the data is in {}\n", rc, dir);
      return kInternal;
    }
    fmt::print(std::cerr,
               "pipegrid: wrote {0}/timeline.png, {0}/timeline.svg, {0}/memory.png, {0}/memory.svg\n", dir);
  }
  return kOk;
}

}  // namespace

int run_loaded(const Experiment& exp, const std::string& where) {
  RunOptions o;
  o.json = true;
  return simulate(exp, where, o, PlotFiles{});
}

Command add_run_command(CLI::App& parent) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* app = parent.add_subcommand("run", "Simulate one training iteration of an experiment");
  app->add_option("experiment", o->file,
                  "Experiment file (YAML), - for standard input; without it, the built-in example")
      ->check(kNonEmpty);
  app->add_flag("--json", o->json, "Print one JSON object instead of the summary");
  app->add_option("--trace", o->trace, "Write a Chrome/Perfetto trace to this file");
  app->add_option("--tasks", o->tasks,
                  "Write every task (device, stage, kind, micro-batch, start, end) as CSV");
  app->add_option("--memory", o->memory, "Write each device's memory over time, by category, as CSV");
  app->add_option("--plot", o->plot,
                  "Write the CSVs and a Gantt and a memory figure (PNG, SVG) into this folder");
  app->add_flag("--sim-log", o->sim_log, "Let SimGrid print its log (silent by default)");
  add_set_option(*app, o->overrides);
  return {app, [o] { return run(*o); }};
}

}  // namespace pipegrid::cli
