// pipegrid list [SECTION]: what an experiment can name, one line each. The plug-ins (partitioners,
// schedules, planners, with their descriptions), the model zoo (with its parameters and their
// defaults), the cluster presets (with their device counts) and the device catalog.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>

#include "core/models/zoo.h"
#include "core/planner.h"
#include "core/strategy.h"
#include "tools/cli/cli.h"
#include "tools/input/cluster_yaml.h"
#include "tools/input/device_yaml.h"
#include "tools/input/yaml_node.h"

namespace pipegrid::cli {
namespace {

int print_strategies(const auto& table) {
  for (const auto& s : table) fmt::print("  {:<20} {}\n", s.name, s.description);
  return kOk;
}

int print_models() {
  for (const ModelInfo& m : model_zoo()) {
    std::string args;
    for (const auto& [name, value] : m.defaults)
      args += fmt::format("{}{} {}", args.empty() ? "" : ", ", name, value);
    fmt::print("  {:<20} {} ({})\n", m.name, m.description, args);
  }
  return kOk;
}

int print_presets() {
  for (const input::ClusterPreset& p : input::cluster_presets()) {
    Result<Cluster> c = input::load_cluster(std::string(p.name), std::nullopt);
    if (!c) return bad_input(c.error().message);
    fmt::print("  {:<20} {:>6} devices  {}\n", p.name, c->devices.size(), preset_description(p.text));
  }
  return kOk;
}

int print_devices() {
  for (const input::CatalogDevice& d : input::device_catalog())
    fmt::print("  {:<20} {:<5} {}\n", d.name, d.family, d.description);
  return kOk;
}

struct Section {
  std::string_view name;
  int (*print)();
};

// In the order `pipegrid list` prints them.
constexpr Section kSections[] = {
    {"partitioners", [] { return print_strategies(partition_strategies()); }},
    {"schedules", [] { return print_strategies(schedule_strategies()); }},
    {"planners", [] { return print_strategies(planners()); }},
    {"models", &print_models},
    {"presets", &print_presets},
    {"devices", &print_devices},
};

int run(const std::string& only) {
  std::vector<std::string_view> names;
  for (const Section& s : kSections) names.push_back(s.name);
  if (!only.empty()) {
    for (const Section& s : kSections)
      if (s.name == only) return s.print();
    std::vector<std::string> close = input::close_matches(only, names);
    return bad_input(fmt::format("list: unknown section \"{}\"{}; sections: {}", only,
                                 close.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", close.front()),
                                 fmt::join(names, ", ")));
  }
  for (const Section& s : kSections) {
    fmt::print("{}:\n", s.name);
    if (int rc = s.print(); rc != kOk) return rc;
  }
  return kOk;
}

}  // namespace

Command add_list_command(CLI::App& parent) {
  auto section = std::make_shared<std::string>();
  CLI::App* app = parent.add_subcommand(
      "list",
      "List what an experiment can name: partitioners, schedules, planners, models, presets, devices");
  app->add_option("section", *section,
                  "Print one section: partitioners, schedules, planners, models, presets or devices");
  return {app, [section] { return run(*section); }};
}

}  // namespace pipegrid::cli
