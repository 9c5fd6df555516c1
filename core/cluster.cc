#include "core/cluster.h"

#include <fmt/format.h>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/dijkstra_shortest_paths.hpp>
#include <boost/property_map/function_property_map.hpp>
#include <map>
#include <set>

namespace pipegrid {

const std::string& Cluster::node_name(int node) const {
  if (is_device(node)) return devices[node].name;
  return switches.at(node - devices.size());
}

std::optional<int> Cluster::find_node(std::string_view name) const {
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i].name == name) return static_cast<int>(i);
  for (size_t i = 0; i < switches.size(); ++i)
    if (switches[i] == name) return static_cast<int>(devices.size() + i);
  return std::nullopt;
}

Status validate(const Cluster& c) {
  if (c.devices.empty()) return Error{"the cluster has no device"};
  std::set<std::string> names;
  for (size_t n = 0; n < c.node_count(); ++n) {
    const std::string& name = c.node_name(static_cast<int>(n));
    if (name.empty()) return Error{fmt::format("network node {} has no name", n)};
    if (!names.insert(name).second) return Error{fmt::format("two network nodes are named \"{}\"", name)};
  }
  for (const Device& d : c.devices)
    if (!(d.spec.memory_bytes > 0)) return Error{fmt::format("device \"{}\" has no memory capacity", d.name)};
  std::set<std::pair<int, int>> seen;
  for (size_t i = 0; i < c.links.size(); ++i) {
    const Link& l = c.links[i];
    const int n = static_cast<int>(c.node_count());
    if (l.a < 0 || l.a >= n || l.b < 0 || l.b >= n) return Error{fmt::format("link {} joins an unknown node", i)};
    const std::string& a = c.node_name(l.a);
    const std::string& b = c.node_name(l.b);
    if (l.a == l.b) return Error{fmt::format("link {} joins \"{}\" to itself", i, a)};
    if (!seen.insert(std::minmax(l.a, l.b)).second)
      return Error{fmt::format("link {} duplicates another link between \"{}\" and \"{}\"", i, a, b)};
    if (!(l.bandwidth > 0) || !std::isfinite(l.bandwidth))
      return Error{fmt::format("link {} between \"{}\" and \"{}\" needs a positive bandwidth", i, a, b)};
    if (!(l.latency >= 0) || !std::isfinite(l.latency))
      return Error{fmt::format("link {} between \"{}\" and \"{}\" needs a non-negative latency", i, a, b)};
  }
  return {};
}

namespace {

// Path weight: latency first, then hop count.
struct Weight {
  double latency = 0;
  int hops = 0;
};
struct WeightLess {
  bool operator()(const Weight& x, const Weight& y) const {
    return x.latency < y.latency || (x.latency == y.latency && x.hops < y.hops);
  }
};
struct WeightPlus {
  Weight operator()(const Weight& x, const Weight& y) const { return {x.latency + y.latency, x.hops + y.hops}; }
};

using NetGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS, boost::no_property,
                                       boost::property<boost::edge_index_t, int>>;

}  // namespace

struct Router::Impl {
  const Cluster* cluster;
  NetGraph graph;
  // Per source: predecessor edge (link index) of every node, -1 for none.
  mutable std::unordered_map<int, std::vector<int>> trees;

  const std::vector<int>& tree(int source) const {
    auto it = trees.find(source);
    if (it != trees.end()) return it->second;
    const size_t n = boost::num_vertices(graph);
    std::vector<Weight> dist(n);
    std::vector<int> pred_link(n, -1);
    auto index = boost::get(boost::edge_index, graph);
    auto weight = boost::make_function_property_map<NetGraph::edge_descriptor, Weight>(
        [this, index](NetGraph::edge_descriptor e) { return Weight{cluster->links[index[e]].latency, 1}; });
    struct Recorder : boost::default_dijkstra_visitor {
      std::vector<int>* pred;
      decltype(index) idx;
      void edge_relaxed(NetGraph::edge_descriptor e, const NetGraph& g) const {
        (*pred)[boost::target(e, g)] = idx[e];
      }
    } recorder;
    recorder.pred = &pred_link;
    recorder.idx = index;
    boost::dijkstra_shortest_paths(
        graph, static_cast<NetGraph::vertex_descriptor>(source),
        boost::distance_map(boost::make_iterator_property_map(dist.begin(), boost::get(boost::vertex_index, graph)))
            .weight_map(weight)
            .distance_compare(WeightLess{})
            .distance_combine(WeightPlus{})
            .distance_inf(Weight{std::numeric_limits<double>::infinity(), std::numeric_limits<int>::max()})
            .distance_zero(Weight{})
            .visitor(recorder));
    return trees.emplace(source, std::move(pred_link)).first->second;
  }
};

Router::Router(const Cluster& c) : impl_(new Impl{&c, NetGraph(c.node_count()), {}}) {
  for (size_t i = 0; i < c.links.size(); ++i) boost::add_edge(c.links[i].a, c.links[i].b, static_cast<int>(i), impl_->graph);
}

Router::~Router() { delete impl_; }

Result<Route> Router::route(int from, int to) const {
  Route r;
  if (from == to) return r;
  const Cluster& c = *impl_->cluster;
  const std::vector<int>& pred = impl_->tree(from);
  int node = to;
  std::vector<Hop> reversed;
  while (node != from) {
    int li = pred[node];
    if (li < 0)
      return Error{fmt::format("\"{}\" and \"{}\" are not connected", c.node_name(from), c.node_name(to))};
    const Link& l = c.links[li];
    // Walking backwards: we arrived at `node` over link li.
    bool reverse = (l.a == node);  // traversed b -> a
    reversed.push_back({li, reverse});
    r.latency += l.latency;
    r.bandwidth = std::min(r.bandwidth, l.bandwidth);
    node = reverse ? l.b : l.a;
  }
  r.hops.assign(reversed.rbegin(), reversed.rend());
  return r;
}

}  // namespace pipegrid
