#include "tools/input/cluster_yaml.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "core/file_io.h"
#include "core/topologies/generators.h"
#include "tools/builtin_cluster_presets.h"
#include "tools/builtin_engines.h"
#include "tools/input/device_yaml.h"
#include "tools/input/simgrid_xml.h"

namespace pipegrid::input {
namespace {

const std::vector<std::string_view> kClusterKinds = {"switch", "ring", "torus",  "fat-tree",  "dragonfly",
                                                     "dgx",    "dgx1", "summit", "fpga-ring", "fpga-torus"};

int count_of(const Node& n, std::string_view key) {
  return static_cast<int>(n.need(key, "a positive integer").integer(1, kMaxCount, "a positive integer"));
}

double bandwidth_of(const Node& n, std::string_view key) {
  return n.need(key, describe(Dimension::Bandwidth, "positive"))
      .quantity(Dimension::Bandwidth, Sign::Positive);
}

double latency_of(const Node& n, std::string_view key) {
  return n.need(key, describe(Dimension::Time, "non-negative")).quantity(Dimension::Time, Sign::NonNegative);
}

// `bandwidth` and `latency` of a generator (both required).
LinkSpec link_keys(const Node& n) {
  return {bandwidth_of(n, "bandwidth"), latency_of(n, "latency")};
}

// An optional mapping {bandwidth, latency} overriding `defaults`.
LinkSpec link_override(const Node& parent, std::string_view key, LinkSpec defaults,
                       std::vector<std::string_view> extra = {}) {
  std::optional<Node> n = parent.get(key);
  if (!n) return defaults;
  n->require_map("a mapping like {bandwidth: 25GBps, latency: 1us}");
  extra.insert(extra.begin(), {"bandwidth", "latency"});
  n->check_keys(extra);
  if (n->has("bandwidth")) defaults.bandwidth = bandwidth_of(*n, "bandwidth");
  if (n->has("latency")) defaults.latency = latency_of(*n, "latency");
  return defaults;
}

// `device: {name: gpu, ...spec}`: the name prefix and the spec.
std::pair<std::string, DeviceSpec> named_device(const Node& n) {
  Node dev = n.need("device", "a mapping with the device's name and memory");
  dev.require_map("a mapping with the device's name and memory");
  std::string name = dev.need("name", "a device name").string("a device name");
  return {name, parse_device_spec(dev, {"name"})};
}

// A catalog name or spec mapping (no name), with a default catalog entry.
DeviceSpec device_or(const Node& n, std::string_view key, std::string_view fallback) {
  if (std::optional<Node> d = n.get(key)) return parse_device_spec(*d);
  return find_catalog_device(fallback)->spec;
}

std::vector<int> dims_of(const Node& n, size_t min, size_t max) {
  const std::string what = fmt::format("a list of {} to {} positive sizes like [4, 4]", min, max);
  Node d = n.need("dims", what);
  std::vector<Node> items = d.items(what);
  if (items.size() < min || items.size() > max) d.expected(what);
  std::vector<int> dims;
  for (const Node& i : items) dims.push_back(static_cast<int>(i.integer(1, 1'000'000, "a positive size")));
  return dims;
}

Cluster generated(Result<Cluster> c, const Node& n) {
  if (!c) n.fail(c.error().message);
  return std::move(*c);
}

// `kind: dgx`: DGX-style nodes and their InfiniBand fabric, with pods of a rail fabric.
Cluster parse_dgx(const Node& n) {
  n.check_keys({"kind", "name", "nodes", "gpus_per_node", "gpu", "nvlink", "infiniband", "fabric",
                "pod_nodes", "oversubscription", "sharing", "collective_engine"});
  DgxSpec s;
  s.nodes = count_of(n, "nodes");
  if (n.has("gpus_per_node")) s.gpus_per_node = count_of(n, "gpus_per_node");
  s.gpu = device_or(n, "gpu", "a100");
  s.nvlink = link_override(n, "nvlink", s.nvlink);
  s.infiniband = link_override(n, "infiniband", s.infiniband);
  if (std::optional<Node> f = n.get("fabric")) {
    const std::string fabric = f->choice({"switch", "fat-tree", "rail"}, "a fabric");
    s.fabric = fabric == "switch"     ? DgxSpec::Fabric::Switch
               : fabric == "fat-tree" ? DgxSpec::Fabric::FatTree
                                      : DgxSpec::Fabric::Rail;
  }
  // Pods of a rail fabric (core/topologies/generators.h): nodes per pod, and the uplinks' 1:r.
  std::optional<Node> pods = n.get("pod_nodes");
  if (pods) s.pod_nodes = count_of(n, "pod_nodes");
  if (std::optional<Node> r = n.get("oversubscription")) {
    if (!pods) r->fail("expected pod_nodes beside it (the oversubscription is between pods), got none");
    s.oversubscription = r->number("an oversubscription ratio >= 1 (7 for 1:7)");
    if (!(s.oversubscription >= 1)) r->expected("an oversubscription ratio >= 1 (7 for 1:7)");
  }
  if (pods && s.fabric != DgxSpec::Fabric::Rail)
    pods->fail("expected fabric: rail beside it (pods are built of rails), got another fabric");
  // One pod holding every node has no uplink between pods to oversubscribe.
  if (s.pod_nodes >= s.nodes && s.oversubscription > 1)
    (pods ? *pods : n.get("nodes").value_or(n))
        .fail(
            fmt::format("one pod of {} nodes holds all {} nodes, so the 1:{:g} oversubscription between pods "
                        "would change nothing; expected pod_nodes below nodes",
                        s.pod_nodes, s.nodes, s.oversubscription));
  return generated(make_dgx_cluster(s), n);
}

Cluster parse_generator(const Node& n, const std::string& kind) {
  if (kind == "switch" || kind == "ring") {
    n.check_keys({"kind", "name", "count", "device", "bandwidth", "latency", "sharing", "collective_engine"});
    const int count = count_of(n, "count");
    auto [name, spec] = named_device(n);
    const LinkSpec l = link_keys(n);
    if (kind == "switch") {
      if (Status st = check_cluster_size("a switch cluster", count, 1, count); !st)
        n.fail(st.error().message);
      return make_switch_cluster(count, name, spec, l.bandwidth, l.latency);
    }
    return generated(make_ring_cluster(count, name, spec, l), n);
  }
  if (kind == "torus") {
    n.check_keys({"kind", "name", "dims", "device", "bandwidth", "latency", "sharing", "collective_engine"});
    const std::vector<int> dims = dims_of(n, 1, 3);
    auto [name, spec] = named_device(n);
    return generated(make_torus_cluster(dims, name, spec, link_keys(n)), n);
  }
  if (kind == "fat-tree") {
    n.check_keys(
        {"kind", "name", "k", "count", "device", "bandwidth", "latency", "sharing", "collective_engine"});
    Node kn = n.need("k", "an even switch port count from 2 to 128");
    const int k = static_cast<int>(kn.integer(2, 128, "an even switch port count from 2 to 128"));
    if (k % 2 != 0) kn.expected("an even switch port count from 2 to 128");
    int count = k * k * k / 4;
    if (std::optional<Node> c = n.get("count")) {
      const std::string what = fmt::format("a device count from 1 to {} (k^3/4)", count);
      count = static_cast<int>(c->integer(1, count, what));
    }
    auto [name, spec] = named_device(n);
    return generated(make_fat_tree_cluster(k, count, name, spec, link_keys(n)), n);
  }
  if (kind == "dragonfly") {
    n.check_keys({"kind", "name", "groups", "routers", "hosts", "global_links", "device", "bandwidth",
                  "latency", "global", "sharing", "collective_engine"});
    DragonflySpec s;
    s.groups = count_of(n, "groups");
    s.routers = count_of(n, "routers");
    s.hosts = count_of(n, "hosts");
    s.global = (s.groups - 1 + s.routers - 1) / s.routers;
    if (std::optional<Node> g = n.get("global_links"))
      s.global = static_cast<int>(g->integer(1, kMaxCount, "a positive integer"));
    std::tie(s.prefix, s.device) = named_device(n);
    s.host_link = s.local_link = link_keys(n);
    s.global_link = link_override(n, "global", s.local_link);
    return generated(make_dragonfly_cluster(s), n);
  }
  if (kind == "dgx") return parse_dgx(n);
  if (kind == "dgx1") {
    n.check_keys({"kind", "name", "servers", "server_kinds", "gpu", "nvlink2", "nvlink1", "pcie", "qpi",
                  "network", "nics", "nvlink_forwarding", "sharing", "collective_engine"});
    Dgx1Spec s;
    s.servers = count_of(n, "servers");
    if (std::optional<Node> k = n.get("server_kinds")) {
      const std::string what = "a list of server kinds (nvlink2, nvlink1, pcie) like [nvlink2, pcie]";
      s.kinds.clear();
      for (const Node& i : k->items(what)) {
        const std::string v = i.choice({"nvlink2", "nvlink1", "pcie"}, "a server kind");
        s.kinds.push_back(v == "nvlink2"   ? Dgx1Spec::Kind::NvLink2
                          : v == "nvlink1" ? Dgx1Spec::Kind::NvLink1
                                           : Dgx1Spec::Kind::Pcie);
      }
      if (s.kinds.empty()) k->expected(what);
      if (s.kinds.size() > static_cast<size_t>(s.servers))
        k->fail(
            fmt::format("expected at most one kind per server ({} servers; the last kind repeats for the "
                        "servers after the list), got {}: the rest would be ignored",
                        s.servers, s.kinds.size()));
    }
    s.gpu = device_or(n, "gpu", "v100");
    s.nvlink2 = link_override(n, "nvlink2", s.nvlink2);
    s.nvlink1 = link_override(n, "nvlink1", s.nvlink1);
    s.pcie = link_override(n, "pcie", s.pcie);
    s.qpi = link_override(n, "qpi", s.qpi);
    s.network = link_override(n, "network", s.network);
    if (std::optional<Node> k = n.get("nics")) {
      s.nics = static_cast<int>(k->integer(1, 4, "1, 2 or 4 NICs per server"));
      if (s.nics == 3) k->expected("1, 2 or 4 NICs per server");
    }
    if (std::optional<Node> f = n.get("nvlink_forwarding")) s.nvlink_forwarding = f->boolean();
    return generated(make_dgx1_cluster(s), n);
  }
  if (kind == "summit") {
    n.check_keys(
        {"kind", "name", "nodes", "gpu", "nvlink", "xbus", "infiniband", "sharing", "collective_engine"});
    SummitSpec s;
    s.nodes = count_of(n, "nodes");
    s.gpu = device_or(n, "gpu", "v100");
    s.nvlink = link_override(n, "nvlink", s.nvlink);
    s.xbus = link_override(n, "xbus", s.xbus);
    s.infiniband = link_override(n, "infiniband", s.infiniband);
    return generated(make_summit_cluster(s), n);
  }
  // fpga-ring, fpga-torus
  const bool torus = kind == "fpga-torus";
  n.check_keys(
      {"kind", "name", torus ? "dims" : "count", "device", "qsfp", "pcie", "sharing", "collective_engine"});
  FpgaClusterSpec s;
  s.torus = torus;
  s.dims = torus ? dims_of(n, 2, 3) : std::vector<int>{count_of(n, "count")};
  s.device = parse_device_spec(n.need("device", "an FPGA: a catalog name like \"u280\" or a mapping"));
  s.qsfp = link_override(n, "qsfp", s.qsfp);
  if (std::optional<Node> p = n.get("pcie")) {
    s.pcie = true;
    s.pcie_link = link_override(n, "pcie", s.pcie_link, {"per_host"});
    if (std::optional<Node> ph = p->get("per_host"))
      s.per_host = static_cast<int>(ph->integer(1, kMaxCount, "a positive integer"));
  }
  return generated(make_fpga_cluster(s), n);
}

// --- clusters written out -------------------------------------------------------------------

// Unknown node names are errors that list close names.
int node_named(const Node& n, const std::unordered_map<std::string, int>& index, const Cluster& c) {
  const std::string name = n.string("a node name");
  auto it = index.find(name);
  if (it != index.end()) return it->second;
  std::vector<std::string_view> names;
  names.reserve(c.node_count());
  for (size_t i = 0; i < c.node_count(); ++i) names.push_back(c.node_name(static_cast<int>(i)));
  std::vector<std::string> close = close_matches(name, names);
  if (close.size() > 5) close.resize(5);
  std::vector<std::string_view> shown(close.begin(), close.end());
  n.fail(fmt::format("unknown node \"{}\" ({})", name,
                     close.empty() ? "no device or switch has a close name" : "close names: " + join(shown)));
}

// Names of one entry of `devices` or `switches`: `name`, or name0 .. name<count-1> with `count`.
// `room`: how many more the cluster may hold (the limits of check_cluster_size): `limit` `of`.
std::vector<std::string> entry_names(const Node& item, double room, double limit, std::string_view of) {
  auto too_many = [&](const Node& where, double n) {
    where.fail(
        fmt::format("{:.0f} more would make the cluster larger than pipegrid's limit of {:.0f} {} "
                    "(see docs/limits.md)",
                    n, limit, of));
  };
  if (room < 1) too_many(item, 1);
  if (item.is_scalar()) return {item.string("a name")};
  const std::string name = item.need("name", "a name").string("a name");
  std::optional<Node> count = item.get("count");
  if (!count) return {name};
  std::vector<std::string> out;
  const long long k = count->integer(1, kMaxCount, "a positive integer");
  if (static_cast<double>(k) > room) too_many(*count, static_cast<double>(k));
  for (long long i = 0; i < k; ++i) out.push_back(name + std::to_string(i));
  return out;
}

class NameTable {
 public:
  void add(const Node& where, const std::string& name, const std::string& owner) {
    auto [it, fresh] = owners_.emplace(name, owner);
    if (!fresh) where.fail(fmt::format("\"{}\" is already the name of {}", name, it->second));
  }

 private:
  std::map<std::string, std::string> owners_;
};

void parse_routes(const Node& routes, Cluster& c, const std::unordered_map<std::string, int>& index) {
  std::map<std::pair<int, int>, int> link_of;
  for (size_t i = 0; i < c.links.size(); ++i)
    link_of.emplace(std::minmax(c.links[i].a, c.links[i].b), static_cast<int>(i));
  std::map<std::pair<int, int>, std::string> given;
  const std::string what = "a list of at least two node names like [gpu0, sw0, gpu1]";
  for (const Node& item : routes.items("a list of routes like [{path: [gpu0, sw0, sw1, gpu1]}]")) {
    item.require_map("a route like {path: [gpu0, sw0, sw1, gpu1], symmetric: true}");
    item.check_keys({"path", "symmetric"});
    Node path = item.need("path", what);
    std::vector<Node> nodes = path.items(what);
    if (nodes.size() < 2) path.expected(what);
    std::vector<int> ids;
    std::set<int> seen;
    for (const Node& node : nodes) {
      ids.push_back(node_named(node, index, c));
      if (!seen.insert(ids.back()).second)
        node.fail(fmt::format("the path visits \"{}\" twice", c.node_name(ids.back())));
    }
    if (!c.is_device(ids.front()))
      nodes.front().fail(
          fmt::format("a route starts at a device, \"{}\" is a switch", c.node_name(ids.front())));
    if (!c.is_device(ids.back()))
      nodes.back().fail(fmt::format("a route ends at a device, \"{}\" is a switch", c.node_name(ids.back())));
    ExplicitRoute r{ids.front(), ids.back(), {}};
    for (size_t k = 0; k + 1 < ids.size(); ++k) {
      auto it = link_of.find(std::minmax(ids[k], ids[k + 1]));
      if (it == link_of.end())
        nodes[k + 1].fail(
            fmt::format("no link joins \"{}\" and \"{}\"", c.node_name(ids[k]), c.node_name(ids[k + 1])));
      r.hops.push_back({it->second, c.links[it->second].a != ids[k]});
    }
    const bool symmetric = item.has("symmetric") ? item.get("symmetric")->boolean() : true;
    std::vector<ExplicitRoute> add{r};
    if (symmetric) {
      ExplicitRoute back{r.to, r.from, {}};
      for (auto h = r.hops.rbegin(); h != r.hops.rend(); ++h) back.hops.push_back({h->link, !h->reverse});
      add.push_back(std::move(back));
    }
    for (ExplicitRoute& e : add) {
      if (auto [it, fresh] = given.emplace(std::pair{e.from, e.to}, item.path()); !fresh)
        path.fail(fmt::format("a route from \"{}\" to \"{}\" is already given by {}", c.node_name(e.from),
                              c.node_name(e.to), it->second));
      c.routes.push_back(std::move(e));
    }
  }
}

Cluster parse_written(const Node& n) {
  n.check_keys({"name", "devices", "switches", "links", "routes", "sharing", "collective_engine"});
  Cluster c;
  if (std::optional<Node> name = n.get("name")) c.name = name->string("a name");
  NameTable names;
  Node devices = n.need("devices", "a list of devices like [{name: gpu, count: 8, model: a100, node: box0}]");
  std::vector<Node> device_items =
      devices.items("a list of devices like [{name: gpu, count: 8, model: a100}]");
  if (device_items.empty()) devices.expected("at least one device");
  for (const Node& item : device_items) {
    item.require_map("a device like {name: gpu0, model: a100, node: box0}");
    const DeviceSpec spec = parse_device_spec(item, {"name", "count", "node"});
    std::string node;
    if (std::optional<Node> nd = item.get("node")) node = nd->string("a machine name");
    const double room = kMaxClusterDevices - static_cast<double>(c.devices.size());
    for (std::string& d : entry_names(item, room, kMaxClusterDevices, "devices")) {
      names.add(*item.get("name"), d, item.path());
      c.devices.push_back({std::move(d), spec, node});
    }
  }
  if (std::optional<Node> switches = n.get("switches")) {
    for (const Node& item : switches->items("a list of switch names, or {name, count} mappings")) {
      if (item.is_map()) item.check_keys({"name", "count"});
      const double room = kMaxClusterNodes - static_cast<double>(c.node_count());
      for (std::string& s :
           entry_names(item, room, kMaxClusterNodes, "network nodes (devices and switches)")) {
        names.add(item.is_map() ? *item.get("name") : item, s, item.path());
        c.switches.push_back(std::move(s));
      }
    }
  }
  const auto index = c.node_index();
  std::map<std::pair<int, int>, std::string> joined;
  Node links =
      n.need("links", "a list of links like [{between: [gpu0, switch], bandwidth: 25GBps, latency: 1us}]");
  for (const Node& item :
       links.items("a list of links like [{between: [gpu0, switch], bandwidth: 25GBps, latency: 1us}]")) {
    item.require_map("a link like {between: [gpu0, switch], bandwidth: 25GBps, latency: 1us}");
    if (static_cast<double>(c.links.size()) >= kMaxClusterLinks)
      item.fail(
          fmt::format("one more link would make the cluster larger than pipegrid's limit of {:.0f} links "
                      "(see docs/limits.md)",
                      kMaxClusterLinks));
    item.check_keys({"between", "bandwidth", "latency", "duplex"});
    Node between = item.need("between", "two node names like [gpu0, switch]");
    std::vector<Node> ends = between.items("two node names like [gpu0, switch]");
    if (ends.size() != 2)
      between.fail(
          fmt::format("expected two node names like [gpu0, switch], got a list of {} (a path of several "
                      "hops is one link per pair, or a route under `routes`)",
                      ends.size()));
    Link l;
    l.a = node_named(ends[0], index, c);
    l.b = node_named(ends[1], index, c);
    if (l.a == l.b) between.fail(fmt::format("a link cannot join \"{}\" to itself", c.node_name(l.a)));
    if (auto [it, fresh] = joined.emplace(std::minmax(l.a, l.b), item.path()); !fresh)
      between.fail(fmt::format("\"{}\" and \"{}\" are already joined by {}", c.node_name(l.a),
                               c.node_name(l.b), it->second));
    l.bandwidth = bandwidth_of(item, "bandwidth");
    l.latency = latency_of(item, "latency");
    if (std::optional<Node> d = item.get("duplex"))
      l.duplex = d->choice({"full", "shared"}, "a duplex mode") == "full" ? Duplex::Full : Duplex::Shared;
    c.links.push_back(l);
  }
  if (std::optional<Node> routes = n.get("routes")) parse_routes(*routes, c, index);
  if (Status s = check_connected(c); !s) links.fail(s.error().message + " (no path of links between them)");
  return c;
}

Cluster parse_body(const Node& n, bool references);

std::vector<std::string_view> preset_names() {
  std::vector<std::string_view> out;
  for (const ClusterPreset& p : cluster_presets()) out.push_back(p.name);
  return out;
}

const ClusterPreset* find_preset(std::string_view name) {
  for (const PresetAlias& a : preset_aliases())
    if (a.old_name == name) name = a.name;
  for (const ClusterPreset& p : cluster_presets())
    if (p.name == name) return &p;
  return nullptr;
}

// "dgx-h100-64" -> ("dgx-h100", 64): a preset name's family and device count, or count 0.
std::pair<std::string_view, long> family_of(std::string_view name) {
  // The last all-digit part: "dgx-h100-32-switch" and "dgx1-v100-16-25gbe" have a variant after it.
  for (size_t dash = name.rfind('-'); dash != std::string_view::npos && dash > 0;
       dash = name.rfind('-', dash - 1)) {
    const std::string_view part = name.substr(dash + 1, name.find('-', dash + 1) - dash - 1);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return {name.substr(0, dash), part.size() < 10 ? std::stol(std::string(part)) : 0};
  }
  return {name, 0};
}

// An unknown preset: the presets of its family, by device count (the number in a name counts
// devices), with how to get another size; else the closest name. Then all presets.
std::string unknown_preset(std::string_view name) {
  const auto [family, wanted] = family_of(name);
  std::vector<std::pair<long, std::string_view>> same;
  for (const ClusterPreset& p : cluster_presets())
    if (family_of(p.name).first == family && family != name)
      same.emplace_back(family_of(p.name).second, p.name);
  std::sort(same.begin(), same.end());
  std::string hint;
  if (!same.empty()) {
    std::vector<std::string_view> names;
    for (const auto& s : same) names.push_back(s.second);
    // The one to refine: the largest below the size asked (the smallest when all are larger).
    auto base = same.begin();
    for (auto it = same.begin(); it != same.end(); ++it)
      if (it->first <= wanted && it->first > base->first) base = it;
    const bool nodes = find_preset(base->second)->text.find("\nnodes:") != std::string_view::npos;
    hint = fmt::format(
        "the {} presets, named by their device count: {}{}; ", family, join(names),
        nodes ? fmt::format("; another size: refine one, {{preset: {}, nodes: N}}", base->second) : "");
  } else if (std::vector<std::string> close = close_matches(name, preset_names()); !close.empty()) {
    hint = fmt::format("did you mean \"{}\"? ", close.front());
  }
  return fmt::format("{}presets: {}", hint, join(preset_names()));
}

// A cluster document (a preset's or a cluster file's text) refined by the keys of `n` other than
// `skip`: `cluster: {preset: fpga-ring-u280-8, count: 16, device: {dsps: 18048}}`. The refinements
// are merged into the document's tree (input::merge_into: mappings key by key, a device given by
// name becomes {model: NAME}), and messages about them name the experiment's positions.
Cluster parse_refined(const std::string& text, const std::string& name, const Node& n,
                      const std::vector<std::string_view>& skip) {
  Document doc = load_document_text(text, name);
  Node root = Node::root(doc);
  if (root.is_null())
    root.fail("expected a cluster (a mapping with kind, or devices and links), got an empty document");
  bool refined = false;
  if (n.is_map())
    for (const auto& kv : n.yaml())
      if (std::find(skip.begin(), skip.end(), kv.first.Scalar()) == skip.end()) refined = true;
  Cluster c = [&] {
    if (!refined) return parse_body(root, false);
    root.require_map("a mapping describing the cluster");
    merge_into(doc, doc.root, n, skip);
    return parse_body(Node(&doc, doc.root, n.path(), n.mark()), false);
  }();
  // The name says what was changed: a refined `fpga-ring-u280-8` of 32 boards is not that preset.
  // Every key beside the reference (skip's first) counts, sharing and collective_engine too, which
  // the caller applies after (with_sharing) rather than merging them.
  std::string changed;
  auto leaves = [&](auto&& self, const YAML::Node& y, const std::string& path) -> void {
    if (y.IsMap()) {
      for (const auto& kv : y)
        self(self, kv.second, path.empty() ? kv.first.Scalar() : path + "." + kv.first.Scalar());
    } else if (y.IsScalar()) {
      changed += fmt::format("{}{}={}", changed.empty() ? "" : ", ", path, y.Scalar());
    } else {
      changed += fmt::format("{}{}=...", changed.empty() ? "" : ", ", path);
    }
  };
  if (n.is_map())
    for (const auto& kv : n.yaml()) {
      const std::string key = kv.first.Scalar();
      if (key != skip.front() && key != "name") leaves(leaves, kv.second, key);
    }
  if (!changed.empty() && !n.has("name")) c.name = fmt::format("{} ({})", c.name, changed);
  return c;
}

Cluster parse_preset(const ClusterPreset& p, const Node* refinements = nullptr) {
  const std::string name = fmt::format("topologies/clusters/{}.yaml", p.name);
  if (refinements)
    return parse_refined(std::string(p.text), name, *refinements, {"preset", "sharing", "collective_engine"});
  const Document doc = load_document_text(std::string(p.text), name);
  return parse_body(Node::root(doc), false);
}

bool is_xml(const std::string& path) {
  return std::filesystem::path(path).extension() == ".xml";
}

Cluster parse_file_reference(const Node& n) {
  Node f = *n.get("file");
  const std::string path =
      resolve_path(f.document(), f.string("a path to a cluster file (YAML) or a SimGrid platform (.xml)"));
  if (is_xml(path)) n.check_keys({"file", "device", "sharing", "collective_engine"});
  const std::string text = read_referenced_file(f, path);
  if (is_xml(path)) {
    std::optional<DeviceSpec> device;
    if (std::optional<Node> d = n.get("device")) device = parse_device_spec(*d);
    Result<Cluster> c = read_simgrid_xml(text, path, device);
    if (!c) throw InputError(c.error().message);
    return std::move(*c);
  }
  // A YAML cluster file: the other keys refine it (as a preset's).
  return parse_refined(text, path, n, {"file", "sharing", "collective_engine"});
}

// An engine's figures from a mapping (catalog entry or cluster key), over `e`'s.
void engine_figures(const Node& n, CollectiveEngine& e) {
  if (auto x = n.get("call")) e.call = x->quantity(Dimension::Time, Sign::NonNegative);
  if (auto x = n.get("step")) e.step = x->quantity(Dimension::Time, Sign::NonNegative);
  if (auto x = n.get("bandwidth")) e.bandwidth = x->quantity(Dimension::Bandwidth, Sign::Positive);
  if (auto x = n.get("send_bandwidth")) e.send_bandwidth = x->quantity(Dimension::Bandwidth, Sign::Positive);
}

// `collective_engine`: a name of topologies/engines.yaml, `none`, or a mapping {base: NAME, call,
// step, bandwidth, send_bandwidth} (base's figures, or none, changed by the others).
std::optional<CollectiveEngine> parse_engine(const Node& n) {
  const Document catalog = load_document_text(kBuiltinEngines, "topologies/engines.yaml");
  std::vector<std::string_view> names;
  for (const auto& kv : catalog.root) names.push_back(kv.first.Scalar());
  const std::string what = fmt::format(
      "an engine ({}, none) or a mapping {{base, call, step, bandwidth, "
      "send_bandwidth}}",
      join(names));
  auto named = [&](const Node& at) {
    const std::string name = at.string(what);
    if (std::find(names.begin(), names.end(), name) == names.end()) at.expected(what);
    CollectiveEngine e;
    e.name = name;
    engine_figures(*Node::root(catalog).get(name), e);
    return e;
  };
  if (n.is_scalar()) {
    if (n.string(what) == "none") return std::nullopt;
    return named(n);
  }
  n.require_map(what);
  n.check_keys({"base", "call", "step", "bandwidth", "send_bandwidth"});
  CollectiveEngine e;
  e.name = "custom";
  if (auto b = n.get("base")) e = named(*b);
  if (n.has("call") || n.has("step") || n.has("bandwidth") || n.has("send_bandwidth")) {
    e.name += " (changed)";
    engine_figures(n, e);
  }
  return e;
}

// `sharing: max-min | tcp` and `collective_engine`, allowed in every form of cluster; they override
// the ones of a preset or file. An engine on a cluster without FPGAs would apply to nothing: an error.
Cluster with_sharing(const Node& n, Cluster c) {
  if (std::optional<Node> s = n.get("sharing"))
    c.sharing =
        s->choice({"max-min", "tcp"}, "a bandwidth sharing rule") == "tcp" ? Sharing::Tcp : Sharing::MaxMin;
  if (std::optional<Node> e = n.get("collective_engine")) {
    c.engine = parse_engine(*e);
    const bool fpgas = std::any_of(c.devices.begin(), c.devices.end(),
                                   [](const Device& d) { return d.spec.family == "fpga"; });
    if (c.engine && !fpgas)
      e->fail(
          fmt::format("a collective engine runs on FPGAs; the cluster has none, so \"{}\" would apply to "
                      "nothing (remove the key, or give FPGA devices)",
                      c.engine->name));
  }
  return c;
}

Cluster parse_form(const Node& n, bool references);

// `references`: whether `preset` and `file` may appear (not inside cluster files: no cycles).
Cluster parse_body(const Node& n, bool references) {
  n.require_map("a mapping describing the cluster");
  return with_sharing(n, parse_form(n, references));
}

Cluster parse_form(const Node& n, bool references) {
  if (references && n.has("preset")) {
    Node p = *n.get("preset");
    const std::string name = p.string("a preset name");
    if (const ClusterPreset* preset = find_preset(name)) return parse_preset(*preset, &n);
    p.fail(fmt::format("unknown preset \"{}\" ({})", name, unknown_preset(name)));
  }
  if (references && n.has("file")) return parse_file_reference(n);
  if (n.has("devices") && !n.has("kind")) return parse_written(n);
  const std::string kinds =
      fmt::format("a cluster kind ({}){}", join(kClusterKinds),
                  references ? ", or preset, file, or devices and links" : ", or devices and links");
  const std::string kind = n.need("kind", kinds).choice(kClusterKinds, "a cluster kind");
  Cluster c = parse_generator(n, kind);
  if (std::optional<Node> name = n.get("name")) c.name = name->string("a name");
  return c;
}

}  // namespace

Cluster parse_cluster(const Node& n) {
  return parse_body(n, true);
}

std::span<const PresetAlias> preset_aliases() {
  // Issue 55: preset names count devices. The names before it counted nodes or servers for some.
  static constexpr PresetAlias kAliases[] = {
      {"dgx-a100-2", "dgx-a100-16"},
      {"dgx-a100-4", "dgx-a100-32"},
      {"dgx-h100-4", "dgx-h100-32-switch"},
      {"dgx1-v100", "dgx1-v100-8"},
      {"dgx1-v100-2", "dgx1-v100-16"},
      {"dgx1-v100-2-25gbe", "dgx1-v100-16-25gbe"},
      {"dgx1-mixed-2", "dgx1-mixed-16"},
      {"dgx1-nvlink-gens-2", "dgx1-nvlink-gens-16"},
      {"summit-8", "summit-32"},
  };
  return kAliases;
}

std::span<const ClusterPreset> cluster_presets() {
  static const std::vector<ClusterPreset> presets = [] {
    std::vector<ClusterPreset> out;
    for (const auto& p : kBuiltinClusterPresets) out.push_back({p.name, p.text});
    return out;
  }();
  return presets;
}

Result<Cluster> load_cluster(const std::string& file_or_preset, const std::optional<DeviceSpec>& device) {
  try {
    std::error_code ec;
    if (std::filesystem::is_regular_file(file_or_preset, ec)) {
      if (is_xml(file_or_preset)) return read_simgrid_xml_file(file_or_preset, device);
      if (device) return Error{"--device is only used with SimGrid platform files (.xml)"};
      Result<std::string> text = read_input_file(file_or_preset);
      if (!text) return text.error();
      return load_cluster_text(*text, file_or_preset);
    }
    if (const ClusterPreset* p = find_preset(file_or_preset)) {
      if (device) return Error{"--device is only used with SimGrid platform files (.xml), not a preset"};
      return parse_preset(*p);
    }
    return Error{fmt::format("no cluster file or preset named \"{}\" ({})", file_or_preset,
                             unknown_preset(file_or_preset))};
  } catch (const InputError& e) {
    return Error{e.what()};
  }
}

Result<Cluster> load_cluster_text(const std::string& text, const std::string& name) {
  try {
    const Document doc = load_document_text(text, name);
    Node root = Node::root(doc);
    if (root.is_null())
      root.fail("expected a cluster (a mapping with kind, or devices and links), got an empty document");
    return parse_body(root, false);
  } catch (const InputError& e) {
    return Error{e.what()};
  }
}

Result<DeviceSpec> catalog_device(const std::string& name) {
  if (const CatalogDevice* d = find_catalog_device(name)) return d->spec;
  std::vector<std::string_view> names;
  for (const CatalogDevice& d : device_catalog()) names.push_back(d.name);
  std::vector<std::string> close = close_matches(name, names);
  return Error{fmt::format("unknown device \"{}\" ({}known: {})", name,
                           close.empty() ? "" : fmt::format("did you mean \"{}\"? ", close.front()),
                           join(names))};
}

}  // namespace pipegrid::input
