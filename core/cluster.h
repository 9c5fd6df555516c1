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

struct Link {
  int a = -1, b = -1;      // network nodes
  double bandwidth = 0;    // bytes/s, per direction when full duplex
  double latency = 0;      // seconds
  Duplex duplex = Duplex::Full;
};

// Network nodes: devices are nodes 0 .. devices.size()-1, switches follow.
struct Cluster {
  std::string name;
  std::vector<Device> devices;
  std::vector<std::string> switches;
  std::vector<Link> links;

  size_t node_count() const { return devices.size() + switches.size(); }
  bool is_device(int node) const { return node >= 0 && static_cast<size_t>(node) < devices.size(); }
  const std::string& node_name(int node) const;
  std::optional<int> find_node(std::string_view name) const;
};

// Checks what SimGrid would abort on, and more: unique names, links between known nodes, no
// self-link, no duplicate link, positive bandwidth, non-negative latency, positive device memory.
Status validate(const Cluster& c);

// One traversal of a link.
struct Hop {
  int link = -1;
  bool reverse = false;  // traversed from b to a
};

struct Route {
  std::vector<Hop> hops;
  double latency = 0;                                          // sum over hops
  double bandwidth = std::numeric_limits<double>::infinity();  // slowest hop

  // Time of an uncontended transfer: latency + bytes / bottleneck bandwidth.
  double transfer_time(double bytes) const { return hops.empty() ? 0.0 : latency + bytes / bandwidth; }
};

// Shortest paths by latency, ties broken by hop count (Boost.Graph Dijkstra), computed on demand
// and cached per source. Precondition: the cluster is valid.
class Router {
 public:
  explicit Router(const Cluster& c);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Fails if the two nodes are not connected; the message names both.
  Result<Route> route(int from, int to) const;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace pipegrid
