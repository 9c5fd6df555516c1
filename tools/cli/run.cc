// pipegrid run [EXPERIMENT.yaml|-] [--json] [--devices groups|all] [--tokens N] [--memory-margin BYTES]
// [--trace FILE] [--tasks FILE] [--memory FILE] [--plot DIR] [--plot-data] [--timeline-rows
// auto|devices|ranks]
// [--timeline-window FIRST:LAST] [--sim-log]
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "core/experiment.h"
#include "core/file_io.h"
#include "core/metrics.h"
#include "core/model_flops.h"
#include "sim/replay.h"
#include "tools/builtin_example.h"
#include "tools/builtin_plot_script.h"
#include "tools/cli/cli.h"
#include "tools/cli/progress.h"
#include "tools/cli/temp_dir.h"
#include "tools/input/experiment_yaml.h"
#include "tools/output/report.h"
#include "tools/output/safe_write.h"
#include "tools/process/folded_replay.h"
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
  bool plot_data = false;              // keep --plot's CSVs and script
  std::string timeline_rows = "auto";  // auto, devices, ranks
  std::string timeline_window;         // FIRST:LAST micro-batches; empty: all
  std::string devices = "groups";      // the summary's device table: groups or all
  double tokens = 0;                   // a token budget to time
  std::string memory_margin;           // --memory-margin: memory.reserve
  bool sim_log = false;
  bool fold = false, whole = false;    // --fold, --whole (docs/scale.md)
  std::vector<std::string> overrides;  // --set KEY=VALUE
};

// Timelines of large runs stay drawable: past this many devices in use --plot draws one row per
// pipeline rank unless --timeline-rows devices asks for every device.
constexpr size_t kPlotRowsPerDevice = 64;

// --timeline-window FIRST:LAST (micro-batches, inclusive) into the view.
Status parse_window(const std::string& text, output::TimelineView& view) {
  if (text.empty()) return {};
  const size_t colon = text.find(':');
  try {
    size_t used = 0;
    const std::string first = text.substr(0, colon),
                      last = colon == std::string::npos ? first : text.substr(colon + 1);
    view.first_micro_batch = std::stoi(first, &used);
    if (used != first.size()) throw std::invalid_argument(first);
    view.last_micro_batch = std::stoi(last, &used);
    if (used != last.size()) throw std::invalid_argument(last);
  } catch (const std::exception&) {
    return Error{
        fmt::format("--timeline-window: expected FIRST:LAST micro-batches (e.g. 0:3), got \"{}\"", text)};
  }
  if (view.first_micro_batch < 0 || view.last_micro_batch < view.first_micro_batch)
    return Error{fmt::format("--timeline-window: expected 0 <= FIRST <= LAST, got \"{}\"", text)};
  return {};
}

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
int draw(const Experiment& e, const std::string& where, const RunOptions& o, const PlotFiles& files,
         output::RunReport& report);

// A writer of one of the report's files.
std::function<void(std::ostream&)> writer(const output::RunReport& report,
                                          void (*fn)(std::ostream&, const output::RunReport&)) {
  return [&report, fn](std::ostream& out) { fn(out, report); };
}

int run(const RunOptions& o) {
  // The data and script go into DIR only where --plot-data keeps them there; otherwise into a private
  // folder, so that files of those names already in DIR are left alone.
  const PlotFiles plot = o.plot.empty() || !o.plot_data ? PlotFiles{} : plot_files(o.plot);
  if (Status s = output::check_distinct_outputs({{"--trace", o.trace},
                                                 {"--tasks", o.tasks},
                                                 {"--memory", o.memory},
                                                 {"--plot", plot.tasks},
                                                 {"--plot", plot.memory},
                                                 {"--plot", plot.script}},
                                                {{"the experiment file", o.file}});
      !s)
    return bad_input(s.error().message);
  output::TimelineView window;
  if (Status s = parse_window(o.timeline_window, window); !s) return bad_input(s.error().message);
  // Both shape the per-task outputs only.
  if (o.plot_data && o.plot.empty())
    return bad_input(
        "--plot-data keeps --plot's data and script, and --plot was not given: it would change "
        "nothing");
  if (o.trace.empty() && o.tasks.empty() && o.memory.empty() && o.plot.empty())
    for (const auto& [given, name] : {std::pair{!o.timeline_window.empty(), "--timeline-window"},
                                      std::pair{o.timeline_rows != "auto", "--timeline-rows"}})
      if (given)
        return bad_input(fmt::format(
            "{} shapes the outputs of --trace, --tasks, --memory and --plot, and none was given: it would "
            "change nothing",
            name));
  const std::vector<std::string> overrides = with_memory_margin(o.overrides, o.memory_margin);
  Result<Experiment> exp = load(o.file, overrides);
  if (!exp) return bad_input(margin_message(exp.error().message, o.memory_margin));
  if (o.tokens > 0 && !model_flops(exp->workload))
    return bad_input("--tokens needs a workload with a sequence length (a transformer): it has no tokens");
  const std::string where = o.file.empty() ? "<built-in example>" : o.file == "-" ? "<stdin>" : o.file;
  return simulate(exp, where, o, plot);
}

int simulate(const Result<Experiment>& exp, const std::string& where, const RunOptions& o,
             const PlotFiles& plot) {
  const process::SimGridJudge judge;
  // The replay finds a deadlock itself (ro.schedule), so prepare does not run the graph first.
  Progress progress("planning");
  const process::FoldMode fold = o.whole  ? process::FoldMode::Whole
                                 : o.fold ? process::FoldMode::Fold
                                          : process::FoldMode::Auto;
  // The per-task outputs need every task's times (the whole graph, folded in the replay where it
  // folds), but for one representative per pipeline rank (--timeline-rows ranks: replica 0's devices,
  // which the folded graph holds whole).
  const bool every_task = (!o.trace.empty() || !o.tasks.empty() || !o.memory.empty() || !o.plot.empty()) &&
                          o.timeline_rows != "ranks";
  Result<PreparedRun> prepared =
      prepare(*exp, &judge, /*prove_deadlock_free=*/false, process::form_for(fold, every_task));
  progress.done();
  if (!prepared) return bad_input(fmt::format("{}: {}", where, prepared.error().message));
  for (const std::string& w : output::plan_warnings(*exp, *prepared))
    fmt::print(std::cerr, "pipegrid: warning: {}\n", w);
  sim::ReplayOptions ro;
  ro.log = o.sim_log;
  ro.schedule = &prepared->schedule;
  Progress replaying("simulating");
  Result<process::ChosenReplay> replay = process::replay_prepared(*exp, *prepared, ro, fold);
  replaying.done();
  if (!replay) return bad_input(fmt::format("{}: {}", where, replay.error().message));
  const Timeline& timeline = replay->replay.timeline;
  const Metrics metrics =
      compute_metrics(exp->cluster, prepared->graph, timeline, prepared->fold ? &*prepared->fold : nullptr);
  output::RunReport report{*exp, *prepared, timeline, metrics, o.devices == "all", o.tokens, {}};
  if (replay->mode.stated()) report.replay = process::describe(replay->mode);
  (void)parse_window(o.timeline_window, report.view);  // checked by run()
  if (!o.timeline_window.empty() && report.view.first_micro_batch >= prepared->micro_batches)
    return bad_input(fmt::format(
        "--timeline-window {}: the plan runs micro-batches 0 to {}, so the window would hold none of them",
        o.timeline_window, prepared->micro_batches - 1));
  if (o.timeline_rows == "ranks")
    report.view.devices = output::rank_representatives(exp->cluster, prepared->partition);
  struct Output {
    const std::string& path;
    void (*fn)(std::ostream&, const output::RunReport&);
  };
  for (const Output& out :
       {Output{o.trace, &output::write_chrome_trace}, Output{o.tasks, &output::write_tasks_csv},
        Output{o.memory, &output::write_memory_csv}})
    if (!out.path.empty())
      if (Status s = write_file(out.path, writer(report, out.fn)); !s) return bad_input(s.error().message);
  if (o.json)
    std::cout << output::to_json(report).dump(2) << "\n";
  else
    output::print_summary(std::cout, report);
  return o.plot.empty() ? kOk : draw(*exp, where, o, plot, report);
}

// --plot: the CSVs and the script, then the figures into the folder; the CSVs and the script go into
// the folder with --plot-data, else into a private temporary folder removed once drawn. Past
// kPlotRowsPerDevice devices in use, one row per pipeline rank unless --timeline-rows says otherwise.
int draw(const Experiment& e, const std::string& where, const RunOptions& o, const PlotFiles& kept,
         output::RunReport& report) {
  size_t in_use = 0;
  for (const DeviceMetrics& d : report.metrics.devices) in_use += d.used;
  if (o.timeline_rows == "auto" && in_use > kPlotRowsPerDevice) {
    report.view.devices = output::rank_representatives(e.cluster, report.run.partition);
    fmt::print(std::cerr,
               "pipegrid: --plot draws one row per pipeline rank ({} of the {} devices in use; "
               "--timeline-rows devices draws each)\n",
               std::count(report.view.devices.begin(), report.view.devices.end(), 1), in_use);
  }
  // The folder itself is created (not its parents, like every output's folder).
  const std::string& dir = o.plot;
  std::error_code ec;
  std::filesystem::create_directory(dir, ec);
  if (ec) return bad_input(fmt::format("cannot create the folder \"{}\": {}", dir, ec.message()));
  const TempDir scratch;
  if (!o.plot_data && scratch.path.empty()) return bad_input("--plot: cannot create a temporary folder");
  const PlotFiles files = o.plot_data ? kept : plot_files(scratch.path);
  const auto& [tasks, memory, script] = files;
  Status s = write_file(tasks, writer(report, &output::write_tasks_csv));
  if (s) s = write_file(memory, writer(report, &output::write_memory_csv));
  if (s) s = write_file(script, [](std::ostream& out) { out << kPlotScript; });
  if (!s) return bad_input(s.error().message);
  std::optional<std::string> py = process::python_with("matplotlib");
  if (!py) {
    fmt::print(
        std::cerr,
        "pipegrid: --plot needs python3 with matplotlib (Debian: sudo apt-get install python3-matplotlib; "
        "{}){}\n",
        process::python_advice(),
        o.plot_data ? fmt::format("; the data is in {} and {}, the script in {}", tasks, memory, script)
                    : std::string("; --plot-data keeps the data and the script in the folder"));
    return kOk;
  }
  // The figures' title: the experiment's name, or where it came from when it has none.
  const std::string title = e.name.empty() ? fmt::format("unnamed experiment ({})", where) : e.name;
  const int rc =
      process::spawn({*py, script, "--tasks", tasks, "--memory", memory, "--out", dir, "--title", title},
                     process::Output::ToStderr);
  if (rc != 0) {
    fmt::print(std::cerr, "pipegrid: the plotting script failed (status {}){}\n", rc,
               o.plot_data ? fmt::format("; the data is in {}", dir) : std::string());
    return kInternal;
  }
  fmt::print(std::cerr,
             "pipegrid: wrote {0}/timeline.png, {0}/timeline.svg, {0}/memory.png, {0}/memory.svg{1}\n", dir,
             o.plot_data ? fmt::format(" (data: {}, {})", tasks, memory) : "");
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
  app->add_option("--plot", o->plot, "Draw a Gantt and a memory figure (PNG, SVG) into this folder");
  app->add_flag("--plot-data", o->plot_data, "Keep --plot's CSVs and script beside the figures");
  app->add_option(
         "--timeline-rows", o->timeline_rows,
         "Rows of --trace, --plot, --tasks and --memory: every device, one per pipeline rank (one "
         "representative of the devices alike), or auto (ranks past 64 devices in use, for --plot only)")
      ->check(CLI::IsMember({"auto", "devices", "ranks"}));
  app->add_option("--timeline-window", o->timeline_window,
                  "Only micro-batches FIRST to LAST in --trace, --plot, --tasks and --memory (e.g. 0:3)");
  app->add_option("--tokens", o->tokens, "A token budget: print the time to train on it (e.g. 15e12)")
      ->check(kFinitePositive);
  add_devices_option(*app, o->devices);
  add_memory_margin_option(*app, o->memory_margin);
  app->add_flag("--sim-log", o->sim_log, "Let SimGrid print its log (silent by default)");
  add_fold_options(*app, o->fold, o->whole);
  add_set_option(*app, o->overrides);
  return {app, [o] { return run(*o); }};
}

}  // namespace pipegrid::cli
