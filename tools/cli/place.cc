// pipegrid place MODEL|FILE --backends CATALOG [--device KIND] [--use a,b] [--micro-batch-size N]
//                 [--precision P] [--json]
// Backend placement (core/backends.h): which backend runs each layer, the fused groups, the layers'
// times and conversions, and the total against each single backend (with the catalog's fallbacks).
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/backends.h"
#include "core/models/zoo.h"
#include "core/units.h"
#include "tools/cli/cli.h"
#include "tools/input/backends_yaml.h"
#include "tools/input/device_yaml.h"
#include "tools/input/model_yaml.h"
#include "tools/output/report.h"

namespace pipegrid::cli {
namespace {

struct PlaceOptions {
  std::string what;
  std::string catalog;
  std::string device;
  std::vector<std::string> use;
  double micro_batch_size = 0;
  std::string precision;
  bool json = false;
};

// A backend that implements every layer ("*"): the fallback a single-backend baseline keeps.
bool covers_all(const Backend& b) {
  return std::any_of(b.patterns.begin(), b.patterns.end(), [](const BackendPattern& p) {
    return p.ops.size() == 1 && p.ops[0].kind == PatternOp::Kind::Any;
  });
}

int run(const PlaceOptions& o) {
  std::optional<Precision> precision;
  if (!o.precision.empty()) {
    precision = parse_precision(o.precision);
    if (!precision)
      return bad_input(fmt::format("--precision: expected {}, got \"{}\"", precision_choices(), o.precision));
  }
  Result<Workload> w = Error{};
  if (Result<const ModelInfo*> m = find_model(o.what); m)
    w = build_model(**m, {}, precision.value_or(Precision::FP32));
  else if (o.what.find('.') == std::string::npos && o.what.find('/') == std::string::npos)
    w = m.error();
  else
    w = input::load_model_file(o.what, precision);
  if (!w) return bad_input(w.error().message);
  auto catalog = input::load_backend_catalog_file(o.catalog);
  if (!catalog) return bad_input(catalog.error().message);
  const BackendCatalog& c = *catalog;
  std::string kind = o.device;
  if (kind.empty()) kind = c.backends.front().device_kind;
  const input::CatalogDevice* d = input::find_catalog_device(kind);
  if (!d) return bad_input(fmt::format("--device: unknown device \"{}\" (`pipegrid device list`)", kind));
  PlacementOptions po;
  po.batch = o.micro_batch_size > 0 ? o.micro_batch_size : w->micro_batch_size;
  for (const std::string& u : o.use) {
    auto it =
        std::find_if(c.backends.begin(), c.backends.end(), [&](const Backend& b) { return b.name == u; });
    if (it == c.backends.end()) return bad_input(fmt::format("--use: no backend \"{}\" in {}", u, o.catalog));
    po.allowed.push_back(static_cast<int>(it - c.backends.begin()));
  }
  auto p = place(*w, c, d->spec, po);
  if (!p) return bad_input(fmt::format("{}: {}", o.catalog, p.error().message));

  // Each backend alone; one that does not implement every layer keeps the fallback: the catalog's
  // first backend of this device kind that does.
  int fallback = -1;
  for (size_t f = 0; f < c.backends.size() && fallback < 0; ++f)
    if (runs_on(c.backends[f], kind) && covers_all(c.backends[f])) fallback = static_cast<int>(f);
  nlohmann::json single = nlohmann::json::object();
  for (size_t b = 0; b < c.backends.size(); ++b) {
    if (!runs_on(c.backends[b], kind)) continue;
    PlacementOptions so = po;
    so.allowed = {static_cast<int>(b)};
    if (!covers_all(c.backends[b]) && fallback >= 0) so.allowed.push_back(fallback);
    auto s = place(*w, c, d->spec, so);
    single[c.backends[b].name] = s ? nlohmann::json(s->total_s()) : nlohmann::json(nullptr);
  }
  std::vector<int> group_of(w->layer_count(), -1);
  for (size_t g = 0; g < p->groups.size(); ++g)
    for (int l : p->groups[g].layers) group_of[l] = static_cast<int>(g);

  if (o.json) {
    nlohmann::json layers = nlohmann::json::array();
    for (size_t v = 0; v < w->layer_count(); ++v)
      layers.push_back({{"name", w->layer(v).name},
                        {"kind", w->layer(v).kind},
                        {"backend", c.backends[p->backend_of[v]].name},
                        {"group", group_of[v]},
                        {"forward_s", p->layer_times[v].forward},
                        {"backward_s", p->layer_times[v].backward()}});
    nlohmann::json j = {{"schema_version", output::kJsonSchemaVersion},
                        {"model", w->name},
                        {"device", kind},
                        {"micro_batch_size", output::json_number(po.batch)},
                        {"total_s", p->total_s()},
                        {"compute_s", p->compute_s},
                        {"conversion_s", p->conversion_s},
                        {"exact", p->exact},
                        {"states", p->states},
                        {"layers", layers},
                        {"single_backend_s", single}};
    std::cout << j.dump(1) << "\n";
    return kOk;
  }
  fmt::print("{} on {} ({} per micro-batch): {} placed in {}\n\n", w->name, kind,
             output::plural(po.batch, "sample", "samples"), w->layer_count(),
             output::plural(static_cast<double>(p->groups.size()), "group", "groups"));
  size_t width = 5;
  for (size_t v = 0; v < w->layer_count(); ++v) width = std::max(width, w->layer(v).name.size());
  fmt::print("{:<{}}  {:<18} {:<12} {:>6} {:>12} {:>12}\n", "layer", width, "kind", "backend", "group",
             "forward", "backward");
  for (size_t v = 0; v < w->layer_count(); ++v)
    fmt::print("{:<{}}  {:<18} {:<12} {:>6} {:>12} {:>12}\n", w->layer(v).name, width, w->layer(v).kind,
               c.backends[p->backend_of[v]].name, group_of[v], format_time(p->layer_times[v].forward),
               format_time(p->layer_times[v].backward()));
  fmt::print("\nforward + backward: {} ({} layers, {} conversions){}\n", format_time(p->total_s()),
             format_time(p->compute_s), format_time(p->conversion_s),
             p->exact ? "" : " (beam: not proven optimal)");
  for (const auto& item : single.items()) {
    const std::string name = item.key();
    const nlohmann::json& t = item.value();
    const auto b =
        std::find_if(c.backends.begin(), c.backends.end(), [&](const Backend& x) { return x.name == name; });
    const std::string with = fallback >= 0 && !covers_all(*b)
                                 ? fmt::format(" (+ {} where it has no pattern)", c.backends[fallback].name)
                                 : "";
    fmt::print("  {} alone{}: {}\n", name, with,
               t.is_null() ? std::string("cannot run every layer")
                           : fmt::format("{} ({:.3f}x the placement)", format_time(t.get<double>()),
                                         t.get<double>() / p->total_s()));
  }
  return kOk;
}

}  // namespace

Command add_place_command(CLI::App& parent) {
  auto o = std::make_shared<PlaceOptions>();
  CLI::App* app = parent.add_subcommand(
      "place", "Place a model's layers on a device's backends (Collage-style) and compare single backends");
  app->add_option("model", o->what, "Zoo model name or model file (YAML)")->required()->check(kNonEmpty);
  app->add_option("--backends", o->catalog, "Backend catalog (YAML), e.g. topologies/backends/a100.yaml")
      ->required()
      ->check(kNonEmpty);
  app->add_option("--device", o->device, "Device kind (default: the first backend's)");
  app->add_option("--use", o->use, "Only these backends")->delimiter(',');
  app->add_option("--micro-batch-size", o->micro_batch_size, "Samples per micro-batch (default: the model's)")
      ->check(kSampleCount);
  app->add_option("--precision", o->precision, "Training precision (default fp32)");
  app->add_flag("--json", o->json, "Print one JSON object");
  return {app, [o] { return run(*o); }};
}

}  // namespace pipegrid::cli
