// pipegrid import ARGS...                    (PyTorch model -> model file; tools/torch_import.py)
// pipegrid export --chakra DIR [EXPERIMENT]  (lowered task graph -> Chakra traces, one per rank)
// pipegrid replay --chakra DIR [EXPERIMENT]  (Chakra traces replayed on the experiment's cluster)
// The Python halves (tools/torch_import.py, tools/chakra.py) are compiled in and written to a
// temporary folder when run, so the binary works from any directory. docs/import-export.md.
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "core/experiment.h"
#include "core/file_io.h"
#include "core/metrics.h"
#include "sim/replay.h"
#include "tools/builtin_chakra_script.h"
#include "tools/builtin_example.h"
#include "tools/builtin_torch_import_script.h"
#include "tools/cli/cli.h"
#include "tools/cli/temp_dir.h"
#include "tools/input/experiment_yaml.h"
#include "tools/output/safe_write.h"
#include "tools/output/trace_graph.h"
#include "tools/process/isolated_replay.h"
#include "tools/process/process.h"

namespace pipegrid::cli {
namespace {

namespace fs = std::filesystem;

Status write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return Error{fmt::format("cannot write \"{}\"", path)};
  return {};
}

Result<Experiment> load(const std::string& file, const std::vector<std::string>& overrides) {
  if (file.empty()) return input::load_experiment_text(kBuiltinExample, "<built-in example>", overrides);
  return input::load_experiment_file(file, overrides);
}

// --- import -------------------------------------------------------------------------------------

struct ImportOptions {
  std::vector<std::string> args;
};

int run_import(const ImportOptions& o) {
  std::optional<std::string> py = process::python_with("torch");
  if (!py)
    return bad_input(fmt::format(
        "`pipegrid import` needs python3 with PyTorch (Debian: sudo apt-get install python3-torch "
        "python3-torchvision, or `tools/setup --all`; {})",
        process::python_advice()));
  TempDir tmp;
  if (tmp.path.empty()) return bad_input("cannot create a temporary folder");
  const std::string script = tmp.file("torch_import.py");
  if (Status s = write_text(script, kTorchImportScript); !s) return bad_input(s.error().message);
  std::vector<std::string> argv = {*py, script};
  argv.insert(argv.end(), o.args.begin(), o.args.end());
  // The script prints its own messages (stdout: the model file unless -o).
  const int rc = process::spawn(argv, process::Output::Inherit);
  return rc < 0 ? kInternal : rc;
}

// --- Chakra ---------------------------------------------------------------------------------------

struct ChakraOptions {
  std::string file;  // experiment
  std::string dir;
  std::string prefix = "pipegrid";
  std::string graph;  // the trace graph as JSON (written by export; read by replay instead of DIR)
  bool p2p = false;
  bool json = false;
  std::vector<std::string> overrides;
};

int run_chakra_script(const std::vector<std::string>& args) {
  std::optional<std::string> py = process::python_with("json");
  if (!py)
    return bad_input(fmt::format("Chakra traces need python3 (Debian: sudo apt-get install python3; {})",
                                 process::python_advice()));
  TempDir tmp;
  const std::string script = tmp.file("chakra.py");
  if (Status s = write_text(script, kChakraScript); !s) return bad_input(s.error().message);
  std::vector<std::string> argv = {*py, script};
  argv.insert(argv.end(), args.begin(), args.end());
  return process::spawn(argv, process::Output::ToStderr);
}

// What an export into `dir` would replace or leave beside its own traces: files named
// PREFIX.<rank>.et from an earlier export. Empty when there are none (or no folder yet).
std::vector<std::string> earlier_traces(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > prefix.size() + 4 && name.compare(0, prefix.size() + 1, prefix + ".") == 0 &&
        name.compare(name.size() - 3, 3, ".et") == 0) {
      const std::string rank = name.substr(prefix.size() + 1, name.size() - prefix.size() - 4);
      if (!rank.empty() &&
          std::all_of(rank.begin(), rank.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
        out.push_back(name);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

int run_export(const ChakraOptions& o) {
  if (o.dir.empty() && o.graph.empty()) return bad_input("export: give --chakra DIR (and/or --graph FILE)");
  if (o.prefix.empty() || o.prefix.find('/') != std::string::npos || o.prefix == "." || o.prefix == "..")
    return bad_input(fmt::format(
        "--prefix \"{}\": expected a file name (the traces go into --chakra's folder)", o.prefix));
  if (!o.dir.empty())
    if (const std::vector<std::string> old = earlier_traces(o.dir, o.prefix); !old.empty())
      return bad_input(fmt::format(
          "--chakra \"{}\" already holds {} trace{} of an earlier export ({}{}): this export would replace "
          "them or leave them beside its own ranks; expected an empty folder or another --prefix (nothing "
          "was written)",
          o.dir, old.size(), old.size() == 1 ? "" : "s", old.front(), old.size() > 1 ? ", ..." : ""));
  Result<Experiment> exp = load(o.file, o.overrides);
  if (!exp) return bad_input(exp.error().message);
  const std::string where = o.file.empty() ? "<built-in example>" : o.file;
  const process::SimGridJudge judge;
  Result<PreparedRun> prepared = prepare(*exp, &judge, /*prove_deadlock_free=*/true);
  if (!prepared) return bad_input(fmt::format("{}: {}", where, prepared.error().message));
  output::TraceExportOptions eo;
  eo.collectives = !o.p2p;
  std::vector<std::string> notes;
  eo.notes = &notes;
  Result<nlohmann::json> graph = output::to_trace_graph(prepared->graph, exp->cluster.devices.size(), eo);
  if (!graph) return bad_input(fmt::format("{}: {}", where, graph.error().message));
  for (const std::string& note : notes) fmt::print(std::cerr, "pipegrid export: {}\n", note);
  const std::string text = graph->dump();
  if (!o.graph.empty())
    if (Status s = output::write_file_safely(o.graph, text); !s) return bad_input(s.error().message);
  if (o.dir.empty()) return kOk;
  TempDir tmp;
  const std::string json_file = tmp.file("graph.json");
  if (Status s = write_text(json_file, text); !s) return bad_input(s.error().message);
  const int rc = run_chakra_script({"encode", json_file, o.dir, "--prefix", o.prefix});
  if (rc != 0) return rc < 0 ? kInternal : rc;
  return kOk;
}

// The trace graph's JSON; an error names `source`, the line and column and what the parser found.
Result<nlohmann::json> parse_trace_json(const std::string& text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte: the position (from 1) of the character the parser stopped at.
    const size_t at = std::min(e.byte == 0 ? 0 : e.byte - 1, text.size());
    const size_t line = 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + at, '\n'));
    const size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
    const size_t column = at - (line_start == std::string::npos || at == 0 ? 0 : line_start + 1) + 1;
    std::string why = e.what();
    if (const size_t colon = why.find(": "); colon != std::string::npos) why = why.substr(colon + 2);
    return Error{fmt::format("{}:{}:{}: not a trace graph (JSON): {}", source, line, column, why)};
  }
}

int run_replay(const ChakraOptions& o) {
  if (o.dir.empty() == o.graph.empty()) return bad_input("replay: give either --chakra DIR or --graph FILE");
  Result<Experiment> exp = load(o.file, o.overrides);
  if (!exp) return bad_input(exp.error().message);
  std::string text;
  std::string source = o.graph;
  if (!o.dir.empty()) {
    TempDir tmp;
    const std::string json_file = tmp.file("graph.json");
    const int rc = run_chakra_script({"decode", o.dir, "--prefix", o.prefix, "-o", json_file});
    if (rc != 0) return rc < 0 ? kInternal : rc;
    Result<std::string> t = read_input_file(json_file, kMaxTraceBytes);
    if (!t) return bad_input(t.error().message);
    text = *t;
    source = o.dir;
  } else {
    Result<std::string> t = read_input_file(o.graph, kMaxTraceBytes);
    if (!t) return bad_input(t.error().message);
    text = *t;
  }
  Result<nlohmann::json> j = parse_trace_json(text, source);
  if (!j) return bad_input(j.error().message);
  Result<TaskGraph> g = output::from_trace_graph(*j, exp->cluster);
  if (!g) return bad_input(fmt::format("{}: {}", source, g.error().message));
  Result<sim::Replay> replay = sim::replay(exp->cluster, *g);
  if (!replay) return bad_input(fmt::format("{}: {}", source, replay.error().message));
  const Metrics m = compute_metrics(exp->cluster, *g, replay->timeline);
  size_t compute = 0, transfers = 0;
  for (const Task& t : g->tasks) (t.is_compute() ? compute : transfers)++;
  if (o.json) {
    nlohmann::json out = {
        {"traces", source},       {"devices", exp->cluster.devices.size()}, {"compute_tasks", compute},
        {"transfers", transfers}, {"iteration_time_s", m.iteration_time_s}, {"bubble_ratio", m.bubble_ratio}};
    std::cout << out.dump(2) << "\n";
  } else {
    fmt::print("{}: {} compute tasks, {} transfers on {} devices\niteration time   {:.9g} s\n", source,
               compute, transfers, exp->cluster.devices.size(), m.iteration_time_s);
  }
  return kOk;
}

void add_chakra_options(CLI::App* app, ChakraOptions& o) {
  app->add_option("experiment", o.file, "Experiment file (YAML); without it, the built-in example")
      ->check(kNonEmpty);
  app->add_option("--chakra", o.dir, "Folder of Chakra traces, PREFIX.<rank>.et");
  app->add_option("--prefix", o.prefix, "File name prefix of the traces");
  add_set_option(*app, o.overrides);
}

}  // namespace

Command add_import_command(CLI::App& parent) {
  auto o = std::make_shared<ImportOptions>();
  CLI::App* app = parent.add_subcommand(
      "import",
      "Import a PyTorch model (torch.fx) as a model file, optionally with a measured profile: "
      "`pipegrid import --torchvision resnet50 --input-shape 3,224,224 -o resnet50.yaml` "
      "(`pipegrid import -- --help` lists the options)");
  app->prefix_command();
  app->set_help_flag();  // --help goes to the script
  return {app, [o, app] {
            ImportOptions opts;
            opts.args = app->remaining();
            if (!opts.args.empty() && opts.args.front() == "--") opts.args.erase(opts.args.begin());
            return run_import(opts);
          }};
}

Command add_export_command(CLI::App& parent) {
  auto o = std::make_shared<ChakraOptions>();
  CLI::App* app = parent.add_subcommand(
      "export", "Write an experiment's lowered task graph as Chakra execution traces, one per rank");
  add_chakra_options(app, *o);
  app->add_option("--graph", o->graph,
                  "Also write the trace graph (JSON, docs/import-export.md) to this file");
  app->add_flag("--p2p", o->p2p,
                "All-reduces as their ring's send/receive pairs instead of collective nodes");
  return {app, [o] { return run_export(*o); }};
}

Command add_replay_command(CLI::App& parent) {
  auto o = std::make_shared<ChakraOptions>();
  CLI::App* app = parent.add_subcommand(
      "replay",
      "Replay Chakra execution traces on an experiment's cluster (its workload and strategy unused)");
  add_chakra_options(app, *o);
  app->add_option("--graph", o->graph, "Read a trace graph (JSON) instead of --chakra");
  app->add_flag("--json", o->json, "Print one JSON object");
  return {app, [o] { return run_replay(*o); }};
}

}  // namespace pipegrid::cli
