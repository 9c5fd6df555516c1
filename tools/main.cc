// The pipegrid command line: parses arguments and runs one subcommand (tools/cli/). The only
// place that chooses exit statuses: 0 success, 2 bad input or usage, 1 an internal failure.
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <iostream>
#include <string_view>
#include <vector>

#include "tools/cli/cli.h"
#include "tools/input/yaml_node.h"

namespace pipegrid::cli {

int bad_input(const std::string& message) {
  fmt::print(std::cerr, "pipegrid: {}\n", message);
  return kBadInput;
}

void add_set_option(CLI::App& app, std::vector<std::string>& overrides) {
  app.add_option("--set", overrides,
                 "Set a key of the experiment, KEY=VALUE with VALUE in YAML (repeatable): "
                 "cluster.device.dsps=18048, strategy.micro_batches=16, cluster.dims=[4,4]")
      ->allow_extra_args(false)
      ->type_name("KEY=VALUE");
}

void add_devices_option(CLI::App& app, std::string& devices) {
  app.add_option("--devices", devices,
                 "Device tables: groups (devices alike as ranges, the outliers named) or all (every device)")
      ->check(CLI::IsMember({"groups", "all"}));
}

void add_fold_options(CLI::App& app, bool& fold, bool& whole) {
  CLI::Option* f =
      app.add_flag("--fold", fold,
                   "Replay one data-parallel replica for all where the replicas are alike (exact, "
                   "checked; the default from 2^20 tasks; docs/scale.md)");
  app.add_flag("--whole", whole, "Replay every task of every replica, never folded")->excludes(f);
}

void add_memory_margin_option(CLI::App& app, std::string& margin) {
  app.add_option("--memory-margin", margin,
                 "Memory kept from every device for the CUDA context, NCCL buffers and fragmentation (e.g. "
                 "6GiB, 0; default 1 GiB + 5% per GPU; the experiment's memory.reserve)")
      ->type_name("BYTES");
}

std::vector<std::string> with_memory_margin(std::vector<std::string> overrides, const std::string& margin) {
  if (!margin.empty()) overrides.push_back("memory.reserve=" + (margin == "0" ? std::string("0B") : margin));
  return overrides;
}

std::string margin_message(std::string message, const std::string& margin) {
  if (margin.empty()) return message;
  const std::string set = "--set memory.reserve=" + (margin == "0" ? std::string("0B") : margin) + ":";
  if (message.rfind(set, 0) == 0) message.replace(0, set.size(), "--memory-margin " + margin + ":");
  return message;
}

namespace {

// --help without CLI11's artefacts: the type alone ("INT", not "INT:INT in [1 - 100000]"), a default
// only where there is one to state (not "=0 REQUIRED", not "=[]" on a repeatable option), and
// "(repeatable)" instead of "...".
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_opts(const CLI::Option* opt) const override {
    if (!opt->get_option_text().empty()) return " " + opt->get_option_text();
    std::string out;
    if (opt->get_type_size() != 0) {
      std::string type = opt->get_type_name();
      type = type.substr(0, type.find(':'));  // validators append ":<description>"
      if (!type.empty()) out += " " + type;
      const std::string def = opt->get_default_str();
      if (!opt->get_required() && !def.empty() && def != "[]") out += "=" + def;
      if (opt->get_expected_max() == CLI::detail::expected_max_vector_size) out += " (repeatable)";
      if (opt->get_required()) out += " (required)";
    }
    for (const CLI::Option* x : opt->get_excludes()) out += " (not with " + x->get_name() + ")";
    return out;
  }
};

std::string did_you_mean(std::string_view word, const std::vector<std::string>& names) {
  std::vector<std::string_view> views(names.begin(), names.end());
  std::vector<std::string> close = input::close_matches(word, views);
  return close.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", close.front());
}

// "cluster show": the subcommands a user typed (empty at the top level).
std::string subcommand_path(const CLI::App* app) {
  std::string path;
  for (; app->get_parent(); app = app->get_parent())
    path = path.empty() ? app->get_name() : app->get_name() + " " + path;
  return path;
}

// "pipegrid cluster show", to point at its --help.
std::string command_path(const CLI::App* app) {
  const std::string sub = subcommand_path(app);
  return sub.empty() ? "pipegrid" : "pipegrid " + sub;
}

// " for `pipegrid cluster`", empty for the top level.
std::string for_command(const CLI::App* app) {
  return app->get_parent() ? fmt::format(" for `{}`", command_path(app)) : "";
}

std::vector<std::string> subcommand_names(const CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::App* s : app->get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(s->get_name());
  return names;
}

// CLI11's messages do not say which name was meant; this walks the arguments as CLI11 does
// (subcommands by name, options with or without values) and explains the first word it cannot
// place: an unknown subcommand or an unknown option, with the closest valid name. Empty when every
// word is known (the error is then about a value or a missing argument).
std::string explain_unknown(CLI::App& root, int argc, char** argv, CLI::App*& where) {
  CLI::App* cur = &root;
  where = cur;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() > 1 && arg[0] == '-' && arg != "-") {
      const bool has_value = arg.find('=') != std::string::npos;
      const std::string name = arg.substr(0, arg.find('='));
      if (arg[1] != '-' && arg.size() > 2) continue;  // -p4 and combined short flags: leave to CLI11
      const CLI::Option* opt = nullptr;
      for (CLI::App* a = cur; a && !opt; a = a->get_parent()) opt = a->get_option_no_throw(name);
      if (!opt) {
        std::vector<std::string> names;
        for (const CLI::Option* o : cur->get_options())
          for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
        return fmt::format("unknown option \"{}\"{}{}", name, for_command(cur), did_you_mean(name, names));
      }
      if (!has_value && opt->get_type_size() != 0) ++i;  // the option's value
      continue;
    }
    const std::vector<CLI::App*> named =
        cur->get_subcommands([&](CLI::App* a) { return a->check_name(arg); });
    if (!named.empty()) {
      cur = named.front();
      where = cur;
      continue;
    }
    if (!subcommand_names(cur).empty() &&
        cur->get_options([](const CLI::Option* o) { return o->get_positional(); }).empty())
      return fmt::format("unknown command \"{}\"{}{}; commands: {}", arg, for_command(cur),
                         did_you_mean(arg, subcommand_names(cur)), fmt::join(subcommand_names(cur), ", "));
  }
  if (cur->get_require_subcommand_min() > 0)
    return fmt::format("a command is needed{}: {}", for_command(cur), fmt::join(subcommand_names(cur), ", "));
  return "";
}

}  // namespace
}  // namespace pipegrid::cli

int main(int argc, char** argv) {
  namespace cli = pipegrid::cli;
  CLI::App app{
      "pipegrid: a discrete-event simulator of distributed DNN training (pipeline, data, tensor and expert "
      "parallelism; planners and a 3D search) on GPU and FPGA clusters",
      "pipegrid"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show the help of every subcommand");
  app.set_version_flag("--version", "pipegrid " PIPEGRID_VERSION, "Print the version and exit");
  app.option_defaults()->always_capture_default();  // --help shows every option's default
  app.formatter(std::make_shared<cli::HelpFormatter>());

  // One line per subcommand, in the order `--help` lists them.
  constexpr cli::Command (*kCommands[])(CLI::App&) = {
      &cli::add_run_command,      &cli::add_list_command,    &cli::add_schedule_command,
      &cli::add_workload_command, &cli::add_device_command,  &cli::add_plan_command,
      &cli::add_cluster_command,  &cli::add_sweep_command,   &cli::add_place_command,
      &cli::add_import_command,   &cli::add_export_command,  &cli::add_replay_command,
      &cli::add_search_command,   &cli::add_goodput_command, &cli::add_jobs_command,
  };
  std::vector<cli::Command> commands;
  for (auto add : kCommands) commands.push_back(add(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --help-all, --version
    CLI::App* where = &app;
    std::string message = cli::explain_unknown(app, argc, argv, where);
    if (message.empty())
      message = where == &app ? e.what() : fmt::format("{}: {}", cli::subcommand_path(where), e.what());
    return cli::bad_input(fmt::format("{}; see `{} --help`", message, cli::command_path(where)));
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
