// GCC 12 reports a false maybe-uninitialized inside Boost's edge iterator when push-relabel is
// instantiated (the headers come in through core/workload.h first, hence at the top).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "core/cluster.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/breadth_first_search.hpp>
#include <boost/graph/dijkstra_shortest_paths_no_color_map.hpp>
#include <boost/graph/push_relabel_max_flow.hpp>
#include <boost/property_map/function_property_map.hpp>
#include <cmath>
#include <numeric>
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

std::unordered_map<std::string, int> Cluster::node_index() const {
  std::unordered_map<std::string, int> index;
  index.reserve(node_count());
  for (size_t n = 0; n < node_count(); ++n)
    index.emplace(node_name(static_cast<int>(n)), static_cast<int>(n));
  return index;
}

const std::string& Cluster::machine_of(int device) const {
  const Device& d = devices.at(device);
  return d.node.empty() ? d.name : d.node;
}

namespace {

uint64_t pair_key(int a, int b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Link index by unordered endpoint pair.
std::unordered_map<uint64_t, int> links_by_endpoints(const Cluster& c) {
  std::unordered_map<uint64_t, int> out;
  out.reserve(c.links.size());
  for (size_t i = 0; i < c.links.size(); ++i) {
    auto [lo, hi] = std::minmax(c.links[i].a, c.links[i].b);
    out.emplace(pair_key(lo, hi), static_cast<int>(i));
  }
  return out;
}

int link_between(const std::unordered_map<uint64_t, int>& links, int a, int b) {
  auto [lo, hi] = std::minmax(a, b);
  auto it = links.find(pair_key(lo, hi));
  return it == links.end() ? -1 : it->second;
}

// Coordinates of a torus point, dimension 0 fastest.
std::vector<int> torus_coords(const std::vector<int>& dims, int index) {
  std::vector<int> x(dims.size());
  for (size_t k = 0; k < dims.size(); ++k) {
    x[k] = index % dims[k];
    index /= dims[k];
  }
  return x;
}

int torus_index(const std::vector<int>& dims, const std::vector<int>& x) {
  int index = 0;
  for (size_t k = dims.size(); k-- > 0;) index = index * dims[k] + x[k];
  return index;
}

long long torus_size(const std::vector<int>& dims) {
  long long n = 1;
  for (int d : dims) n *= d;
  return n;
}

Status validate_routes(const Cluster& c, ClusterSubject& subject) {
  const int n = static_cast<int>(c.node_count());
  std::set<std::pair<int, int>> seen;
  for (size_t i = 0; i < c.routes.size(); ++i) {
    subject = {ClusterSubject::Kind::Route, static_cast<int>(i)};
    const ExplicitRoute& r = c.routes[i];
    if (r.from < 0 || r.from >= n || r.to < 0 || r.to >= n)
      return Error{fmt::format("route {} joins an unknown node", i)};
    const std::string& from = c.node_name(r.from);
    const std::string& to = c.node_name(r.to);
    if (r.from == r.to) return Error{fmt::format("route {} goes from \"{}\" to itself", i, from)};
    if (!seen.insert({r.from, r.to}).second)
      return Error{fmt::format("route {} duplicates another route from \"{}\" to \"{}\"", i, from, to)};
    if (r.hops.empty()) return Error{fmt::format("route {} from \"{}\" to \"{}\" has no link", i, from, to)};
    int at = r.from;
    std::set<int> visited{at};
    for (size_t h = 0; h < r.hops.size(); ++h) {
      const Hop& hop = r.hops[h];
      if (hop.link < 0 || static_cast<size_t>(hop.link) >= c.links.size())
        return Error{
            fmt::format("route {} from \"{}\" to \"{}\": hop {} uses an unknown link", i, from, to, h)};
      const Link& l = c.links[hop.link];
      const int enter = hop.reverse ? l.b : l.a;
      const int leave = hop.reverse ? l.a : l.b;
      if (enter != at)
        return Error{fmt::format(
            "route {} from \"{}\" to \"{}\": hop {} (link \"{}\"--\"{}\") does not start at \"{}\"", i, from,
            to, h, c.node_name(l.a), c.node_name(l.b), c.node_name(at))};
      at = leave;
      if (!visited.insert(at).second)
        return Error{
            fmt::format("route {} from \"{}\" to \"{}\" visits \"{}\" twice", i, from, to, c.node_name(at))};
    }
    if (at != r.to)
      return Error{
          fmt::format("route {} from \"{}\" to \"{}\" ends at \"{}\"", i, from, to, c.node_name(at))};
  }
  subject = {};
  return {};
}

Status validate_torus(const Cluster& c) {
  if (c.torus_dims.empty()) return {};
  if (c.torus_dims.size() > 3) return Error{"a torus has 1, 2 or 3 dimensions"};
  for (int d : c.torus_dims)
    if (d < 1) return Error{"torus dimensions must be positive"};
  const long long size = torus_size(c.torus_dims);
  if (size > static_cast<long long>(c.devices.size()))
    return Error{fmt::format("a torus of {} points needs as many devices, the cluster has {}", size,
                             c.devices.size())};
  const auto links = links_by_endpoints(c);
  for (int i = 0; i < size; ++i) {
    std::vector<int> x = torus_coords(c.torus_dims, i);
    for (size_t k = 0; k < c.torus_dims.size(); ++k) {
      if (c.torus_dims[k] == 1) continue;
      std::vector<int> y = x;
      y[k] = (x[k] + 1) % c.torus_dims[k];
      const int j = torus_index(c.torus_dims, y);
      if (link_between(links, i, j) < 0)
        return Error{
            fmt::format("torus neighbours \"{}\" and \"{}\" have no link", c.node_name(i), c.node_name(j))};
    }
  }
  return {};
}

// The switches and links fat-tree routing uses: every one must exist.
Status validate_fat_tree(const Cluster& c) {
  if (!c.fat_tree) return {};
  const FatTreeRouting& f = *c.fat_tree;
  const int n = static_cast<int>(c.node_count());
  const int h = f.k / 2;
  if (f.k < 2 || f.k % 2 != 0) return Error{fmt::format("fat-tree routing needs an even k, got {}", f.k)};
  if (f.endpoints.size() > static_cast<size_t>(f.k) * f.k * f.k / 4)
    return Error{fmt::format("a {}-ary fat-tree has room for {} endpoints, got {}", f.k, f.k * f.k * f.k / 4,
                             f.endpoints.size())};
  if (f.edge < 0 || f.edge + f.k * h > n || f.agg < 0 || f.agg + f.k * h > n || f.core < 0 ||
      f.core + h * h > n)
    return Error{"fat-tree routing names switches the cluster does not have"};
  const auto links = links_by_endpoints(c);
  auto need = [&](int a, int b) -> Status {
    if (a >= 0 && a < n && link_between(links, a, b) >= 0) return {};
    for (const auto& [x, y] : f.down)
      if ((x == a && y == b) || (x == b && y == a)) return {};
    return Error{fmt::format("fat-tree routing needs a link between \"{}\" and \"{}\"",
                             a >= 0 && a < n ? c.node_name(a) : "?", c.node_name(b))};
  };
  for (size_t i = 0; i < f.endpoints.size(); ++i)
    if (Status s = need(f.endpoints[i], f.edge + static_cast<int>(i) / h); !s) return s;
  for (int p = 0; p < f.k; ++p)
    for (int a = 0; a < h; ++a) {
      for (int e = 0; e < h; ++e)
        if (Status s = need(f.edge + p * h + e, f.agg + p * h + a); !s) return s;
      for (int j = 0; j < h; ++j)
        if (Status s = need(f.agg + p * h + a, f.core + a * h + j); !s) return s;
    }
  return {};
}

}  // namespace

Status check_cluster_size(std::string_view what, double devices, double switches, double links) {
  auto over = [&](double n, double limit, std::string_view of) {
    return Error{fmt::format("{} would have {:.0f} {}, above pipegrid's limit of {:.0f} (see docs/limits.md)",
                             what, n, of, limit)};
  };
  if (!(devices <= kMaxClusterDevices)) return over(devices, kMaxClusterDevices, "devices");
  if (!(devices + switches <= kMaxClusterNodes))
    return over(devices + switches, kMaxClusterNodes, "network nodes (devices and switches)");
  if (!(links <= kMaxClusterLinks)) return over(links, kMaxClusterLinks, "links");
  return {};
}

Status validate(const Cluster& c) {
  return validate(c, nullptr);
}

Status validate(const Cluster& c, ClusterSubject* where) {
  ClusterSubject unused;
  ClusterSubject& subject = where ? *where : unused;
  subject = {};
  if (c.devices.empty()) return Error{"the cluster has no device"};
  std::set<std::string_view> names;
  for (size_t n = 0; n < c.node_count(); ++n) {
    subject = {ClusterSubject::Kind::Node, static_cast<int>(n)};
    const std::string& name = c.node_name(static_cast<int>(n));
    if (name.empty()) return Error{fmt::format("network node {} has no name", n)};
    if (!names.insert(name).second) return Error{fmt::format("two network nodes are named \"{}\"", name)};
  }
  for (size_t d = 0; d < c.devices.size(); ++d) {
    subject = {ClusterSubject::Kind::Node, static_cast<int>(d)};
    if (!(c.devices[d].spec.memory_bytes > 0))
      return Error{fmt::format("device \"{}\" has no memory capacity", c.devices[d].name)};
  }
  std::set<std::pair<int, int>> seen;
  for (size_t i = 0; i < c.links.size(); ++i) {
    subject = {ClusterSubject::Kind::Link, static_cast<int>(i)};
    const Link& l = c.links[i];
    const int n = static_cast<int>(c.node_count());
    if (l.a < 0 || l.a >= n || l.b < 0 || l.b >= n)
      return Error{fmt::format("link {} joins an unknown node", i)};
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
  subject = {};
  if (Status s = validate_routes(c, subject); !s) return s;
  if (Status s = validate_torus(c); !s) return s;
  return validate_fat_tree(c);
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
  Weight operator()(const Weight& x, const Weight& y) const {
    return {x.latency + y.latency, x.hops + y.hops};
  }
};
const Weight kUnreached{std::numeric_limits<double>::infinity(), std::numeric_limits<int>::max()};

using NetGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS, boost::no_property,
                                       boost::property<boost::edge_index_t, int>>;

NetGraph make_graph(const Cluster& c) {
  NetGraph g(c.node_count());
  for (size_t i = 0; i < c.links.size(); ++i)
    boost::add_edge(c.links[i].a, c.links[i].b, static_cast<int>(i), g);
  return g;
}

struct Settled {};  // thrown by the search visitor when the destination is settled

}  // namespace

struct Router::Impl {
  const Cluster* cluster;
  NetGraph graph;
  std::unordered_map<uint64_t, int> explicit_routes;  // (from, to) -> index in cluster->routes
  std::unordered_map<uint64_t, int> links;            // for dimension-order and fat-tree routing
  long long torus_points = 0;
  std::unordered_map<int, int> fat_tree_slot;  // endpoint node -> slot
  // The one link of a node that has exactly one (a leaf: a device on one switch port), else -1.
  std::vector<int> leaf_link;
  mutable std::unordered_map<uint64_t, Route> cache;
  // A source asked about more than kTreeAfter times in a row gets its whole shortest-path tree
  // (kept for one source at a time): queries grouped by source then cost one search per source.
  // Fewer queries (a pipeline's neighbours, a ring all-reduce's next device) each search only as
  // far as their destination: a whole tree for the second query of every source made a ring of
  // n devices cost n whole searches (8 s at 16,384). Either way a route is the same: the search
  // settles the destination's predecessors before it, and never changes a settled one.
  static constexpr int kTreeAfter = 4;
  mutable int last_source = -1;
  mutable int source_queries = 0;  // queries in a row from last_source
  mutable int tree_source = -1;
  mutable std::vector<int> tree_pred;
  // Search state, reset after every search on the vertices it touched.
  mutable std::vector<Weight> dist;
  mutable std::vector<int> pred_link;
  mutable std::vector<int> touched;

  Route finish(std::vector<Hop> hops) const {
    Route r;
    r.hops = std::move(hops);
    for (const Hop& h : r.hops) {
      const Link& l = cluster->links[h.link];
      r.latency += l.latency;
      r.bandwidth = std::min(r.bandwidth, l.bandwidth);
    }
    return r;
  }

  Route torus_route(int from, int to) const;

  // Destination-mod-k on the fat-tree (see FatTreeRouting); both nodes are endpoints. Where a link of
  // that path is down (FatTreeRouting::down), the next aggregation switch in order (a + 1, a + 2, ...
  // mod k/2), and for each the next core switch, whose links are all up; nullopt when none is.
  std::optional<Route> fat_tree_route(int from, int to) const;

  // Two leaves on the same node: the two links are the only shortest path (any other walk
  // revisits that node), what the search finds, without expanding a switch of many ports for
  // each pair (a search per pair made routing a `switch` cluster quadratic in its devices).
  std::optional<Route> sibling_route(int from, int to) const {
    const int lf = leaf_link[from], lt = leaf_link[to];
    if (lf < 0 || lt < 0 || lf == lt) return std::nullopt;
    const Link &a = cluster->links[lf], &b = cluster->links[lt];
    const int hub = a.a == from ? a.b : a.a;
    if ((b.a == to ? b.b : b.a) != hub) return std::nullopt;
    return finish({{lf, a.a != from}, {lt, b.a != hub}});
  }

  bool fat_tree_pair(int from, int to) const {
    if (fat_tree_slot.empty()) return false;
    if (!fat_tree_slot.count(from) || !fat_tree_slot.count(to)) return false;
    if (cluster->is_device(from) && cluster->is_device(to) &&
        cluster->machine_of(from) == cluster->machine_of(to))
      return false;
    return true;
  }

  // Cluster::MachineSymmetry (defined below the struct): the canonical pair of two devices on other
  // machines, and its route moved onto theirs.
  std::vector<int> hub_machine;  // per node: the machine whose hub it is, else -1
  std::optional<std::pair<int, int>> moved_pair(int from, int to) const;
  std::optional<Route> move_route(const Route& canonical, int from, int to) const;

  // Route to `to` along predecessor links (-1: none), or nullopt when `to` was not reached.
  std::optional<Route> follow(const std::vector<int>& pred, int from, int to) const {
    std::vector<Hop> reversed;
    for (int node = to; node != from;) {
      const int li = pred[node];
      if (li < 0) return std::nullopt;
      const Link& l = cluster->links[li];
      const bool reverse = (l.a == node);  // arrived at `node` over li from its other end
      reversed.push_back({li, reverse});
      node = reverse ? l.b : l.a;
    }
    return finish({reversed.rbegin(), reversed.rend()});
  }

  Error not_connected(int from, int to) const {
    return Error{
        fmt::format("\"{}\" and \"{}\" are not connected", cluster->node_name(from), cluster->node_name(to))};
  }

  // Searches from `from` until `to` is settled (to = -1: the whole graph). Returns the route to `to`
  // (if given), and with keep_tree leaves the predecessor links of every node in tree_pred.
  Result<Route> shortest_route(int from, int to, bool keep_tree = false) const;
};

Route Router::Impl::torus_route(int from, int to) const {
  const std::vector<int>& dims = cluster->torus_dims;
  std::vector<int> x = torus_coords(dims, from);
  const std::vector<int> goal = torus_coords(dims, to);
  std::vector<Hop> hops;
  int at = from;
  for (size_t k = 0; k < dims.size(); ++k) {
    const int n = dims[k];
    const int up = ((goal[k] - x[k]) % n + n) % n;
    const int step = up <= n - up ? 1 : -1;
    while (x[k] != goal[k]) {
      x[k] = (x[k] + step + n) % n;
      const int next = torus_index(dims, x);
      const int li = link_between(links, at, next);
      hops.push_back({li, cluster->links[li].a != at});
      at = next;
    }
  }
  return finish(std::move(hops));
}

std::optional<Route> Router::Impl::fat_tree_route(int from, int to) const {
  const FatTreeRouting& f = *cluster->fat_tree;
  const int h = f.k / 2;
  const int s = fat_tree_slot.at(from), d = fat_tree_slot.at(to);
  const int es = s / h, ed = d / h;  // edge switches (global index = pod h + e)
  for (int ia = 0; ia < h; ++ia)
    for (int ic = 0; ic < (es / h != ed / h ? h : 1); ++ic) {
      const int a = (d % h + ia) % h, c = ((d / h) % h + ic) % h;
      std::vector<int> path{from, f.edge + es};
      if (es != ed) {
        path.push_back(f.agg + (es / h) * h + a);
        if (es / h != ed / h) {
          path.push_back(f.core + a * h + c);
          path.push_back(f.agg + (ed / h) * h + a);
        }
        path.push_back(f.edge + ed);
      }
      path.push_back(to);
      std::vector<Hop> hops;
      for (size_t i = 0; i + 1 < path.size(); ++i) {
        const int li = link_between(links, path[i], path[i + 1]);
        if (li < 0) break;
        hops.push_back({li, cluster->links[li].a != path[i]});
      }
      if (hops.size() + 1 == path.size()) return finish(std::move(hops));
      if (es == ed) return std::nullopt;  // only the edge switch: nothing to reroute
    }
  return std::nullopt;
}

Result<Route> Router::Impl::shortest_route(int from, int to, bool keep_tree) const {
  auto index = boost::get(boost::edge_index, graph);
  auto weight = boost::make_function_property_map<NetGraph::edge_descriptor, Weight>(
      [this, index](NetGraph::edge_descriptor e) {
        return Weight{cluster->links[index[e]].latency, 1};
      });
  struct Visitor : boost::default_dijkstra_visitor {
    const Impl* self;
    decltype(index) idx;
    int target;
    void edge_relaxed(NetGraph::edge_descriptor e, const NetGraph& g) const {
      const int v = static_cast<int>(boost::target(e, g));
      if (self->pred_link[v] < 0) self->touched.push_back(v);
      self->pred_link[v] = idx[e];
    }
    void examine_vertex(NetGraph::vertex_descriptor u, const NetGraph&) const {
      if (static_cast<int>(u) == target) throw Settled{};
    }
  } visitor;
  visitor.self = this;
  visitor.idx = index;
  visitor.target = to;
  dist[from] = Weight{};
  touched.push_back(from);
  try {
    boost::dijkstra_shortest_paths_no_color_map_no_init(
        graph, static_cast<NetGraph::vertex_descriptor>(from), boost::dummy_property_map(),
        boost::make_iterator_property_map(dist.begin(), boost::get(boost::vertex_index, graph)), weight,
        boost::get(boost::vertex_index, graph), WeightLess{}, WeightPlus{}, kUnreached, Weight{}, visitor);
  } catch (const Settled&) {
  }
  std::optional<Route> found = to >= 0 ? follow(pred_link, from, to) : std::optional<Route>(Route{});
  if (keep_tree) {
    tree_pred = pred_link;
    tree_source = from;
  }
  for (int v : touched) {
    dist[v] = kUnreached;
    pred_link[v] = -1;
  }
  touched.clear();
  if (!found) return not_connected(from, to);
  return std::move(*found);
}

// Cluster::MachineSymmetry: the canonical pair (the same positions on machines 0 and 1, or 1 and 0)
// of two devices on other machines; nullopt for devices on one machine or a canonical pair itself.
std::optional<std::pair<int, int>> Router::Impl::moved_pair(int from, int to) const {
  const auto& s = cluster->machine_symmetry;
  if (!s) return std::nullopt;
  const int g = s->per_machine, machines = static_cast<int>(s->hubs.size());
  if (from < 0 || to < 0 || from >= g * machines || to >= g * machines) return std::nullopt;
  const int n = from / g, m = to / g, n0 = n < m ? 0 : 1;
  if (n == m || (n == n0 && m == 1 - n0)) return std::nullopt;
  return std::pair{n0 * g + from % g, (1 - n0) * g + to % g};
}

// The canonical route moved onto the machines of `from` and `to`: machine 0's (1's) devices and hub
// become theirs, shared switches stay; nullopt if it crosses a third machine (searched instead).
std::optional<Route> Router::Impl::move_route(const Route& canonical, int from, int to) const {
  const auto& s = *cluster->machine_symmetry;
  const int g = s.per_machine, n = from / g, m = to / g, n0 = n < m ? 0 : 1, m0 = 1 - n0;
  const int devices = g * static_cast<int>(s.hubs.size());
  auto move = [&](int x) {
    const int k = x < devices ? x / g : hub_machine[static_cast<size_t>(x)];
    if (k < 0) return x;  // a shared switch
    const int to_machine = k == n0 ? n : k == m0 ? m : -1;
    if (to_machine < 0) return -1;
    return x < devices ? to_machine * g + x % g : s.hubs[static_cast<size_t>(to_machine)];
  };
  std::vector<Hop> hops;
  hops.reserve(canonical.hops.size());
  for (const Hop& h : canonical.hops) {
    const Link& l = cluster->links[h.link];
    const int u = move(h.reverse ? l.b : l.a), v = move(h.reverse ? l.a : l.b);
    const int li = u < 0 || v < 0 ? -1 : link_between(links, u, v);
    if (li < 0) return std::nullopt;
    hops.push_back({li, cluster->links[li].a != u});
  }
  return finish(std::move(hops));
}

Router::Router(const Cluster& c) : impl_(new Impl{&c, make_graph(c)}) {
  impl_->dist.assign(c.node_count(), kUnreached);
  impl_->pred_link.assign(c.node_count(), -1);
  std::vector<int> degree(c.node_count(), 0);
  impl_->leaf_link.assign(c.node_count(), -1);
  for (size_t i = 0; i < c.links.size(); ++i) {
    const Link& l = c.links[i];
    if (l.a == l.b) {
      degree[l.a] += 2;
      continue;
    }
    if (++degree[l.a] == 1) impl_->leaf_link[l.a] = static_cast<int>(i);
    if (++degree[l.b] == 1) impl_->leaf_link[l.b] = static_cast<int>(i);
  }
  for (size_t v = 0; v < degree.size(); ++v)
    if (degree[v] != 1) impl_->leaf_link[v] = -1;
  for (size_t i = 0; i < c.routes.size(); ++i)
    impl_->explicit_routes.emplace(pair_key(c.routes[i].from, c.routes[i].to), static_cast<int>(i));
  if (!c.torus_dims.empty() || c.fat_tree || c.machine_symmetry) impl_->links = links_by_endpoints(c);
  if (c.machine_symmetry) {
    impl_->hub_machine.assign(c.node_count(), -1);
    for (size_t n = 0; n < c.machine_symmetry->hubs.size(); ++n)
      impl_->hub_machine[static_cast<size_t>(c.machine_symmetry->hubs[n])] = static_cast<int>(n);
  }
  if (!c.torus_dims.empty()) impl_->torus_points = torus_size(c.torus_dims);
  if (c.fat_tree)
    for (size_t i = 0; i < c.fat_tree->endpoints.size(); ++i)
      impl_->fat_tree_slot.emplace(c.fat_tree->endpoints[i], static_cast<int>(i));
}

const Cluster& Router::cluster() const {
  return *impl_->cluster;
}

Router::~Router() {
  delete impl_;
}

Result<Route> Router::route(int from, int to) const {
  if (from == to) return Route{};
  // Given routes and formulas are cheap to rebuild: only searches are cached.
  const uint64_t key = pair_key(from, to);
  if (auto it = impl_->explicit_routes.find(key); it != impl_->explicit_routes.end())
    return impl_->finish(impl_->cluster->routes[it->second].hops);
  if (from < impl_->torus_points && to < impl_->torus_points) return impl_->torus_route(from, to);
  if (impl_->fat_tree_pair(from, to)) {
    if (std::optional<Route> r = impl_->fat_tree_route(from, to)) return std::move(*r);
    return Error{fmt::format("no route from \"{}\" to \"{}\": the fat-tree's links down leave no up path",
                             impl_->cluster->node_name(from), impl_->cluster->node_name(to))};
  }
  if (std::optional<Route> r = impl_->sibling_route(from, to)) return std::move(*r);
  if (auto moved = impl_->moved_pair(from, to)) {  // alike machines: the canonical pair's route, moved
    Result<Route> canonical = route(moved->first, moved->second);
    if (!canonical) return canonical.error();
    if (std::optional<Route> r = impl_->move_route(*canonical, from, to)) return std::move(*r);
  }
  if (auto it = impl_->cache.find(key); it != impl_->cache.end()) return it->second;
  if (impl_->last_source == from) {
    ++impl_->source_queries;
  } else {
    impl_->last_source = from;
    impl_->source_queries = 1;
  }
  if (impl_->tree_source == from || impl_->source_queries > Impl::kTreeAfter) {
    if (impl_->tree_source != from) (void)impl_->shortest_route(from, -1, /*keep_tree=*/true);
    std::optional<Route> found = impl_->follow(impl_->tree_pred, from, to);
    if (!found) return impl_->not_connected(from, to);
    return std::move(*found);  // cheap to rebuild from the tree: not cached
  }
  Result<Route> found = impl_->shortest_route(from, to);
  if (!found) return found.error();
  return impl_->cache.emplace(key, std::move(*found)).first->second;
}

namespace {

// Hop distances from `source` to every node (-1: unreachable).
std::vector<int> hop_distances(const NetGraph& g, int source) {
  std::vector<int> dist(boost::num_vertices(g), -1);
  dist[source] = 0;
  boost::breadth_first_search(
      g, static_cast<NetGraph::vertex_descriptor>(source),
      boost::visitor(boost::make_bfs_visitor(boost::record_distances(
          boost::make_iterator_property_map(dist.begin(), boost::get(boost::vertex_index, g)),
          boost::on_tree_edge()))));
  return dist;
}

// Maximum flow between two sets of devices over the links (both directions of a link have its
// bandwidth), in bytes/s rounded to integers (push-relabel is exact on integers).
class CutFlow {
 public:
  explicit CutFlow(const Cluster& c) : devices_(static_cast<int>(c.devices.size())) {
    const int n = static_cast<int>(c.node_count());
    graph_ = FlowGraph(n + 2);
    source_ = n;
    sink_ = n + 1;
    long long total = 1;
    for (const Link& l : c.links) {
      const long long cap = std::max<long long>(1, std::llround(l.bandwidth));
      add(l.a, l.b, cap, cap);
      total += cap;
    }
    infinite_ = total;
    for (int d = 0; d < devices_; ++d) {
      from_source_.push_back(add(source_, d, 0, 0));
      to_sink_.push_back(add(d, sink_, 0, 0));
    }
  }

  // in_a[d]: device d is in the sending half; the others receive.
  double flow(const std::vector<char>& in_a) {
    auto cap = boost::get(boost::edge_capacity, graph_);
    for (int d = 0; d < devices_; ++d) {
      cap[from_source_[d]] = in_a[d] ? infinite_ : 0;
      cap[to_sink_[d]] = in_a[d] ? 0 : infinite_;
    }
    return static_cast<double>(boost::push_relabel_max_flow(graph_, source_, sink_));
  }

 private:
  using Traits = boost::adjacency_list_traits<boost::vecS, boost::vecS, boost::directedS>;
  using FlowGraph = boost::adjacency_list<
      boost::vecS, boost::vecS, boost::directedS, boost::no_property,
      boost::property<boost::edge_capacity_t, long long,
                      boost::property<boost::edge_residual_capacity_t, long long,
                                      boost::property<boost::edge_reverse_t, Traits::edge_descriptor>>>>;
  using Edge = FlowGraph::edge_descriptor;

  // An edge u -> v of capacity `forward` paired with v -> u of capacity `backward`.
  Edge add(int u, int v, long long forward, long long backward) {
    Edge e = boost::add_edge(u, v, graph_).first;
    Edge r = boost::add_edge(v, u, graph_).first;
    auto cap = boost::get(boost::edge_capacity, graph_);
    auto rev = boost::get(boost::edge_reverse, graph_);
    cap[e] = forward;
    cap[r] = backward;
    rev[e] = r;
    rev[r] = e;
    return e;
  }

  FlowGraph graph_;
  int devices_;
  int source_ = 0, sink_ = 0;
  long long infinite_ = 0;
  std::vector<Edge> from_source_, to_sink_;
};

// Calls f on every subset of {0..n-1} of size k (as a membership vector), in lexicographic order.
template <class F>
void for_each_subset(int n, int k, bool fix_first, F f) {
  std::vector<int> pick(k);
  std::iota(pick.begin(), pick.end(), 0);
  std::vector<char> in(n);
  while (true) {
    if (!fix_first || (k > 0 && pick[0] == 0)) {
      std::fill(in.begin(), in.end(), 0);
      for (int p : pick) in[p] = 1;
      f(in);
    }
    int i = k - 1;
    while (i >= 0 && pick[i] == n - k + i) --i;
    if (i < 0 || (fix_first && i == 0)) return;
    ++pick[i];
    for (int j = i + 1; j < k; ++j) pick[j] = pick[j - 1] + 1;
  }
}

}  // namespace

Status check_connected(const Cluster& c, ClusterSubject* subject) {
  const std::vector<int> dist = hop_distances(make_graph(c), 0);
  for (size_t d = 1; d < c.devices.size(); ++d)
    if (dist[d] < 0) {
      if (subject) *subject = {ClusterSubject::Kind::Node, static_cast<int>(d)};
      return Error{fmt::format("\"{}\" and \"{}\" are not connected", c.devices[0].name, c.devices[d].name)};
    }
  return {};
}

namespace {

// Whether the cluster is its torus and nothing else: every device a point of torus_dims, no
// switches, and exactly the links between neighbours along each dimension (one per pair; a
// dimension of 2 has one link per pair, of 1 none). Then its diameter is the sum of floor(X / 2).
bool plain_torus(const Cluster& c) {
  if (c.torus_dims.empty() || !c.switches.empty() ||
      torus_size(c.torus_dims) != static_cast<long long>(c.devices.size()))
    return false;
  size_t expected = 0;
  for (int x : c.torus_dims) expected += x == 1 ? 0 : x == 2 ? c.devices.size() / 2 : c.devices.size();
  if (c.links.size() != expected) return false;
  std::set<std::pair<int, int>> seen;
  for (const Link& l : c.links) {
    const std::vector<int> a = torus_coords(c.torus_dims, l.a), b = torus_coords(c.torus_dims, l.b);
    int differing = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      if (a[k] == b[k]) continue;
      const int x = c.torus_dims[k], step = ((b[k] - a[k]) % x + x) % x;
      if (step != 1 && step != x - 1) return false;
      ++differing;
    }
    if (differing != 1 || !seen.insert(std::minmax(l.a, l.b)).second) return false;
  }
  return true;
}

// Largest number of hops between two devices; fails if two are not connected.
Result<int> device_diameter(const Cluster& c, const NetGraph& g) {
  int diameter = 0;
  if (plain_torus(c)) {
    for (int x : c.torus_dims) diameter += x / 2;
    return diameter;
  }
  // A ring of D >= 3 devices and nothing else (each device on two links, one cycle): D / 2.
  const int D = static_cast<int>(c.devices.size());
  if (D >= 3 && c.switches.empty() && c.links.size() == static_cast<size_t>(D)) {
    std::vector<std::vector<int>> next(D);
    for (const Link& l : c.links) {
      next[l.a].push_back(l.b);
      next[l.b].push_back(l.a);
    }
    if (std::all_of(next.begin(), next.end(), [](const auto& n) { return n.size() == 2 && n[0] != n[1]; })) {
      int length = 1;
      for (int prev = 0, at = next[0][0]; at != 0; ++length) {
        const int step = next[at][0] == prev ? next[at][1] : next[at][0];
        prev = at;
        at = step;
      }
      if (length == D) return D / 2;
    }
  }
  // Devices with the same neighbours (devices on one switch port each of the same switch, say) are
  // as far from every other device as each other, and 2 hops apart: one search serves them all
  // (a search from every device made `cluster show` quadratic: minutes for a 131,072-port switch).
  std::vector<std::vector<int>> neighbours(D);
  for (const Link& l : c.links) {
    if (c.is_device(l.a)) neighbours[l.a].push_back(l.b);
    if (c.is_device(l.b)) neighbours[l.b].push_back(l.a);
  }
  std::set<std::vector<int>> searched;
  for (int s = 0; s < D; ++s) {
    std::vector<int>& key = neighbours[s];
    std::sort(key.begin(), key.end());
    key.erase(std::unique(key.begin(), key.end()), key.end());
    if (!searched.insert(std::move(key)).second) continue;
    const std::vector<int> dist = hop_distances(g, s);
    for (int t = 0; t < D; ++t) {
      if (dist[t] < 0)
        return Error{fmt::format("\"{}\" and \"{}\" are not connected", c.node_name(s), c.node_name(t))};
      diameter = std::max(diameter, dist[t]);
    }
  }
  return diameter;
}

}  // namespace

Result<ClusterFigures> cluster_figures(const Cluster& c) {
  ClusterFigures f;
  const int D = static_cast<int>(c.devices.size());
  const NetGraph g = make_graph(c);
  Result<int> diameter = device_diameter(c, g);
  if (!diameter) return diameter.error();
  f.diameter_hops = *diameter;
  if (D < 2) {
    f.bisection_exact = true;
    return f;
  }
  CutFlow cut(c);
  double best = std::numeric_limits<double>::infinity();
  auto consider = [&](const std::vector<char>& in_a) {
    best = std::min(best, cut.flow(in_a));
    ++f.bisection_candidates;
  };
  const int half = D / 2;
  if (D <= kExactBisectionDevices) {
    // With even D a split and its mirror give the same flow: keep device 0 on the sending side.
    for_each_subset(D, half, /*fix_first=*/D % 2 == 0, consider);
    f.bisection_exact = true;
  } else {
    for (int r = 0; r < 4; ++r) {
      std::vector<char> in_a(D, 0);
      const int start = r * D / 8;
      for (int i = 0; i < half; ++i) in_a[(start + i) % D] = 1;
      consider(in_a);
    }
    const long long points = c.torus_dims.empty() ? 0 : torus_size(c.torus_dims);
    if (points == D) {
      for (size_t k = 0; k < c.torus_dims.size(); ++k) {
        if (c.torus_dims[k] % 2 != 0) continue;
        std::vector<char> in_a(D, 0);
        for (int i = 0; i < D; ++i) in_a[i] = torus_coords(c.torus_dims, i)[k] < c.torus_dims[k] / 2;
        consider(in_a);
      }
    }
  }
  f.bisection_bandwidth = best;
  return f;
}

}  // namespace pipegrid
