#include "core/topologies/generators.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace pipegrid {
namespace {

int add_switch(Cluster& c, std::string name) {
  c.switches.push_back(std::move(name));
  return static_cast<int>(c.devices.size() + c.switches.size() - 1);
}

void add_link(Cluster& c, int a, int b, LinkSpec l) {
  c.links.push_back({a, b, l.bandwidth, l.latency, Duplex::Full});
}

Status check_link(LinkSpec l, std::string_view what) {
  if (!(l.bandwidth > 0)) return Error{fmt::format("{} links need a positive bandwidth", what)};
  if (!(l.latency >= 0)) return Error{fmt::format("{} links need a non-negative latency", what)};
  return {};
}

void add_devices(Cluster& c, int count, const std::string& prefix, const DeviceSpec& spec) {
  c.devices.reserve(c.devices.size() + count);
  for (int i = 0; i < count; ++i) c.devices.push_back({prefix + std::to_string(i), spec, ""});
}

// Ring or torus links among devices 0 .. product(dims)-1 (dimension 0 fastest).
void add_torus_links(Cluster& c, const std::vector<int>& dims, LinkSpec link) {
  int stride = 1;
  int points = 1;
  for (int d : dims) points *= d;
  for (int d : dims) {
    for (int i = 0; i < points; ++i) {
      const int x = (i / stride) % d;
      const int next = i + (x + 1 < d ? stride : -(d - 1) * stride);
      // Size 2: one link between the two; size 1: none.
      if (d == 1 || (d == 2 && x == 1)) continue;
      add_link(c, i, next, link);
    }
    stride *= d;
  }
}

// A k-ary fat-tree whose device slots are the network nodes `endpoints` (in order; fewer than k^3/4 is
// allowed): switches <prefix>edge<p>-<e>, <prefix>agg<p>-<a>, <prefix>core<c>.
void add_fat_tree(Cluster& c, int k, const std::vector<int>& endpoints, const std::string& prefix,
                  LinkSpec link) {
  const int h = k / 2;
  const int first = static_cast<int>(c.node_count());  // the switches are numbered edge, agg, core
  c.fat_tree = FatTreeRouting{k, endpoints, first, first + k * h, first + 2 * k * h};
  std::vector<int> edge(k * h), agg(k * h), core(h * h);
  for (int p = 0; p < k; ++p)
    for (int e = 0; e < h; ++e) edge[p * h + e] = add_switch(c, fmt::format("{}edge{}-{}", prefix, p, e));
  for (int p = 0; p < k; ++p)
    for (int a = 0; a < h; ++a) agg[p * h + a] = add_switch(c, fmt::format("{}agg{}-{}", prefix, p, a));
  for (int j = 0; j < h * h; ++j) core[j] = add_switch(c, fmt::format("{}core{}", prefix, j));
  for (size_t i = 0; i < endpoints.size(); ++i) add_link(c, endpoints[i], edge[i / h], link);
  for (int p = 0; p < k; ++p)
    for (int e = 0; e < h; ++e)
      for (int a = 0; a < h; ++a) add_link(c, edge[p * h + e], agg[p * h + a], link);
  for (int p = 0; p < k; ++p)
    for (int a = 0; a < h; ++a)
      for (int j = 0; j < h; ++j) add_link(c, agg[p * h + a], core[a * h + j], link);
}

}  // namespace

Cluster make_switch_cluster(int count, const std::string& prefix, const DeviceSpec& device, double bandwidth,
                            double latency) {
  Cluster c;
  c.name = "switch";
  add_devices(c, count, prefix, device);
  c.switches.push_back("switch");
  for (int i = 0; i < count; ++i) c.links.push_back({i, count, bandwidth, latency, Duplex::Full});
  return c;
}

Result<Cluster> make_ring_cluster(int count, const std::string& prefix, const DeviceSpec& device,
                                  LinkSpec link) {
  if (count < 1) return Error{fmt::format("a ring needs at least 1 device, got {}", count)};
  if (Status s = check_cluster_size("a ring", count, 0, count); !s) return s.error();
  if (Status s = check_link(link, "ring"); !s) return s.error();
  Cluster c;
  c.name = "ring";
  add_devices(c, count, prefix, device);
  add_torus_links(c, {count}, link);
  return c;
}

Result<Cluster> make_torus_cluster(const std::vector<int>& dims, const std::string& prefix,
                                   const DeviceSpec& device, LinkSpec link) {
  if (dims.empty() || dims.size() > 3)
    return Error{fmt::format("a torus has 1, 2 or 3 dimensions, got {}", dims.size())};
  double points = 1;
  for (int d : dims) {
    if (d < 1) return Error{fmt::format("torus dimensions must be at least 1, got {}", d)};
    points *= d;
  }
  if (Status s = check_cluster_size(fmt::format("a torus of {}", fmt::join(dims, " x ")), points, 0,
                                    points * static_cast<double>(dims.size()));
      !s)
    return s.error();
  if (Status s = check_link(link, "torus"); !s) return s.error();
  Cluster c;
  c.name = "torus";
  add_devices(c, static_cast<int>(points), prefix, device);
  add_torus_links(c, dims, link);
  c.torus_dims = dims;
  return c;
}

Result<Cluster> make_fat_tree_cluster(int k, int count, const std::string& prefix, const DeviceSpec& device,
                                      LinkSpec link) {
  if (k < 2 || k % 2 != 0 || k > 128)
    return Error{fmt::format("a k-ary fat-tree needs an even k from 2 to 128, got {}", k)};
  const int slots = k * k * k / 4;
  if (count < 1 || count > slots)
    return Error{fmt::format("a {}-ary fat-tree has room for 1 to {} devices, got {}", k, slots, count)};
  if (Status s = check_cluster_size(fmt::format("a {}-ary fat-tree", k), count, 5.0 * k * k / 4,
                                    count + 2.0 * slots);
      !s)
    return s.error();
  if (Status s = check_link(link, "fat-tree"); !s) return s.error();
  Cluster c;
  c.name = fmt::format("fat-tree-k{}", k);
  add_devices(c, count, prefix, device);
  std::vector<int> endpoints(count);
  for (int i = 0; i < count; ++i) endpoints[i] = i;
  add_fat_tree(c, k, endpoints, "", link);
  return c;
}

Result<Cluster> make_dragonfly_cluster(const DragonflySpec& s) {
  if (s.groups < 1 || s.routers < 1 || s.hosts < 1)
    return Error{"a dragonfly needs at least 1 group, 1 router per group and 1 device per router"};
  if (s.groups > 1 && static_cast<long long>(s.routers) * s.global < s.groups - 1)
    return Error{
        fmt::format("a dragonfly of {} groups needs routers x global >= {} (one global link to every other "
                    "group), got {} x {}",
                    s.groups, s.groups - 1, s.routers, s.global)};
  const double groups = s.groups, routers = s.routers, devices = groups * routers * s.hosts;
  if (Status st = check_cluster_size(
          fmt::format("a dragonfly of {} groups x {} routers x {} devices", s.groups, s.routers, s.hosts),
          devices, groups * routers,
          devices + groups * routers * (routers - 1) / 2 +
              (s.groups > 1 ? groups * routers * s.global / 2.0 : 0));
      !st)
    return st.error();
  for (auto [l, what] : {std::pair{s.host_link, "dragonfly device"},
                         {s.local_link, "dragonfly local"},
                         {s.global_link, "dragonfly global"}})
    if (Status st = check_link(l, what); !st) return st.error();
  Cluster c;
  c.name = "dragonfly";
  add_devices(c, s.groups * s.routers * s.hosts, s.prefix, s.device);
  std::vector<int> router(s.groups * s.routers);
  for (int g = 0; g < s.groups; ++g)
    for (int r = 0; r < s.routers; ++r)
      router[g * s.routers + r] = add_switch(c, fmt::format("router{}-{}", g, r));
  for (size_t i = 0; i < c.devices.size(); ++i)
    add_link(c, static_cast<int>(i), router[i / s.hosts], s.host_link);
  for (int g = 0; g < s.groups; ++g)
    for (int r = 0; r < s.routers; ++r)
      for (int q = r + 1; q < s.routers; ++q)
        add_link(c, router[g * s.routers + r], router[g * s.routers + q], s.local_link);
  // Every router's `global` ports are used (Kim et al.'s h): a group's ports, routers x global, are
  // numbered router by router; in round r the group's port r (groups - 1) + o goes to the group o + 1
  // ahead of it (mod groups). Whole rounds give every pair of groups a link each; a last, partial
  // round links the pairs whose ports are left at both ends (their distance decides it, so the same
  // pairs of every group), the rest stay unused.
  const long long ports = static_cast<long long>(s.routers) * s.global;
  for (long long r = 0; s.groups > 1 && r * (s.groups - 1) < ports; ++r)
    for (int g = 0; g < s.groups; ++g)
      for (int h = g + 1; h < s.groups; ++h) {
        const long long at_g = r * (s.groups - 1) + (h - g - 1);               // offset h - g in g's list
        const long long at_h = r * (s.groups - 1) + (s.groups - (h - g) - 1);  // offset g - h (mod groups)
        if (at_g >= ports || at_h >= ports) continue;
        add_link(c, router[g * s.routers + static_cast<int>(at_g / s.global)],
                 router[h * s.routers + static_cast<int>(at_h / s.global)], s.global_link);
      }
  return c;
}

namespace {
// DgxSpec's rail fabric in pods: per pod the rails and the pod's spine (non-blocking inside), each
// pod's spine linked to the core switch with the pod's NIC bandwidth / oversubscription.
void add_rail_pods(Cluster& c, const DgxSpec& s) {
  const int core = add_switch(c, "ib-core");
  for (int first = 0, q = 0; first < s.nodes; first += s.pod_nodes, ++q) {
    const int nodes = std::min(s.pod_nodes, s.nodes - first);
    const int spine = add_switch(c, fmt::format("ib-pod{}-spine", q));
    for (int j = 0; j < s.gpus_per_node; ++j) {
      const int leaf = add_switch(c, fmt::format("ib-pod{}-rail{}", q, j));
      for (int n = first; n < first + nodes; ++n) add_link(c, n * s.gpus_per_node + j, leaf, s.infiniband);
      add_link(c, leaf, spine, {s.infiniband.bandwidth * nodes, s.infiniband.latency});
    }
    const double pod_nics = static_cast<double>(nodes) * s.gpus_per_node * s.infiniband.bandwidth;
    add_link(c, spine, core, {pod_nics / s.oversubscription, s.infiniband.latency});
  }
}
}  // namespace

Result<Cluster> make_dgx_cluster(const DgxSpec& s) {
  if (s.nodes < 1 || s.gpus_per_node < 1)
    return Error{"a DGX cluster needs at least 1 node of at least 1 GPU"};
  if (s.pod_nodes < 0 || !(s.oversubscription >= 1) || !std::isfinite(s.oversubscription))
    return Error{
        fmt::format("a DGX cluster's pods need pod_nodes >= 1 and an oversubscription >= 1, got {} and {:g}",
                    s.pod_nodes, s.oversubscription)};
  if (s.pod_nodes > 0 && s.fabric != DgxSpec::Fabric::Rail)
    return Error{"pods (pod_nodes, oversubscription) are built for fabric: rail only"};
  const double gpus = static_cast<double>(s.nodes) * s.gpus_per_node;
  // A fat-tree fabric: the smallest even k with k^3/4 >= the GPUs, 5k^2/4 switches, k^3/2 switch links.
  double k = 2;
  while (k * k * k / 4 < gpus) k += 2;
  const bool tree = s.fabric == DgxSpec::Fabric::FatTree;
  const bool rail = s.fabric == DgxSpec::Fabric::Rail;
  const double pods = s.pod_nodes > 0 ? std::ceil(static_cast<double>(s.nodes) / s.pod_nodes) : 1;
  if (Status st = check_cluster_size(
          fmt::format("a DGX cluster of {} nodes x {} GPUs", s.nodes, s.gpus_per_node), gpus,
          s.nodes + (tree   ? 5 * k * k / 4
                     : rail ? (s.gpus_per_node + 1.0) * pods + 1
                            : 1),
          2 * gpus + (tree   ? k * k * k / 2
                      : rail ? (s.gpus_per_node + 1.0) * pods
                             : 0));
      !st)
    return st.error();
  const int total = static_cast<int>(gpus);
  if (Status st = check_link(s.nvlink, "NVLink"); !st) return st.error();
  if (Status st = check_link(s.infiniband, "InfiniBand"); !st) return st.error();
  Cluster c;
  // "dgx-1" read as NVIDIA's V100 DGX-1 (the dgx1 generator's): say nodes, GPUs and model instead.
  c.name = fmt::format("dgx-{}x{}-{}", s.nodes, s.gpus_per_node, s.gpu.kind.empty() ? "gpu" : s.gpu.kind);
  add_devices(c, static_cast<int>(total), "gpu", s.gpu);
  Cluster::MachineSymmetry machines{s.gpus_per_node, {}};
  for (int n = 0; n < s.nodes; ++n) {
    const int nvswitch = add_switch(c, fmt::format("dgx{}-nvswitch", n));
    machines.hubs.push_back(nvswitch);
    for (int j = 0; j < s.gpus_per_node; ++j) {
      const int gpu = n * s.gpus_per_node + j;
      c.devices[gpu].node = fmt::format("dgx{}", n);
      add_link(c, gpu, nvswitch, s.nvlink);
    }
  }
  std::vector<int> nics(total);
  for (int i = 0; i < total; ++i) nics[i] = i;
  // Every machine alike on one switch or the rails (not in pods: machines of two pods are not the
  // pair of machines 0 and 1; the fat-tree has its own routing). On rails with NVLink's latency equal
  // to InfiniBand's, a route between two rails has equally short paths (the spine, either machine's
  // NVLink) that the search picks among by its queue's order: searched then.
  const bool ties = rail && s.nvlink.latency == s.infiniband.latency;
  if (s.fabric == DgxSpec::Fabric::Switch || (rail && s.pod_nodes == 0 && !ties))
    c.machine_symmetry = std::move(machines);
  if (s.fabric == DgxSpec::Fabric::Switch) {
    const int ib = add_switch(c, "ib-switch");
    for (int nic : nics) add_link(c, nic, ib, s.infiniband);
  } else if (rail && s.pod_nodes > 0) {
    add_rail_pods(c, s);
  } else if (rail) {
    // Rail-optimised: the NIC of local GPU j of every node on rail switch j; the rails joined by a
    // spine whose link to each rail carries every NIC of the rail at once (non-blocking).
    const int spine = add_switch(c, "ib-spine");
    for (int j = 0; j < s.gpus_per_node; ++j) {
      const int leaf = add_switch(c, fmt::format("ib-rail{}", j));
      for (int n = 0; n < s.nodes; ++n) add_link(c, n * s.gpus_per_node + j, leaf, s.infiniband);
      add_link(c, leaf, spine, {s.infiniband.bandwidth * s.nodes, s.infiniband.latency});
    }
  } else {
    int k = 2;
    while (static_cast<long long>(k) * k * k / 4 < total) k += 2;
    add_fat_tree(c, k, nics, "ib-", s.infiniband);
  }
  return c;
}

Result<Cluster> make_summit_cluster(const SummitSpec& s) {
  if (s.nodes < 1) return Error{fmt::format("a Summit cluster needs at least 1 node, got {}", s.nodes)};
  if (Status st = check_cluster_size(fmt::format("a Summit cluster of {} nodes", s.nodes), 4.0 * s.nodes,
                                     2.0 * s.nodes + 1, 9.0 * s.nodes);
      !st)
    return st.error();
  for (auto [l, what] : {std::pair{s.nvlink, "NVLink"}, {s.xbus, "X-Bus"}, {s.infiniband, "InfiniBand"}})
    if (Status st = check_link(l, what); !st) return st.error();
  Cluster c;
  c.name = fmt::format("summit-{}", s.nodes);
  add_devices(c, 4 * s.nodes, "gpu", s.gpu);
  std::vector<int> cpus;
  for (int n = 0; n < s.nodes; ++n) {
    cpus.push_back(add_switch(c, fmt::format("summit{}-cpu0", n)));
    cpus.push_back(add_switch(c, fmt::format("summit{}-cpu1", n)));
  }
  const int ib = add_switch(c, "ib-switch");
  for (int n = 0; n < s.nodes; ++n) {
    for (int socket = 0; socket < 2; ++socket) {
      const int cpu = cpus[2 * n + socket];
      const int g0 = 4 * n + 2 * socket;
      c.devices[g0].node = c.devices[g0 + 1].node = fmt::format("summit{}", n);
      add_link(c, g0, g0 + 1, s.nvlink);
      add_link(c, g0, cpu, s.nvlink);
      add_link(c, g0 + 1, cpu, s.nvlink);
      add_link(c, cpu, ib, s.infiniband);
    }
    add_link(c, cpus[2 * n], cpus[2 * n + 1], s.xbus);
  }
  return c;
}

Result<Cluster> make_fpga_cluster(const FpgaClusterSpec& s) {
  LinkSpec qsfp = s.qsfp;
  if (qsfp.bandwidth == 0)
    qsfp.bandwidth =
        s.device.fpga && s.device.fpga->port_bandwidth > 0 ? s.device.fpga->port_bandwidth : 12.5e9;
  int ports = 0;
  for (int d : s.dims) ports += d >= 3 ? 2 : d == 2 ? 1 : 0;
  if (s.device.fpga && s.device.fpga->ports > 0 && ports > s.device.fpga->ports) {
    std::string shape;
    for (int d : s.dims) shape += fmt::format("{}{}", shape.empty() ? "" : " x ", d);
    return Error{
        fmt::format("an FPGA {} {} needs {} network ports per FPGA, the device has {} (set its `ports`)",
                    s.torus ? "torus" : "ring of", shape, ports, s.device.fpga->ports)};
  }
  Result<Cluster> c = s.torus ? make_torus_cluster(s.dims, "fpga", s.device, qsfp)
                              : (s.dims.size() == 1 ? make_ring_cluster(s.dims[0], "fpga", s.device, qsfp)
                                                    : Result<Cluster>(Error{"an FPGA ring has one size"}));
  if (!c) return c;
  c->name = s.torus ? "fpga-torus" : "fpga-ring";
  if (!s.pcie) return c;
  if (s.per_host < 1) return Error{fmt::format("per_host must be at least 1, got {}", s.per_host)};
  if (Status st = check_link(s.pcie_link, "PCIe"); !st) return st.error();
  const int count = static_cast<int>(c->devices.size());
  int host = -1;
  for (int i = 0; i < count; ++i) {
    if (i % s.per_host == 0) host = add_switch(*c, fmt::format("host{}", i / s.per_host));
    c->devices[i].node = c->switches.back();
    add_link(*c, i, host, s.pcie_link);
  }
  return c;
}

Result<Cluster> make_dgx1_cluster(const Dgx1Spec& s) {
  if (s.servers < 1) return Error{fmt::format("a DGX-1 cluster needs at least 1 server, got {}", s.servers)};
  // Per server: 8 GPUs, 2 CPUs and 4 PCIe switches; QPI, 4 uplinks, 8 GPU links, up to 4 NICs and
  // 16 NVLink pairs.
  if (Status st = check_cluster_size(fmt::format("a DGX-1 cluster of {} servers", s.servers), 8.0 * s.servers,
                                     6.0 * s.servers + 1, 33.0 * s.servers);
      !st)
    return st.error();
  if (s.kinds.empty()) return Error{"a DGX-1 cluster needs at least one server kind"};
  if (s.nics != 1 && s.nics != 2 && s.nics != 4)
    return Error{fmt::format("a DGX-1 server has 1, 2 or 4 NICs, got {}", s.nics)};
  for (auto [l, what] : {std::pair{s.nvlink2, "NVLink2"},
                         {s.nvlink1, "NVLink1"},
                         {s.pcie, "PCIe"},
                         {s.qpi, "QPI"},
                         {s.network, "network"}})
    if (Status st = check_link(l, what); !st) return st.error();
  Cluster c;
  c.name = fmt::format("dgx1-{}", s.servers);
  add_devices(c, 8 * s.servers, "gpu", s.gpu);
  const int net = s.servers > 1 ? add_switch(c, "net-switch") : -1;
  for (int n = 0; n < s.servers; ++n) {
    const Dgx1Spec::Kind kind = s.kinds[std::min<size_t>(n, s.kinds.size() - 1)];
    const int g = 8 * n;
    for (int j = 0; j < 8; ++j) c.devices[g + j].node = fmt::format("dgx1-{}", n);
    const int cpu0 = add_switch(c, fmt::format("dgx1-{}-cpu0", n));
    const int cpu1 = add_switch(c, fmt::format("dgx1-{}-cpu1", n));
    const int qpi = static_cast<int>(c.links.size());
    add_link(c, cpu0, cpu1, s.qpi);
    int uplink[4], gpu_link[8];  // link indices: PCIe switch k to its CPU, GPU j to its PCIe switch
    for (int k = 0; k < 4; ++k) {
      const int plx = add_switch(c, fmt::format("dgx1-{}-plx{}", n, k));
      uplink[k] = static_cast<int>(c.links.size());
      add_link(c, plx, k < 2 ? cpu0 : cpu1, s.pcie);
      for (int j : {2 * k, 2 * k + 1}) {
        gpu_link[j] = static_cast<int>(c.links.size());
        add_link(c, g + j, plx, s.pcie);
      }
      if (net >= 0 && k % (4 / s.nics) == 0) add_link(c, plx, net, s.network);
    }
    bool linked[8][8] = {};
    if (kind != Dgx1Spec::Kind::Pcie) {
      for (const Dgx1Pair& p : kDgx1Links) {
        LinkSpec l = kind == Dgx1Spec::Kind::NvLink2 ? s.nvlink2 : s.nvlink1;
        if (kind == Dgx1Spec::Kind::NvLink2) l.bandwidth *= p.links;
        add_link(c, g + p.a, g + p.b, l);
        linked[p.a][p.b] = linked[p.b][p.a] = true;
      }
      if (s.nvlink_forwarding) continue;
    }
    // GPUs of one server without an NVLink between them go over PCIe: GPU, its PCIe switch, (its CPU,
    // QPI, the other CPU,) the other PCIe switch, GPU. Given as routes so that no path through the
    // network switch or a third GPU is taken instead.
    for (int a = 0; a < 8; ++a)
      for (int b = 0; b < 8; ++b) {
        if (a == b || linked[a][b]) continue;
        std::vector<Hop> hops{{gpu_link[a], false}};
        if (a / 2 != b / 2) {
          hops.push_back({uplink[a / 2], false});
          if (a / 4 != b / 4) hops.push_back({qpi, a >= 4});
          hops.push_back({uplink[b / 2], true});
        }
        hops.push_back({gpu_link[b], true});
        c.routes.push_back({g + a, g + b, std::move(hops)});
      }
  }
  return c;
}

}  // namespace pipegrid
