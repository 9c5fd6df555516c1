// Generators, routing and network figures, checked against hand counts, closed forms and
// independent brute-force computations written here (Floyd-Warshall, cut enumeration).
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/topologies/generators.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using pipegrid::testing::test_device;

namespace {

constexpr LinkSpec kLink{10e9, 1e-6};

// Nodes visited by a route from `from`.
std::vector<std::string> walk(const Cluster& c, int from, const Route& r) {
  std::vector<std::string> out{c.node_name(from)};
  int at = from;
  for (const Hop& h : r.hops) {
    const Link& l = c.links[h.link];
    REQUIRE((h.reverse ? l.b : l.a) == at);
    at = h.reverse ? l.a : l.b;
    out.push_back(c.node_name(at));
  }
  return out;
}

Route route(const Cluster& c, const std::string& a, const std::string& b) {
  Router r(c);
  Result<Route> out = r.route(*c.find_node(a), *c.find_node(b));
  REQUIRE(out.ok());
  return *out;
}

// All-pairs (latency, hops) by Floyd-Warshall: an oracle independent of the Router's Dijkstra.
struct Dist {
  double latency = std::numeric_limits<double>::infinity();
  int hops = 0;
};
std::vector<std::vector<Dist>> floyd(const Cluster& c) {
  const size_t n = c.node_count();
  std::vector<std::vector<Dist>> d(n, std::vector<Dist>(n));
  for (size_t i = 0; i < n; ++i) d[i][i] = {0, 0};
  for (const Link& l : c.links) {
    d[l.a][l.b] = d[l.b][l.a] = {l.latency, 1};
  }
  auto less = [](Dist x, Dist y) {
    return x.latency < y.latency - 1e-15 || (std::fabs(x.latency - y.latency) <= 1e-15 && x.hops < y.hops);
  };
  for (size_t k = 0; k < n; ++k)
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < n; ++j) {
        Dist via{d[i][k].latency + d[k][j].latency, d[i][k].hops + d[k][j].hops};
        if (less(via, d[i][j])) d[i][j] = via;
      }
  return d;
}

// Bisection by enumerating every balanced device split and every side for every switch: the
// smallest total bandwidth of the links cut (max-flow = min-cut).
double brute_force_bisection(const Cluster& c) {
  const int D = static_cast<int>(c.devices.size());
  const int S = static_cast<int>(c.switches.size());
  double best = std::numeric_limits<double>::infinity();
  for (unsigned dm = 0; dm < (1u << D); ++dm) {
    if (__builtin_popcount(dm) != D / 2) continue;
    for (unsigned sm = 0; sm < (1u << S); ++sm) {
      auto side = [&](int node) { return node < D ? (dm >> node) & 1 : (sm >> (node - D)) & 1; };
      double cut = 0;
      for (const Link& l : c.links)
        if (side(l.a) != side(l.b)) cut += l.bandwidth;
      best = std::min(best, cut);
    }
  }
  return best;
}

}  // namespace

TEST_CASE("ring: neighbours linked, routes go the shorter way, figures by hand") {
  Cluster c = *make_ring_cluster(6, "gpu", test_device(), kLink);
  REQUIRE(validate(c).ok());
  CHECK(c.links.size() == 6);
  CHECK(walk(c, 0, route(c, "gpu0", "gpu2")) == std::vector<std::string>{"gpu0", "gpu1", "gpu2"});
  CHECK(walk(c, 0, route(c, "gpu0", "gpu4")) == std::vector<std::string>{"gpu0", "gpu5", "gpu4"});
  ClusterFigures f = *cluster_figures(c);
  CHECK(f.diameter_hops == 3);
  CHECK(f.bisection_exact);
  CHECK(f.bisection_bandwidth == 2 * 10e9);  // a ring is cut in two places
  CHECK(make_ring_cluster(2, "gpu", test_device(), kLink)->links.size() == 1);
  CHECK(make_ring_cluster(1, "gpu", test_device(), kLink)->links.empty());
  CHECK(make_ring_cluster(0, "gpu", test_device(), kLink).error().message ==
        "a ring needs at least 1 device, got 0");
}

TEST_CASE("switch: bisection of n devices is floor(n/2) links") {
  for (int n : {2, 5, 8}) {
    ClusterFigures f = *cluster_figures(make_switch_cluster(n, "gpu", test_device(), 25e9, 1e-6));
    CHECK(f.diameter_hops == 2);
    CHECK(f.bisection_bandwidth == (n / 2) * 25e9);
  }
}

TEST_CASE("torus: dimension-order routing, diameter and bisection 2 k^(n-1) links") {
  Cluster c = *make_torus_cluster({4, 4}, "gpu", test_device(), kLink);
  REQUIRE(validate(c).ok());
  CHECK(c.links.size() == 32);
  // (0,0) -> (3,2): x first, the short way round (one hop down through the wrap), then y upward
  // (two hops either way: the tie goes upward).
  CHECK(walk(c, 0, route(c, "gpu0", "gpu11")) == std::vector<std::string>{"gpu0", "gpu3", "gpu7", "gpu11"});
  // Back: x from 3 to 0 upward through the wrap, then y from 2 to 0 upward (tie) through the wrap.
  CHECK(walk(c, 11, route(c, "gpu11", "gpu0")) == std::vector<std::string>{"gpu11", "gpu8", "gpu12", "gpu0"});
  ClusterFigures f = *cluster_figures(c);
  CHECK(f.diameter_hops == 4);
  CHECK(f.bisection_exact);
  CHECK(f.bisection_bandwidth == 8 * 10e9);
  // 4 x 4 x 4: too many devices for enumeration; the cut across a dimension is 2 x 16 links.
  Cluster c3 = *make_torus_cluster({4, 4, 4}, "gpu", test_device(), kLink);
  ClusterFigures f3 = *cluster_figures(c3);
  CHECK(!f3.bisection_exact);
  CHECK(f3.bisection_bandwidth == 32 * 10e9);
  CHECK(f3.diameter_hops == 6);
  // A dimension of 2 has one link, not two.
  CHECK(make_torus_cluster({2, 3}, "gpu", test_device(), kLink)->links.size() == 3 + 6);
  CHECK(make_torus_cluster({2, 0}, "gpu", test_device(), kLink).error().message ==
        "torus dimensions must be at least 1, got 0");
}

TEST_CASE("diameter: a plain torus's closed form and twin devices agree with a search from every device") {
  // The same links with torus_dims cleared (and a device's order kept) take the search from every
  // device; the sum of floor(X / 2) must match it, including sizes 1, 2 and odd ones.
  for (const std::vector<int>& dims :
       std::vector<std::vector<int>>{{7}, {2, 3}, {1, 5}, {4, 4}, {3, 3, 3}, {2, 2, 2}, {5, 4, 2}, {6}}) {
    Cluster t = *make_torus_cluster(dims, "gpu", test_device(), kLink);
    Cluster plain = t;
    plain.torus_dims.clear();
    INFO("dims " << dims.size() << " first " << dims[0]);
    CHECK(cluster_figures(t)->diameter_hops == cluster_figures(plain)->diameter_hops);
  }
  // Not a plain torus once it has extra links: the search runs. A ring of 8 with chords 0-4 and
  // 2-6: 1 -> 5 and 3 -> 7 take 3 hops (1-0-4-5, 3-2-6-7), every other pair fewer.
  Cluster extra = *make_torus_cluster({8}, "gpu", test_device(), kLink);
  CHECK(cluster_figures(extra)->diameter_hops == 4);
  extra.links.push_back({0, 4, 10e9, 1e-6, Duplex::Full});
  extra.links.push_back({2, 6, 10e9, 1e-6, Duplex::Full});
  CHECK(cluster_figures(extra)->diameter_hops == 3);
  // Rings: D / 2 by the ring rule, against Floyd-Warshall on hop counts; two rings of 4 are not one
  // ring of 8 (not connected).
  for (int n : {3, 4, 5, 8, 9}) {
    Cluster ring = *make_ring_cluster(n, "gpu", test_device(), kLink);
    auto h = floyd(ring);
    int diameter = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) diameter = std::max(diameter, h[i][j].hops);
    CHECK(cluster_figures(ring)->diameter_hops == diameter);
  }
  Cluster two = *make_ring_cluster(8, "gpu", test_device(), kLink);
  two.links = {};
  for (int i = 0; i < 8; ++i) two.links.push_back({i, (i / 4) * 4 + (i + 1) % 4, 10e9, 1e-6, Duplex::Full});
  CHECK_FALSE(cluster_figures(two).ok());
  // Twins: devices 0-3 on switch s0, 4 on s1, s0 -- s1. One search serves 0-3; the diameter is
  // 0 -> 4 (3 hops), and 2 between two of 0-3.
  Cluster star;
  for (int i = 0; i < 5; ++i) star.devices.push_back({"d" + std::to_string(i), test_device(), ""});
  star.switches = {"s0", "s1"};
  for (int i = 0; i < 4; ++i) star.links.push_back({i, 5, 10e9, 1e-6, Duplex::Full});
  star.links.push_back({4, 6, 10e9, 1e-6, Duplex::Full});
  star.links.push_back({5, 6, 10e9, 1e-6, Duplex::Full});
  REQUIRE(validate(star).ok());
  CHECK(cluster_figures(star)->diameter_hops == 3);
  // Every device a twin of every other: one search, diameter 2.
  star = Cluster{};
  for (int i = 0; i < 4; ++i) star.devices.push_back({"d" + std::to_string(i), test_device(), ""});
  star.switches = {"s0"};
  for (int i = 0; i < 4; ++i) star.links.push_back({i, 4, 10e9, 1e-6, Duplex::Full});
  CHECK(cluster_figures(star)->diameter_hops == 2);
}

TEST_CASE("fat-tree: Al-Fares structure, hop counts, full bisection bandwidth k^3/8") {
  Cluster c = *make_fat_tree_cluster(4, 16, "gpu", test_device(), kLink);
  REQUIRE(validate(c).ok());
  CHECK(c.devices.size() == 16);
  CHECK(c.switches.size() == 8 + 8 + 4);
  CHECK(c.links.size() == 16 + 16 + 16);
  CHECK(route(c, "gpu0", "gpu1").hops.size() == 2);   // same edge switch
  CHECK(route(c, "gpu0", "gpu2").hops.size() == 4);   // same pod
  CHECK(route(c, "gpu0", "gpu15").hops.size() == 6);  // across the core
  CHECK(walk(c, 0, route(c, "gpu0", "gpu15"))[3].rfind("core", 0) == 0);
  ClusterFigures f = *cluster_figures(c);
  CHECK(f.diameter_hops == 6);
  CHECK(f.bisection_exact);
  CHECK(f.bisection_bandwidth == 8 * 10e9);
  // Destination-mod-k: gpu0 -> gpu15 (slot 15: aggregation 15 mod 2 = 1, core 1 x 2 + 7 mod 2 = 3).
  CHECK(walk(c, 0, route(c, "gpu0", "gpu15")) ==
        std::vector<std::string>{"gpu0", "edge0-0", "agg0-1", "core3", "agg3-1", "edge3-1", "gpu15"});
  ClusterFigures f8 = *cluster_figures(*make_fat_tree_cluster(8, 128, "gpu", test_device(), kLink));
  CHECK(!f8.bisection_exact);
  CHECK(f8.bisection_bandwidth == 64 * 10e9);
  CHECK(make_fat_tree_cluster(5, 10, "gpu", test_device(), kLink).error().message ==
        "a k-ary fat-tree needs an even k from 2 to 128, got 5");
  CHECK(make_fat_tree_cluster(4, 17, "gpu", test_device(), kLink).error().message ==
        "a 4-ary fat-tree has room for 1 to 16 devices, got 17");
}

TEST_CASE(
    "fat-tree routing: a pod-to-pod shift of a 16-ary fat-tree uses every link direction at most once") {
  // Slot j of pod s sends to slot j of pod s + 1 for every j and s at once (the activations of a
  // pipeline of pods; then, separately, the gradients back): with destination-mod-k no two of these
  // 15 x 64 routes share a link direction, so none slows another.
  Cluster c = *make_fat_tree_cluster(16, 1024, "gpu", test_device(), kLink);
  REQUIRE(validate(c).ok());
  Router r(c);
  for (int shift : {64, -64}) {
    std::set<std::pair<int, bool>> used;
    int hops = 0;
    for (int from = std::max(0, -shift); from < 1024 - std::max(0, shift); ++from) {
      const Route route = *r.route(from, from + shift);
      for (const Hop& h : route.hops) {
        CHECK(used.insert({h.link, h.reverse}).second);
        ++hops;
      }
    }
    CHECK(hops == 15 * 64 * 6);
  }
}

TEST_CASE("dragonfly: one global link between groups, minimal routes, brute-force bisection") {
  DragonflySpec s;
  s.groups = 3;
  s.routers = 2;
  s.hosts = 2;
  s.global = 1;
  s.device = test_device();
  s.host_link = s.local_link = kLink;
  s.global_link = {5e9, 2e-6};
  Cluster c = *make_dragonfly_cluster(s);
  REQUIRE(validate(c).ok());
  CHECK(c.devices.size() == 12);
  CHECK(c.links.size() == 12 + 3 + 3);
  // Group 0 reaches group 1 through router0-0 and group 2 through router0-1.
  std::vector<std::string> w = walk(c, 0, route(c, "gpu0", "gpu4"));
  CHECK(w == std::vector<std::string>{"gpu0", "router0-0", "router1-1", "router1-0", "gpu4"});
  ClusterFigures f = *cluster_figures(c);
  CHECK(f.diameter_hops == 5);
  CHECK(f.bisection_bandwidth == brute_force_bisection(c));
  // Two global ports per router, two groups to reach: every port used, two links between every two
  // groups, each router with two global links (until 2026-12-05 one link per pair, all on the
  // routers -0, the routers -1 left without any).
  s.global = 2;
  Cluster two = *make_dragonfly_cluster(s);
  REQUIRE(validate(two).ok());
  CHECK(two.links.size() == 12 + 3 + 6);
  std::map<std::string, int> global_ends;
  for (const Link& l : two.links) {
    const std::string a = two.node_name(l.a), b = two.node_name(l.b);
    if (a.rfind("router", 0) == 0 && b.rfind("router", 0) == 0 && a.substr(0, 7) != b.substr(0, 7)) {
      ++global_ends[a];
      ++global_ends[b];
    }
  }
  CHECK(global_ends == std::map<std::string, int>{{"router0-0", 2},
                                                  {"router0-1", 2},
                                                  {"router1-0", 2},
                                                  {"router1-1", 2},
                                                  {"router2-0", 2},
                                                  {"router2-1", 2}});
  // Three ports per router (6 per group) for 2 other groups: 3 links per pair, every port used.
  s.global = 3;
  CHECK(make_dragonfly_cluster(s)->links.size() == 12 + 3 + 9);
  s.global = 0;
  CHECK(make_dragonfly_cluster(s).error().message ==
        "a dragonfly of 3 groups needs routers x global >= 2 (one global link to every other group), got 2 x "
        "0");
}

TEST_CASE("dgx: NVLink inside a node, InfiniBand across, switch or fat-tree fabric") {
  DgxSpec s;
  s.nodes = 2;
  s.gpu = test_device();
  Cluster c = *make_dgx_cluster(s);
  REQUIRE(validate(c).ok());
  CHECK(c.devices.size() == 16);
  CHECK(c.devices[9].node == "dgx1");
  Route in = route(c, "gpu0", "gpu7");
  CHECK(walk(c, 0, in) == std::vector<std::string>{"gpu0", "dgx0-nvswitch", "gpu7"});
  CHECK(in.latency == pipegrid::testing::approx(1e-6));
  CHECK(in.bandwidth == 300e9);
  Route across = route(c, "gpu0", "gpu8");
  CHECK(walk(c, 0, across) == std::vector<std::string>{"gpu0", "ib-switch", "gpu8"});
  CHECK(across.latency == pipegrid::testing::approx(2e-6));
  CHECK(across.bandwidth == 25e9);
  s.fabric = DgxSpec::Fabric::FatTree;
  Cluster t = *make_dgx_cluster(s);
  REQUIRE(validate(t).ok());
  CHECK(t.switches.size() == 2 + 20);  // 16 NICs: the 4-ary fat-tree
  CHECK(route(t, "gpu0", "gpu8").hops.size() == 6);
  CHECK(route(t, "gpu0", "gpu1").hops.size() == 2);  // NVLink, not the edge switch (1 us < 2 us)
  // Two nodes of two GPUs: small enough to check the bisection by brute force.
  s.gpus_per_node = 2;
  s.fabric = DgxSpec::Fabric::Switch;
  Cluster small = *make_dgx_cluster(s);
  CHECK(cluster_figures(small)->bisection_bandwidth == brute_force_bisection(small));
  CHECK(cluster_figures(small)->bisection_bandwidth == 2 * 25e9);
}

TEST_CASE("summit: NVLink pairs per socket, X-Bus between sockets, one EDR rail per socket") {
  SummitSpec s;
  s.nodes = 2;
  s.gpu = test_device();
  Cluster c = *make_summit_cluster(s);
  REQUIRE(validate(c).ok());
  CHECK(c.devices.size() == 8);
  CHECK(walk(c, 0, route(c, "gpu0", "gpu1")) == std::vector<std::string>{"gpu0", "gpu1"});
  Route sockets = route(c, "gpu0", "gpu2");
  CHECK(walk(c, 0, sockets) == std::vector<std::string>{"gpu0", "summit0-cpu0", "summit0-cpu1", "gpu2"});
  CHECK(sockets.latency == pipegrid::testing::approx(1.5e-6));
  CHECK(sockets.bandwidth == 50e9);
  Route nodes = route(c, "gpu0", "gpu4");
  CHECK(walk(c, 0, nodes) ==
        std::vector<std::string>{"gpu0", "summit0-cpu0", "ib-switch", "summit1-cpu0", "gpu4"});
  CHECK(nodes.latency == pipegrid::testing::approx(3e-6));
  CHECK(nodes.bandwidth == 12.5e9);
  Cluster one = *make_summit_cluster({1, test_device()});
  CHECK(cluster_figures(one)->bisection_bandwidth == brute_force_bisection(one));
}

TEST_CASE("FPGA ring and torus: direct QSFP links, optional PCIe host links") {
  FpgaClusterSpec s;
  s.dims = {4};
  s.device = test_device();
  s.pcie = true;
  s.per_host = 2;
  Cluster c = *make_fpga_cluster(s);
  REQUIRE(validate(c).ok());
  CHECK(c.devices[1].name == "fpga1");
  CHECK(c.devices[1].node == "host0");
  CHECK(c.devices[2].node == "host1");
  CHECK(c.switches == std::vector<std::string>{"host0", "host1"});
  CHECK(c.links.size() == 4 + 4);
  CHECK(walk(c, 0, route(c, "fpga0", "fpga1")) == std::vector<std::string>{"fpga0", "fpga1"});
  s.qsfp.latency = 5e-6;  // now PCIe through the host (2 x 1 us) is faster between FPGAs of a host
  Cluster slow = *make_fpga_cluster(s);
  CHECK(walk(slow, 0, route(slow, "fpga0", "fpga1")) == std::vector<std::string>{"fpga0", "host0", "fpga1"});
  FpgaClusterSpec t;
  t.dims = {2, 3};
  t.torus = true;
  t.device = test_device();
  Cluster torus = *make_fpga_cluster(t);
  CHECK(torus.torus_dims == std::vector<int>{2, 3});
  CHECK(torus.name == "fpga-torus");
  CHECK(torus.links[0].bandwidth == 12.5e9);
  // A device that states its ports: 2 QSFP28 ports carry a ring, not a 2 x 3 torus (1 + 2 ports).
  t.device.fpga = FpgaSpec{};
  t.device.fpga->ports = 2;
  t.device.fpga->port_bandwidth = 11e9;
  CHECK(make_fpga_cluster(t).error().message ==
        "an FPGA torus 2 x 3 needs 3 network ports per FPGA, the device has 2 (set its `ports`)");
  t.device.fpga->ports = 3;
  CHECK(make_fpga_cluster(t)->links[0].bandwidth == 11e9);
}

TEST_CASE("routes: every computed route is a shortest path by latency, then hops (Floyd-Warshall)") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    Cluster c;
    const int n = 4 + trial % 5, s = trial % 4;
    for (int i = 0; i < n; ++i) c.devices.push_back({"d" + std::to_string(i), test_device(), ""});
    for (int i = 0; i < s; ++i) c.switches.push_back("s" + std::to_string(i));
    const int nodes = n + s;
    std::set<std::pair<int, int>> used;
    for (int i = 1; i < nodes; ++i) {  // a spanning tree keeps it connected
      int j = std::uniform_int_distribution<int>(0, i - 1)(rng);
      used.insert({j, i});
    }
    for (int e = 0; e < nodes; ++e) {
      int a = std::uniform_int_distribution<int>(0, nodes - 1)(rng);
      int b = std::uniform_int_distribution<int>(0, nodes - 1)(rng);
      if (a != b) used.insert(std::minmax(a, b));
    }
    for (auto [a, b] : used)
      c.links.push_back({a, b, 1e9, std::uniform_int_distribution<int>(0, 3)(rng) * 1e-6, Duplex::Full});
    REQUIRE(validate(c).ok());
    auto d = floyd(c);
    Router r(c), grouped(c);
    int diameter = 0;
    for (int i = 0; i < nodes; ++i)
      for (int j = 0; j < nodes; ++j) {
        Route rt = *r.route(j, i);  // a new source every time: searches that stop at the destination
        INFO("trial " << trial << " " << j << "->" << i);
        CHECK(rt.latency == pipegrid::testing::approx(d[j][i].latency));
        CHECK(static_cast<int>(rt.hops.size()) == d[j][i].hops);
      }
    // Grouped by source, the router answers from whole shortest-path trees: the same routes.
    for (int j = 0; j < nodes; ++j)
      for (int i = 0; i < nodes; ++i) CHECK(grouped.route(j, i)->hops == r.route(j, i)->hops);
    // Diameter in hops: Floyd-Warshall on hop counts alone.
    Cluster hops_only = c;
    for (Link& l : hops_only.links) l.latency = 1;
    auto h = floyd(hops_only);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) diameter = std::max(diameter, h[i][j].hops);
    CHECK(cluster_figures(c)->diameter_hops == diameter);
    if (s <= 3) CHECK(cluster_figures(c)->bisection_bandwidth == brute_force_bisection(c));
  }
}

TEST_CASE("explicit routes take precedence and are validated as walks") {
  Cluster c = *make_ring_cluster(4, "gpu", test_device(), kLink);
  // gpu0 -> gpu1 the long way round: links 3 (gpu3--gpu0), 2 (gpu2--gpu3), 1 (gpu1--gpu2), each
  // from b to a; the last hop is first given the wrong way.
  c.routes.push_back({0, 1, {{3, true}, {2, true}, {1, false}}});
  Status bad = validate(c);
  CHECK(bad.error().message ==
        "route 0 from \"gpu0\" to \"gpu1\": hop 2 (link \"gpu1\"--\"gpu2\") does not start at \"gpu2\"");
  c.routes[0].hops[2].reverse = true;
  CHECK(validate(c).ok() == true);
  Route r = route(c, "gpu0", "gpu1");
  CHECK(walk(c, 0, r) == std::vector<std::string>{"gpu0", "gpu3", "gpu2", "gpu1"});
  CHECK(route(c, "gpu1", "gpu0").hops.size() == 1);  // the other direction is computed
  c.routes.push_back(c.routes[0]);
  CHECK(validate(c).error().message == "route 1 duplicates another route from \"gpu0\" to \"gpu1\"");
  c.routes.pop_back();
  c.routes[0].hops.pop_back();
  CHECK(validate(c).error().message == "route 0 from \"gpu0\" to \"gpu1\" ends at \"gpu2\"");
}

TEST_CASE("disconnected devices: the figures name the pair") {
  Cluster c = make_switch_cluster(3, "gpu", test_device(), 1e9, 0);
  c.links.pop_back();
  CHECK(cluster_figures(c).error().message == "\"gpu0\" and \"gpu2\" are not connected");
}

TEST_CASE("dgx1: the V100 cube-mesh has 6 NVLink2 links per GPU, 16 linked pairs, the rest over PCIe") {
  // Independent count from the `nvidia-smi topo -m` matrix of a DGX-1V (rows GPU0..GPU7, 0 = no
  // NVLink, the diagonal unused), written here rather than taken from kDgx1Links.
  const int topo[8][8] = {{0, 1, 1, 2, 2, 0, 0, 0}, {1, 0, 2, 1, 0, 2, 0, 0}, {1, 2, 0, 2, 0, 0, 1, 0},
                          {2, 1, 2, 0, 0, 0, 0, 1}, {2, 0, 0, 0, 0, 1, 1, 2}, {0, 2, 0, 0, 1, 0, 2, 1},
                          {0, 0, 1, 0, 1, 2, 0, 2}, {0, 0, 0, 1, 2, 1, 2, 0}};
  Dgx1Spec s;
  s.gpu = test_device();
  Cluster c = *make_dgx1_cluster(s);
  REQUIRE(validate(c).ok());
  CHECK(c.devices.size() == 8);
  Router r(c);
  for (int a = 0; a < 8; ++a) {
    int links = 0;
    for (int b = 0; b < 8; ++b) {
      links += topo[a][b];
      if (a == b) continue;
      INFO("gpu" << a << " -> gpu" << b);
      Route route = *r.route(a, b);
      if (topo[a][b] > 0) {
        // One NVLink bundle: 25 GB/s per link, 1 us.
        CHECK(route.hops.size() == 1);
        CHECK(route.bandwidth == topo[a][b] * 25e9);
        CHECK(route.latency == pipegrid::testing::approx(1e-6));
      } else {
        // No NVLink: every such pair is across the two quads, so across the CPUs: GPU-PLX, PLX-CPU,
        // QPI, CPU-PLX, PLX-GPU = 4 PCIe links of 1 us + 0.5 us QPI; the PCIe link (15.75 GB/s) is the
        // bottleneck (QPI 38.4 GB/s).
        CHECK(a / 4 != b / 4);
        CHECK(route.hops.size() == 5);
        CHECK(route.bandwidth == 15.75e9);
        CHECK(route.latency == pipegrid::testing::approx(4.5e-6));
      }
    }
    CHECK(links == 6);
  }
  CHECK(walk(c, 0, route(c, "gpu0", "gpu5")) ==
        std::vector<std::string>{"gpu0", "dgx1-0-plx0", "dgx1-0-cpu0", "dgx1-0-cpu1", "dgx1-0-plx2", "gpu5"});
}

TEST_CASE("dgx1: NVLink forwarding, a PCIe-only server, NVLink1 and the network between servers") {
  Dgx1Spec s;
  s.gpu = test_device();
  s.nvlink_forwarding = true;
  Cluster fwd = *make_dgx1_cluster(s);
  // gpu0 -> gpu5 has no NVLink: two NVLink hops (1 + 1 us) beat PCIe (4.5 us). Through gpu1 (0-1 one
  // link, 1-5 two links: 25 GB/s) or gpu4 (0-4 two links, 4-5 one link: 25 GB/s): either way 25 GB/s.
  Route two = route(fwd, "gpu0", "gpu5");
  CHECK(two.hops.size() == 2);
  CHECK(two.latency == pipegrid::testing::approx(2e-6));
  CHECK(two.bandwidth == 25e9);

  s.nvlink_forwarding = false;
  s.servers = 2;
  s.kinds = {Dgx1Spec::Kind::NvLink1, Dgx1Spec::Kind::Pcie};
  s.network = {3.125e9, 5e-6};  // 25 Gb/s Ethernet
  s.nics = 1;
  Cluster c = *make_dgx1_cluster(s);
  REQUIRE(validate(c).ok());
  CHECK(c.devices.size() == 16);
  CHECK(c.devices[9].node == "dgx1-1");
  // NVLink1 server: the two-link pair 0-3 of a V100 is one 20 GB/s link.
  CHECK(route(c, "gpu0", "gpu3").bandwidth == 20e9);
  // PCIe server: gpu8-gpu9 share a PCIe switch (2 links, 2 us); gpu8-gpu10 meet at the CPU (4 links);
  // gpu8-gpu12 cross QPI (4.5 us). Never the network, though its NICs would be as short.
  CHECK(walk(c, 8, route(c, "gpu8", "gpu9")) == std::vector<std::string>{"gpu8", "dgx1-1-plx0", "gpu9"});
  CHECK(route(c, "gpu8", "gpu9").latency == pipegrid::testing::approx(2e-6));
  CHECK(route(c, "gpu8", "gpu10").latency == pipegrid::testing::approx(4e-6));
  CHECK(route(c, "gpu8", "gpu12").latency == pipegrid::testing::approx(4.5e-6));
  CHECK(route(c, "gpu8", "gpu12").bandwidth == 15.75e9);
  // Between servers with one NIC each (on PCIe switch 0): gpu0 -> plx0 -> net -> plx0 of server 1 ->
  // gpu8: PCIe 1 + Ethernet 5 + 5 + PCIe 1 = 12 us, bottleneck 3.125 GB/s.
  Route across = route(c, "gpu0", "gpu8");
  CHECK(walk(c, 0, across) ==
        std::vector<std::string>{"gpu0", "dgx1-0-plx0", "net-switch", "dgx1-1-plx0", "gpu8"});
  CHECK(across.latency == pipegrid::testing::approx(12e-6));
  CHECK(across.bandwidth == 3.125e9);
  CHECK_FALSE(make_dgx1_cluster({.servers = 0}).ok());
}
