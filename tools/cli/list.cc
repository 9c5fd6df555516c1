// pipegrid list [SECTION]: what an experiment can name, one line each. The plug-ins (partitioners,
// schedules, planners, with their descriptions), the model zoo (with its parameters and their
// defaults), the cluster presets (with their device counts) and the device catalog.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/models/zoo.h"
#include "core/planner.h"
#include "core/strategy.h"
#include "tools/builtin_backend_catalogs.h"
#include "tools/cli/cli.h"
#include "tools/input/cluster_yaml.h"
#include "tools/input/device_yaml.h"
#include "tools/input/yaml_node.h"
#include "tools/output/report.h"

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

int print_preset_aliases() {
  for (const input::PresetAlias& a : input::preset_aliases())
    fmt::print("  {:<20} reads {}\n", a.old_name, a.name);
  return kOk;
}

// A backend catalog as `list` shows it: its file, description and backends (from the compiled-in text).
struct CatalogInfo {
  std::string path, description;
  std::vector<std::string> backends;
};

CatalogInfo catalog_info(const BuiltinBackendCatalog& c) {
  const YAML::Node n = YAML::Load(std::string(c.text));
  CatalogInfo info{
      fmt::format("topologies/backends/{}.yaml", c.name), n["description"].as<std::string>(""), {}};
  for (const auto& b : n["backends"]) info.backends.push_back(b.first.as<std::string>());
  return info;
}

int print_backends() {
  for (const BuiltinBackendCatalog& c : kBuiltinBackendCatalogs) {
    const CatalogInfo i = catalog_info(c);
    fmt::print("  {:<20} {} ({}; backends: {})\n", c.name, i.description, i.path,
               fmt::join(i.backends, ", "));
  }
  return kOk;
}

nlohmann::json backends_json() {
  nlohmann::json out = nlohmann::json::array();
  for (const BuiltinBackendCatalog& c : kBuiltinBackendCatalogs) {
    const CatalogInfo i = catalog_info(c);
    out.push_back(
        {{"name", c.name}, {"file", i.path}, {"description", i.description}, {"backends", i.backends}});
  }
  return out;
}

int print_devices() {
  for (const input::CatalogDevice& d : input::device_catalog())
    fmt::print("  {:<20} {:<5} {}\n", d.name, d.family, d.description);
  return kOk;
}

nlohmann::json strategies_json(const auto& table) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : table) out.push_back({{"name", s.name}, {"description", s.description}});
  return out;
}

nlohmann::json models_json() {
  nlohmann::json out = nlohmann::json::array();
  for (const ModelInfo& m : model_zoo()) {
    nlohmann::json params = nlohmann::json::object();
    for (const auto& [name, value] : m.defaults) params[std::string(name)] = output::json_number(value);
    out.push_back({{"name", m.name}, {"description", m.description}, {"parameters", params}});
  }
  return out;
}

nlohmann::json presets_json() {
  nlohmann::json out = nlohmann::json::array();
  for (const input::ClusterPreset& p : input::cluster_presets()) {
    Result<Cluster> c = input::load_cluster(std::string(p.name), std::nullopt);
    if (!c) throw std::runtime_error(c.error().message);
    out.push_back(
        {{"name", p.name}, {"devices", c->devices.size()}, {"description", preset_description(p.text)}});
  }
  return out;
}

nlohmann::json preset_aliases_json() {
  nlohmann::json out = nlohmann::json::array();
  for (const input::PresetAlias& a : input::preset_aliases())
    out.push_back({{"old_name", a.old_name}, {"name", a.name}});
  return out;
}

nlohmann::json devices_json() {
  nlohmann::json out = nlohmann::json::array();
  for (const input::CatalogDevice& d : input::device_catalog())
    out.push_back({{"name", d.name}, {"family", d.family}, {"description", d.description}});
  return out;
}

struct Section {
  std::string_view name;
  int (*print)();
  nlohmann::json (*json)();
};

// In the order `pipegrid list` prints them.
constexpr Section kSections[] = {
    {"partitioners", [] { return print_strategies(partition_strategies()); },
     [] { return strategies_json(partition_strategies()); }},
    {"schedules", [] { return print_strategies(schedule_strategies()); },
     [] { return strategies_json(schedule_strategies()); }},
    {"planners", [] { return print_strategies(planners()); }, [] { return strategies_json(planners()); }},
    {"models", &print_models, &models_json},
    {"presets", &print_presets, &presets_json},
    {"preset_aliases", &print_preset_aliases, &preset_aliases_json},
    {"devices", &print_devices, &devices_json},
    {"backends", &print_backends, &backends_json},
};

int run_json(const std::string& only) {
  nlohmann::json j = {{"schema_version", output::kJsonSchemaVersion}};
  try {
    for (const Section& s : kSections)
      if (only.empty() || s.name == only) j[std::string(s.name)] = s.json();
  } catch (const std::runtime_error& e) {
    return bad_input(e.what());
  }
  fmt::print("{}\n", j.dump(2));
  return kOk;
}

int run(const std::string& only, bool json) {
  std::vector<std::string_view> names;
  for (const Section& s : kSections) names.push_back(s.name);
  if (!only.empty()) {
    for (const Section& s : kSections)
      if (s.name == only) return json ? run_json(only) : s.print();
    std::vector<std::string> close = input::close_matches(only, names);
    return bad_input(fmt::format("list: unknown section \"{}\"{}; sections: {}", only,
                                 close.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", close.front()),
                                 fmt::join(names, ", ")));
  }
  if (json) return run_json(only);
  for (const Section& s : kSections) {
    fmt::print("{}:\n", s.name);
    if (int rc = s.print(); rc != kOk) return rc;
  }
  return kOk;
}

}  // namespace

Command add_list_command(CLI::App& parent) {
  auto section = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  CLI::App* app = parent.add_subcommand(
      "list",
      "List what an experiment can name: partitioners, schedules, planners, models, presets (and their older "
      "names), devices, backend catalogs");
  app->add_option(
      "section", *section,
      "Print one section: partitioners, schedules, planners, models, presets, preset_aliases, devices or "
      "backends");
  app->add_flag("--json", *json, "Print one JSON object: schema_version and a list per section");
  return {app, [section, json] { return run(*section, *json); }};
}

}  // namespace pipegrid::cli
