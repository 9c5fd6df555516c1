// pipegrid cluster list | show | bench | export: clusters before training on them.
//   list                        the presets (topologies/clusters/)
//   show FILE|PRESET [--json]   devices, switches, links, diameter, bisection bandwidth
//   bench FILE|PRESET [--op p2p|allreduce] [--sizes 1KiB,1MiB,...] [--json]
//                               a simulated counterpart of nccl-tests: time and bus bandwidth per size
//   export FILE|PRESET --simgrid [-o OUT]   the cluster as a SimGrid platform file
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/collectives.h"
#include "core/units.h"
#include "sim/replay.h"
#include "tools/cli/cli.h"
#include "tools/input/cluster_yaml.h"
#include "tools/output/report.h"
#include "tools/output/run_figures.h"
#include "tools/output/safe_write.h"
#include "tools/output/simgrid_xml.h"
#include "tools/process/isolated_replay.h"

namespace pipegrid::cli {
namespace {

struct Options {
  std::string cluster;
  std::string device;  // for SimGrid hosts without pipegrid properties
  bool json = false;
  // bench
  std::string op = "allreduce";
  std::string algorithm;  // empty: ring
  std::vector<std::string> sizes;
  int devices = 0;
  std::string from, to;
  // export
  bool simgrid = false;
  std::string output;
};

// Bench defaults: nccl-tests' range, a factor of 32 apart; all-reduce over at most this many devices.
const std::vector<std::string> kDefaultSizes = {"1KiB", "32KiB", "1MiB", "32MiB", "1GiB"};
constexpr int kDefaultBenchDevices = 256;

Result<Cluster> load(const Options& o) {
  std::optional<DeviceSpec> device;
  if (!o.device.empty()) {
    Result<DeviceSpec> d = input::catalog_device(o.device);
    if (!d) return Error{fmt::format("--device: {}", d.error().message)};
    device = *d;
  }
  return input::load_cluster(o.cluster, device);
}

std::string duplex_name(Duplex d) {
  return d == Duplex::Full ? "full" : "shared";
}

// --- list -----------------------------------------------------------------------------------

int run_list(const Options& o) {
  nlohmann::json all = nlohmann::json::array();
  if (!o.json) fmt::print("{:<22} {:>7}  {}\n", "preset", "devices", "description");
  for (const input::ClusterPreset& p : input::cluster_presets()) {
    Result<Cluster> c = input::load_cluster(std::string(p.name), std::nullopt);
    if (!c) return bad_input(c.error().message);
    if (o.json)
      all.push_back(
          {{"name", p.name}, {"devices", c->devices.size()}, {"description", preset_description(p.text)}});
    else
      fmt::print("{:<22} {:>7}  {}\n", p.name, c->devices.size(), preset_description(p.text));
  }
  if (o.json)
    std::cout << nlohmann::json{{"schema_version", output::kJsonSchemaVersion}, {"presets", all}}.dump(2)
              << "\n";
  return kOk;
}

// --- show -----------------------------------------------------------------------------------

int run_show(const Options& o) {
  Result<Cluster> c = load(o);
  if (!c) return bad_input(c.error().message);
  Result<ClusterFigures> f = cluster_figures(*c);
  if (!f) return bad_input(fmt::format("{}: {}", o.cluster, f.error().message));
  if (o.json) {
    nlohmann::json j;
    j["schema_version"] = output::kJsonSchemaVersion;
    j["name"] = c->name;
    j["devices"] = nlohmann::json::array();
    for (const Device& d : c->devices) {
      nlohmann::json peak;
      for (Precision p : kMathPrecisions)  // per arithmetic format: "fp8" is also a training precision
        peak[std::string(to_string(p))] = output::json_number(d.spec.peak_flops[static_cast<int>(p)]);
      j["devices"].push_back({{"name", d.name},
                              {"model", d.spec.kind},
                              {"node", d.node},
                              {"memory_bytes", output::json_number(d.spec.memory_bytes)},
                              {"peak_flops", peak}});
    }
    j["switches"] = c->switches;
    j["links"] = nlohmann::json::array();
    for (const Link& l : c->links)
      j["links"].push_back({{"a", c->node_name(l.a)},
                            {"b", c->node_name(l.b)},
                            {"bandwidth_Bps", output::json_number(l.bandwidth)},
                            {"latency_s", l.latency},
                            {"duplex", duplex_name(l.duplex)}});
    j["sharing"] = c->sharing == Sharing::Tcp ? "tcp" : "max-min";
    j["collective_engine"] = output::engine_json(*c);
    j["explicit_routes"] = c->routes.size();
    j["routing"] = !c->torus_dims.empty() ? "dimension-order"
                   : c->fat_tree          ? "destination-mod-k"
                   : c->routes.empty()    ? "shortest-path"
                                          : "explicit";  // shortest paths for pairs without a route
    j["diameter_hops"] = f->diameter_hops;
    j["bisection_bandwidth_Bps"] = output::json_number(f->bisection_bandwidth);
    j["bisection_exact"] = f->bisection_exact;
    j["bisection_candidates"] = f->bisection_candidates;
    std::cout << j.dump(2) << "\n";
    return kOk;
  }
  const auto count = [](size_t n, std::string_view one, std::string_view many) {
    return output::plural(static_cast<double>(n), one, many);
  };
  fmt::print("cluster {}: {}, {}, {}{}\n", c->name.empty() ? o.cluster : c->name,
             count(c->devices.size(), "device", "devices"), count(c->switches.size(), "switch", "switches"),
             count(c->links.size(), "link", "links"),
             c->routes.empty() ? "" : ", " + count(c->routes.size(), "explicit route", "explicit routes"));
  // Devices by kind; a kind whose devices differ (hand-described `custom` ones) says how many specs.
  std::map<std::string, int> models;
  std::map<std::string, std::set<std::pair<double, std::array<double, kPrecisionCount>>>> specs;
  for (const Device& d : c->devices) {
    ++models[d.spec.kind];
    specs[d.spec.kind].insert({d.spec.memory_bytes, d.spec.peak_flops});
  }
  std::string m;
  for (const auto& [k, n] : models)
    m += fmt::format(
        "{}{} x {}{}", m.empty() ? "" : ", ", n, k,
        specs[k].size() > 1 ? fmt::format(" ({} different memories or peaks)", specs[k].size()) : "");
  fmt::print("devices: {}\n", m);
  std::map<std::tuple<double, double, Duplex>, int> kinds;
  for (const Link& l : c->links) ++kinds[{l.bandwidth, l.latency, l.duplex}];
  fmt::print("links:\n");
  for (const auto& [k, n] : kinds)
    fmt::print("  {:>6} x {:>10} {:>9} {}-duplex\n", n, format_bandwidth(std::get<0>(k)),
               format_time(std::get<1>(k)), duplex_name(std::get<2>(k)));
  if (c->devices.size() <= 32) {
    fmt::print("device list:\n");
    for (const Device& d : c->devices)
      fmt::print("  {:<16} {:<8} {}\n", d.name, d.spec.kind, d.node.empty() ? "" : "node " + d.node);
    fmt::print("link list:\n");
    for (const Link& l : c->links)
      fmt::print("  {} -- {}  {}  {}  {}-duplex\n", c->node_name(l.a), c->node_name(l.b),
                 format_bandwidth(l.bandwidth), format_time(l.latency), duplex_name(l.duplex));
  }
  if (const std::string engine = output::engine_note(*c); !engine.empty()) fmt::print("{}\n", engine);
  fmt::print("routing: {}\n",
             !c->torus_dims.empty() ? "dimension order"
             : c->fat_tree
                 ? fmt::format("destination-mod-k on the fat-tree (k = {}; shortest paths inside a machine)",
                               c->fat_tree->k)
             : c->routes.empty() ? std::string("shortest paths (latency, then hops)")
                                 : std::string("the explicit routes, shortest paths (latency, then hops) "
                                               "for pairs without one"));
  fmt::print("diameter: {} hops\n", f->diameter_hops);
  fmt::print("bisection bandwidth: {} ({})\n", format_bandwidth(f->bisection_bandwidth),
             f->bisection_exact ? "exact: every balanced split"
                                : fmt::format("an upper bound: the smallest of {} balanced splits",
                                              f->bisection_candidates));
  return kOk;
}

// --- bench ----------------------------------------------------------------------------------

TaskGraph single_op(const Cluster& c, const Options& o, const std::vector<int>& devices, double bytes,
                    AllReduceAlgorithm algorithm) {
  TaskGraph g;
  g.device_order.resize(c.devices.size());
  g.static_memory.resize(c.devices.size());
  if (o.op == "p2p") {
    Task t;
    t.kind = TaskKind::Transfer;
    t.transfer = TransferKind::Activation;
    t.device = devices[0];
    t.peer = devices[1];
    t.bytes = bytes;
    g.add(t);
  } else {
    append_allreduce(g, algorithm, c, devices, std::vector<int32_t>(devices.size(), -1), bytes);
  }
  return g;
}

// --sizes: whole byte counts of at least one byte, with their units.
Result<std::vector<double>> bench_sizes(const Options& o) {
  std::vector<double> sizes;
  for (const std::string& s : o.sizes.empty() ? kDefaultSizes : o.sizes) {
    Result<double> b = parse_quantity(s, Dimension::Bytes);
    if (!b) return Error{fmt::format("--sizes: {}", b.error().message)};  // a missing or foreign unit
    if (!(*b >= 1) || *b != std::floor(*b))
      return Error{
          fmt::format("--sizes: expected whole byte counts of at least 1 like \"1MiB\", got \"{}\"", s)};
    sizes.push_back(*b);
  }
  return sizes;
}

int run_bench(const Options& o) {
  Result<Cluster> c = load(o);
  if (!c) return bad_input(c.error().message);
  if (Status s = validate(*c); !s) return bad_input(fmt::format("{}: {}", o.cluster, s.error().message));
  Result<std::vector<double>> sizes = bench_sizes(o);
  if (!sizes) return bad_input(sizes.error().message);
  const auto index = c->node_index();
  auto device_named = [&](const std::string& name, const char* option) -> Result<int> {
    auto it = index.find(name);
    if (it == index.end() || !c->is_device(it->second))
      return Error{fmt::format("{}: no device named \"{}\" in {}", option, name, o.cluster)};
    return it->second;
  };
  std::vector<int> devices;
  const std::string algorithm_name = o.algorithm.empty() ? "ring" : o.algorithm;
  const AllReduceAlgorithm algorithm = *parse_allreduce(algorithm_name);
  const int D = static_cast<int>(c->devices.size());
  if (o.op == "p2p") {
    if (D < 2) return bad_input(fmt::format("{}: a point-to-point transfer needs two devices", o.cluster));
    // Options of the all-reduce would be ignored.
    if (!o.algorithm.empty()) return bad_input("--algorithm is for --op allreduce");
    if (o.devices > 0) return bad_input("--devices is for --op allreduce (--op p2p: --from and --to)");
    Result<int> a = o.from.empty() ? Result<int>(0) : device_named(o.from, "--from");
    Result<int> b = o.to.empty() ? Result<int>(1) : device_named(o.to, "--to");
    if (!a) return bad_input(a.error().message);
    if (!b) return bad_input(b.error().message);
    if (*a == *b) return bad_input("--from and --to name the same device");
    devices = {*a, *b};
  } else {
    if (!o.from.empty() || !o.to.empty()) return bad_input("--from and --to are for --op p2p");
    if (algorithm == AllReduceAlgorithm::Nccl && !all_gpus(*c))
      return bad_input(
          fmt::format("--algorithm nccl: {} has devices other than GPUs (nccl is NCCL's pick, a GPU "
                      "library); expected ring, "
                      "hierarchical, multi-ring or tree",
                      o.cluster));
    const int n = o.devices > 0 ? o.devices : std::min(D, kDefaultBenchDevices);
    if (n > D)
      return bad_input(
          fmt::format("cluster bench: --devices: expected at most the cluster's {} devices, got {}", D, n));
    if (n < 2)
      return bad_input(fmt::format(
          "cluster bench: {}: an all-reduce over {} device moves nothing (no time, no bandwidth); expected "
          "at least 2",
          o.devices > 0 ? "--devices" : o.cluster, n));
    for (int i = 0; i < n; ++i) devices.push_back(i);
  }
  const int n = static_cast<int>(devices.size());
  // nccl-tests' bus bandwidth: algorithm bandwidth (bytes / time) x what one device of a ring
  // sends per byte reduced (ring_flow_bytes: 2 (n - 1) / n for an all-reduce).
  const double bus_factor = o.op == "p2p" ? 1.0 : ring_flow_bytes(CollectiveKind::AllReduce, 1.0, n);
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json) {
    if (o.op == "p2p")
      fmt::print("p2p {} -> {} on {}\n", c->devices[devices[0]].name, c->devices[devices[1]].name, o.cluster);
    else
      fmt::print("all-reduce ({}) over {} of {} devices of {}\n", algorithm_name, n, D, o.cluster);
    fmt::print("{:>12} {:>12} {:>14} {:>14}{}\n", "bytes", "time", "algbw", "busbw",
               algorithm == AllReduceAlgorithm::Nccl ? "  runs" : "");
  }
  std::unique_ptr<Router> router;
  for (double bytes : *sizes) {
    // `nccl`: the algorithm NCCL's model picks at this size, said in each row.
    AllReduceAlgorithm runs = algorithm;
    if (o.op != "p2p" && algorithm == AllReduceAlgorithm::Nccl) {
      if (!router) router = std::make_unique<Router>(*c);
      runs = resolve_allreduce(algorithm, CollectiveKind::AllReduce, *c, *router, devices, bytes);
    }
    Result<sim::Replay> r = process::replay_isolated(*c, single_op(*c, o, devices, bytes, runs));
    if (!r) return bad_input(fmt::format("{}: {}", o.cluster, r.error().message));
    const double t = r->timeline.makespan();
    const double bus = t > 0 ? bytes / t * bus_factor : 0;
    const bool picked = algorithm == AllReduceAlgorithm::Nccl && o.op != "p2p";
    if (o.json) {
      rows.push_back(
          {{"op", o.op}, {"bytes", output::json_number(bytes)}, {"time_s", t}, {"bus_bandwidth_Bps", bus}});
      if (picked) rows.back()["algorithm"] = std::string(to_string(runs));
    } else {
      fmt::print("{:>12} {:>12} {:>14} {:>14}{}\n", format_bytes(bytes), format_time(t),
                 format_bandwidth(t > 0 ? bytes / t : 0), format_bandwidth(bus),
                 picked ? fmt::format("  {}", to_string(runs)) : "");
    }
  }
  if (o.json)
    std::cout << nlohmann::json{{"schema_version", output::kJsonSchemaVersion}, {"results", rows}}.dump(2)
              << "\n";
  return kOk;
}

// --- export ---------------------------------------------------------------------------------

int run_export(const Options& o) {
  if (!o.simgrid) return bad_input("cluster export: choose a format (--simgrid)");
  if (Status s = output::check_distinct_outputs({{"-o", o.output}}, {{"the cluster file", o.cluster}}); !s)
    return bad_input(s.error().message);
  Result<Cluster> c = load(o);
  if (!c) return bad_input(c.error().message);
  if (c->engine)
    fmt::print(stderr,
               "note: a SimGrid platform has no place for the collective engine ({}): give the cluster's "
               "`collective_engine` beside `file:` when reading it back\n",
               c->engine->name);
  if (c->sharing == Sharing::Tcp)
    fmt::print(stderr,
               "note: a SimGrid platform keeps no sharing rule (this cluster's is tcp): give `sharing: tcp` "
               "beside `file:` when reading it back\n");
  if (o.output.empty()) {
    if (Status s = output::write_simgrid_xml(*c, std::cout); !s)
      return bad_input(fmt::format("{}: {}", o.cluster, s.error().message));
    return kOk;
  }
  std::ostringstream out;
  if (Status s = output::write_simgrid_xml(*c, out); !s)
    return bad_input(fmt::format("{}: {}", o.cluster, s.error().message));
  if (Status s = output::write_file_safely(o.output, out.str()); !s) return bad_input(s.error().message);
  return kOk;
}

}  // namespace

std::string preset_description(std::string_view text) {
  if (text.rfind("# ", 0) != 0) return "";
  return std::string(text.substr(2, text.find('\n') - 2));
}

Command add_cluster_command(CLI::App& parent) {
  auto o = std::make_shared<Options>();
  CLI::App* app = parent.add_subcommand(
      "cluster",
      "Clusters: `pipegrid cluster list`, `show FILE|PRESET`, `bench FILE|PRESET`, `export FILE|PRESET`");
  app->require_subcommand(1);
  CLI::App* list = app->add_subcommand("list", "List the cluster presets");
  list->add_flag("--json", o->json,
                 "Print one JSON object: schema_version, presets (name, devices, description)");
  CLI::App* show =
      app->add_subcommand("show", "Devices, links, diameter and bisection bandwidth of a cluster");
  CLI::App* bench =
      app->add_subcommand("bench", "Simulated nccl-tests: time and bus bandwidth per message size");
  CLI::App* exp = app->add_subcommand("export", "Write a cluster as a SimGrid platform file");
  for (CLI::App* sub : {show, bench, exp}) {
    sub->add_option("cluster", o->cluster, "Cluster file (YAML, or SimGrid .xml) or preset name")->required();
    sub->add_option("--device", o->device, "Catalog device for SimGrid hosts without pipegrid properties");
  }
  show->add_flag("--json", o->json, "Print one JSON object");
  bench->add_option("--op", o->op, "p2p or allreduce (default)")->check(CLI::IsMember({"p2p", "allreduce"}));
  bench
      ->add_option(
          "--algorithm", o->algorithm,
          "All-reduce: ring (default), hierarchical, multi-ring, tree or nccl (NCCL's pick per size)")
      ->default_str("ring")
      ->check(CLI::IsMember({"ring", "hierarchical", "multi-ring", "tree", "nccl"}));
  bench->add_option("--sizes", o->sizes, "Message sizes (default 1KiB,32KiB,1MiB,32MiB,1GiB)")
      ->delimiter(',');
  bench
      ->add_option("--devices", o->devices,
                   "All-reduce among the first N devices (default: all of them, up to 256)")
      ->check(kPositiveCount);
  bench->add_option("--from", o->from, "p2p: sending device (default the first)");
  bench->add_option("--to", o->to, "p2p: receiving device (default the second)");
  bench->add_flag(
      "--json", o->json,
      "Print one JSON object: schema_version, results (each {op, bytes, time_s, bus_bandwidth_Bps})");
  exp->add_flag("--simgrid", o->simgrid, "SimGrid platform XML (routing Full, pipegrid's routes)");
  exp->add_option("-o,--output", o->output, "Write to this file (default: standard output)");
  return {app, [o, list, show, bench]() -> int {
            if (*list) return run_list(*o);
            if (*show) return run_show(*o);
            if (*bench) return run_bench(*o);
            return run_export(*o);
          }};
}

}  // namespace pipegrid::cli
