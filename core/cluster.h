// The cluster: devices and switches (network nodes) joined by links, in any graph.
#pragma once

#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/device.h"
#include "core/result.h"

namespace pipegrid {

enum class Duplex {
  Full,    // each direction has the whole bandwidth (NVLink, InfiniBand, Ethernet, QSFP)
  Shared,  // both directions share the bandwidth
};

// How flows that cross one link direction divide its bandwidth in the SimGrid replay.
enum class Sharing {
  // Max-min fair shares, whatever the flows' route latencies (progressive filling): GPU fabrics
  // (NVLink, InfiniBand with credit-based flow control) do not divide bandwidth by round-trip
  // time. A flow's route latency only delays its start.
  MaxMin,
  // TCP-like: SimGrid's CM02 model with the real latencies, where a flow's share on a link is
  // inversely proportional to its route's latency (RTT unfairness). For TCP/Ethernet studies.
  Tcp,
};

struct Link {
  int a = -1, b = -1;    // network nodes
  double bandwidth = 0;  // bytes/s, per direction when full duplex
  double latency = 0;    // seconds
  Duplex duplex = Duplex::Full;
};

// One traversal of a link.
struct Hop {
  int link = -1;
  bool reverse = false;  // traversed from b to a
  bool operator==(const Hop&) const = default;
};

// A route given as data (cluster file, SimGrid import) instead of computed: it is used for
// (from, to) only; the opposite direction needs its own entry.
struct ExplicitRoute {
  int from = -1, to = -1;  // network nodes
  std::vector<Hop> hops;   // a walk from `from` to `to`
};

// Destination-mod-k routing on a k-ary fat-tree (Al-Fares et al.'s 3 levels), the usual static
// routing of InfiniBand fat-trees: a route between endpoints of different machines climbs to edge
// switch slot / (k/2), then to aggregation switch a = d mod (k/2) of the pod and, across pods, to
// core switch a (k/2) + (d / (k/2)) mod (k/2), where d is the destination's slot; then down. Every
// permutation of slots that keeps positions within pods (slot j of pod s to slot j of pod t) uses
// each link direction once. Endpoints of one machine (dgx) use shortest paths (their own links).
struct FatTreeRouting {
  int k = 0;
  std::vector<int> endpoints;  // network nodes; slot i hangs off edge switch i / (k/2)
  // Network nodes of switch 0 of each level: edge switch e of pod p is edge + p k/2 + e,
  // aggregation switch a of pod p is agg + p k/2 + a, core switch c is core + c.
  int edge = -1, agg = -1, core = -1;
  // Switch-to-switch links taken down (an experiment's faults.down_links), as node pairs: routes
  // climb to the next aggregation (and core) switch in order whose links are up, as a subnet
  // manager reroutes around a failed link; validation accepts these links missing.
  std::vector<std::pair<int, int>> down;
};

// A collective engine on the FPGAs (ACCL-style: the collectives run on the board, called by the
// host, each call a sequence of messages through the board's own network stack). Its figures apply
// where both ends of a flow are FPGAs: a collective's flow waits `step` before it enters the
// network, a device's first flow of each collective call also `call`, and uses its links as if they
// ran at `bandwidth` (alone it runs at that rate; flows sharing a link share it); a point-to-point
// transfer between stages likewise at `send_bandwidth`, with no call or step (docs/clusters.md says
// why). Catalog: topologies/engines.yaml.
struct CollectiveEngine {
  std::string name;
  double call = 0;  // seconds per collective call (the host's invocation)
  double step = 0;  // seconds per message of a collective (one flow of a ring step)
  double bandwidth = std::numeric_limits<double>::infinity();       // bytes/s of a collective's flow
  double send_bandwidth = std::numeric_limits<double>::infinity();  // bytes/s of a stage-to-stage send
};

// Network nodes: devices are nodes 0 .. devices.size()-1, switches follow.
struct Cluster {
  std::string name;
  std::vector<Device> devices;
  std::vector<std::string> switches;
  std::vector<Link> links;
  // Routes that replace the computed ones for their (from, to) pairs.
  std::vector<ExplicitRoute> routes;
  // Dimension-order routing (torus generators). When not empty, devices 0 .. product(dims)-1 sit at
  // the points of a torus with these sizes, device index = x0 + dims[0] (x1 + dims[1] x2), with a
  // link between neighbours along each dimension (wrapping around). A route between two of them
  // moves along dimension 0 first, then 1, then 2, each time the shorter way round the ring (the
  // upward way when both are equally long). Explicit routes still take precedence.
  std::vector<int> torus_dims;
  // Fat-tree routing (fat-tree and dgx generators), after explicit routes and dimension order.
  std::optional<FatTreeRouting> fat_tree;
  // Machines alike (the dgx generator with one switch or a rail-optimised fabric without pods): machine
  // n holds devices n x per_machine .. (n + 1) x per_machine - 1 and its own switch hubs[n]; every
  // other switch is shared by all, through the same links. A route between two machines' devices is
  // then the route between the same devices of machines 0 and 1 (1 and 0 when the first is the
  // later machine), moved onto theirs: one search per pair of device positions instead of one per
  // pair of devices. Exact where the search meets no two equally short ways to a node of the route (it
  // breaks such ties by its queue's order, which follows the nodes' numbers): the generator leaves it
  // out on rails whose NVLink and InfiniBand latencies are equal (tests/core/cluster_test.cc checks
  // every pair against the search). Links taken down clear it.
  struct MachineSymmetry {
    int per_machine = 0;
    std::vector<int> hubs;
  };
  std::optional<MachineSymmetry> machine_symmetry;
  Sharing sharing = Sharing::MaxMin;       // the replay's bandwidth sharing rule (cluster key `sharing`)
  std::optional<CollectiveEngine> engine;  // the FPGAs' collective engine (cluster key `collective_engine`)

  size_t node_count() const { return devices.size() + switches.size(); }
  bool is_device(int node) const { return node >= 0 && static_cast<size_t>(node) < devices.size(); }
  const std::string& node_name(int node) const;
  // Linear scan; use node_index() for many look-ups.
  std::optional<int> find_node(std::string_view name) const;
  std::unordered_map<std::string, int> node_index() const;
  // The machine of a device for hierarchical collectives: its `node`, or its own name when empty.
  const std::string& machine_of(int device) const;
  // Whether the collective engine serves this device (the cluster has one and the device is an FPGA).
  bool on_engine(int device) const {
    return engine && devices[static_cast<size_t>(device)].spec.family == "fpga";
  }
  // The rate at which a flow from `from` to `to` uses its links: the engine's bandwidth (a collective's
  // flow) or send_bandwidth where both ends are on the engine, otherwise unbounded (the links' own).
  double engine_rate(int from, int to, bool collective) const {
    if (!on_engine(from) || !on_engine(to)) return std::numeric_limits<double>::infinity();
    return collective ? engine->bandwidth : engine->send_bandwidth;
  }
};

// The channel a hop uses, numbered 2 x link (+ 1 for the reverse direction of a full-duplex link): a
// full-duplex link has one channel per direction, a shared one a single channel for both.
inline size_t link_channel(const Cluster& c, const Hop& h) {
  const bool split = c.links[h.link].duplex == Duplex::Full;
  return 2 * static_cast<size_t>(h.link) + (split && h.reverse ? 1 : 0);
}

// The largest cluster pipegrid builds, checked before anything is allocated (each generator, each
// `count` of a cluster file, a SimGrid platform's radicals): 131,072 devices (8x the 16,384 GPUs of
// the largest clusters the scale benchmarks name; a device costs about 2 KB before a run, so the
// limit holds a cluster under 300 MB), 262,144 network nodes (devices and switches) and 2,097,152
// links (a 128-ary fat-tree's switch links and 131,072 device links fit).
inline constexpr double kMaxClusterDevices = 131072;
inline constexpr double kMaxClusterNodes = 262144;
inline constexpr double kMaxClusterLinks = 2097152;
// Fails when a cluster of `devices`, `switches` and `links` (counted in floating point, so that a
// product of input sizes cannot overflow) is above one of the limits; the message starts with `what`.
Status check_cluster_size(std::string_view what, double devices, double switches, double links);

// Checks what SimGrid would abort on, and more: unique names, links between known nodes, no
// self-link, no duplicate link, positive bandwidth, non-negative latency, positive device memory,
// explicit routes that are walks over existing links (at most one per ordered pair), and torus and
// fat-tree shapes whose links exist.
Status validate(const Cluster& c);

// What a failed check is about, so that a reader can add the position the input gave it
// (file:line:column): a network node (devices first, then switches), a link or a route, by index.
struct ClusterSubject {
  enum class Kind { None, Node, Link, Route };
  Kind kind = Kind::None;
  int index = -1;
};
Status validate(const Cluster& c, ClusterSubject* subject);

// Fails if two devices are not connected by links; the message names the first device and the first
// one it cannot reach (the subject: that device).
Status check_connected(const Cluster& c, ClusterSubject* subject = nullptr);

struct Route {
  std::vector<Hop> hops;
  double latency = 0;                                          // sum over hops
  double bandwidth = std::numeric_limits<double>::infinity();  // slowest hop

  // Time of an uncontended transfer: latency + bytes / bottleneck bandwidth.
  double transfer_time(double bytes) const { return hops.empty() ? 0.0 : latency + bytes / bandwidth; }
};

// Routes between network nodes, in order of precedence: the cluster's explicit routes, dimension-order
// routes on a torus (Cluster::torus_dims), destination-mod-k routes on a fat-tree (Cluster::fat_tree),
// and otherwise shortest paths by latency, ties broken by hop count (Boost.Graph Dijkstra). A shortest-path
// search stops as soon as its destination is settled, so routing a few pairs of a large cluster costs a small
// part of an all-pairs computation; every answer is cached. Devices may be crossed by a route (direct FPGA
// rings and tori need it). Precondition: the cluster is valid and outlives the router.
class Router {
 public:
  explicit Router(const Cluster& c);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Fails if the two nodes are not connected; the message names both.
  Result<Route> route(int from, int to) const;
  const Cluster& cluster() const;

 private:
  struct Impl;
  Impl* impl_;
};

// Figures of the network seen from its devices.
struct ClusterFigures {
  int diameter_hops = 0;  // largest number of links on a shortest path between two devices
  // Bisection bandwidth (bytes/s, one direction): the smallest total rate that one half of the
  // devices can send to the other half, over balanced halves (sizes floor(D/2) and ceil(D/2)),
  // computed as a maximum flow per candidate split. Exact (every split tried) up to
  // kExactBisectionDevices devices; above, the minimum over a few structured splits - the index
  // order cut into two arcs at four rotations, and for a torus the cut across each dimension - so an
  // upper bound, which is the true value for the generators' regular topologies.
  double bisection_bandwidth = 0;
  bool bisection_exact = false;
  int bisection_candidates = 0;  // splits tried
};
inline constexpr int kExactBisectionDevices = 16;

// Fails if two devices are not connected (the message names them).
Result<ClusterFigures> cluster_figures(const Cluster& c);

}  // namespace pipegrid
