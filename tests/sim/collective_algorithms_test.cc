// Every algorithm of core/collectives.h in its two views: the flows it appends, replayed in SimGrid on
// an uncontended network, against its closed form, on a ring of links, a switch and a two-node DGX.
// The closed forms are the textbook ones (docs/reference/closed-forms.md for the ring; the others
// derived in collectives.h and here), so each case checks the flows against an independent count.
#include <doctest/doctest.h>

#include <functional>

#include "core/collectives.h"
#include "core/topologies/generators.h"
#include "sim/replay.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

using Append = std::function<void(TaskGraph&, const std::vector<int>&, const std::vector<Deps>&)>;

// Replays one collective among `devices` of c, everything ready at time 0; returns its time.
double simulated(const Cluster& c, const std::vector<int>& devices, const Append& append) {
  TaskGraph g;
  g.device_order.resize(c.devices.size());
  g.static_memory.resize(c.devices.size());
  append(g, devices, std::vector<Deps>(devices.size()));
  Result<sim::Replay> r = process::replay_isolated(c, g);
  REQUIRE(r.ok());
  return r->timeline.makespan();
}

std::vector<int> first(int n) {
  std::vector<int> d(n);
  for (int i = 0; i < n; ++i) d[i] = i;
  return d;
}

LinkCost cost_of(const Cluster& c, int from, int to) {
  Router router(c);
  Result<Route> r = router.route(from, to);
  REQUIRE(r.ok());
  return LinkCost{r->latency, r->bandwidth};
}

const FlowTag kTag{TransferKind::DataParallel, 0, -1};
// Exact up to SimGrid's rounding of flow rates and dates (relative 1e-7 seen on the switch).
constexpr double kExact = 1e-6;

// The three networks: n devices on a ring of links (each hop one link), n on one switch (each hop
// two links), and two DGX-style nodes of four (NVSwitch inside, one InfiniBand NIC per GPU).
Cluster ring(int n) {
  return *make_ring_cluster(n, "gpu", test_device(), {25e9, 2e-6});
}
Cluster star(int n) {
  return make_switch_cluster(n, "gpu", test_device(), 10e9, 1e-6);
}
Cluster dgx2() {
  DgxSpec s;
  s.gpu = test_device();
  s.nodes = 2;
  s.gpus_per_node = 4;
  s.nvlink = {300e9, 0.5e-6};
  s.infiniband = {25e9, 1e-6};
  return *make_dgx_cluster(s);
}

}  // namespace

TEST_CASE(
    "stepped rings: all-reduce 2 (n - 1) (a + S/(nB)), reduce-scatter and all-gather (n - 1) (a + S/(nB))") {
  const double S = 3e8;
  struct Net {
    Cluster c;
    std::vector<int> devices;  // a ring whose every hop costs the same
  };
  std::vector<Net> nets;
  for (int n : {2, 3, 5}) nets.push_back({ring(n), first(n)});
  nets.push_back({star(5), first(5)});
  nets.push_back({dgx2(), {0, 1, 2, 3}});  // inside one node: every hop over the NVSwitch
  nets.push_back({dgx2(), {0, 4}});        // across the nodes: both hops over InfiniBand
  for (const Net& net : nets) {
    const int n = static_cast<int>(net.devices.size());
    const LinkCost hop = cost_of(net.c, net.devices[0], net.devices[1]);
    INFO("n=" << n << " devices " << net.c.devices.size());
    CHECK(close_rel(simulated(net.c, net.devices,
                              [&](TaskGraph& g, const auto& d, const auto& r) {
                                append_ring_allreduce(g, d, r, S, kTag);
                              }),
                    closed_form::ring_allreduce(n, S, hop), kExact));
    CHECK(close_rel(simulated(net.c, net.devices,
                              [&](TaskGraph& g, const auto& d, const auto& r) {
                                append_ring_reduce_scatter(g, d, r, S, kTag);
                              }),
                    closed_form::ring_reduce_scatter(n, S, hop), kExact));
    CHECK(close_rel(simulated(net.c, net.devices,
                              [&](TaskGraph& g, const auto& d, const auto& r) {
                                append_ring_allgather(g, d, r, S, kTag);
                              }),
                    closed_form::ring_allgather(n, S, hop), kExact));
  }
}

TEST_CASE("merged rings: one flow per device of ring_flow_bytes, a + ring_flow_bytes / B") {
  const double S = 2e8;
  for (CollectiveKind k :
       {CollectiveKind::AllReduce, CollectiveKind::AllGather, CollectiveKind::ReduceScatter}) {
    for (int n : {2, 4}) {
      Cluster c = ring(n);
      INFO(to_string(k) << " ring n=" << n);
      CHECK(close_rel(simulated(c, first(n),
                                [&](TaskGraph& g, const auto& d, const auto& r) {
                                  append_merged_ring(g, k, d, r, S, kTag);
                                }),
                      closed_form::merged_ring(k, n, S, cost_of(c, 0, 1)), kExact));
    }
    Cluster s = star(6);
    CHECK(close_rel(simulated(s, first(6),
                              [&](TaskGraph& g, const auto& d, const auto& r) {
                                append_merged_ring(g, k, d, r, S, kTag);
                              }),
                    closed_form::merged_ring(k, 6, S, cost_of(s, 0, 1)), kExact));
    Cluster d = dgx2();
    CHECK(close_rel(simulated(d, {4, 5, 6, 7},
                              [&](TaskGraph& g, const auto& dv, const auto& r) {
                                append_merged_ring(g, k, dv, r, S, kTag);
                              }),
                    closed_form::merged_ring(k, 4, S, cost_of(d, 4, 5)), kExact));
  }
  // Merged and stepped rings carry the same bytes: without latency, the same time.
  Cluster c = *make_ring_cluster(4, "gpu", test_device(), {25e9, 0});
  CHECK(close_rel(
      simulated(c, first(4),
                [&](TaskGraph& g, const auto& d, const auto& r) {
                  append_merged_ring(g, CollectiveKind::AllReduce, d, r, S, kTag);
                }),
      simulated(c, first(4),
                [&](TaskGraph& g, const auto& d, const auto& r) { append_ring_allreduce(g, d, r, S, kTag); }),
      1e-9));
}

TEST_CASE(
    "ring shift (context parallelism's K/V ring step): every device sends S to the next at once, a + S / B") {
  const double S = 3e8;
  for (int n : {2, 3, 5}) {
    Cluster c = ring(n);
    INFO("ring n=" << n);
    CHECK(close_rel(
        simulated(c, first(n),
                  [&](TaskGraph& g, const auto& d, const auto& r) { append_ring_shift(g, d, r, S, kTag); }),
        closed_form::ring_shift(n, S, cost_of(c, 0, 1)), kExact));
  }
  Cluster d = dgx2();
  CHECK(close_rel(
      simulated(d, {4, 5, 6, 7},
                [&](TaskGraph& g, const auto& dv, const auto& r) { append_ring_shift(g, dv, r, S, kTag); }),
      closed_form::ring_shift(4, S, cost_of(d, 4, 5)), kExact));
}

TEST_CASE("hierarchical all-reduce and reduce-scatter on two DGX nodes: reduce, leaders' ring, broadcast") {
  // Reduce: the m - 1 flows of S share the leader's NVSwitch port; leaders' ring over InfiniBand;
  // then the leader's port again, with S (all-reduce) or S / n (reduce-scatter) per device.
  Cluster c = dgx2();
  const double S = 1e9;
  const LinkCost leader = cost_of(c, 1, 0), inter = cost_of(c, 0, 4);
  CHECK(close_rel(simulated(c, first(8),
                            [&](TaskGraph& g, const auto& d, const auto& r) {
                              append_hierarchical(g, c, CollectiveKind::AllReduce, d, r, S, kTag);
                            }),
                  closed_form::hierarchical_allreduce(2, 4, S, leader, inter), kExact));
  const double reduce = leader.latency + 3 * S / leader.bandwidth;
  const double scatter = leader.latency + 3 * (S / 8) / leader.bandwidth;
  CHECK(close_rel(simulated(c, first(8),
                            [&](TaskGraph& g, const auto& d, const auto& r) {
                              append_hierarchical(g, c, CollectiveKind::ReduceScatter, d, r, S, kTag);
                            }),
                  reduce + closed_form::ring_reduce_scatter(2, S, inter) + scatter, kExact));
  // On a ring of one device per machine there is nothing to reduce inside a machine: the ring.
  Cluster r = ring(4);
  CHECK(close_rel(simulated(r, first(4),
                            [&](TaskGraph& g, const auto& d, const auto& rd) {
                              append_hierarchical(g, r, CollectiveKind::AllReduce, d, rd, S, kTag);
                            }),
                  closed_form::ring_allreduce(4, S, cost_of(r, 0, 1)), kExact));
}

TEST_CASE("multi-ring all-reduce on two DGX nodes: m rings, one per NIC, within 2% when bandwidth-bound") {
  // Bandwidth-bound (latencies 0.1 us against steps of ~1 ms): the closed form's per-step time is
  // the NIC's c / B_ib (the NVSwitch port's 3 c / B_nv is far below). The rings are not in lockstep
  // (no barrier per step), so it is exact only up to their drift: 2% here.
  DgxSpec s;
  s.gpu = test_device();
  s.nodes = 2;
  s.gpus_per_node = 4;
  s.nvlink = {2400e9, 0.1e-6};
  s.infiniband = {25e9, 0.1e-6};
  Cluster c = *make_dgx_cluster(s);
  const double S = 4e9;
  CHECK(close_rel(simulated(c, first(8),
                            [&](TaskGraph& g, const auto& d, const auto& r) {
                              append_multiring(g, c, CollectiveKind::AllReduce, d, r, S, kTag);
                            }),
                  closed_form::multiring_allreduce(2, 4, S, cost_of(c, 0, 1), cost_of(c, 0, 4)), 0.02));
  // On a ring of links (one device per machine) it is the ring.
  Cluster rg = ring(4);
  CHECK(close_rel(simulated(rg, first(4),
                            [&](TaskGraph& g, const auto& d, const auto& r) {
                              append_multiring(g, rg, CollectiveKind::AllReduce, d, r, S, kTag);
                            }),
                  closed_form::multiring_allreduce(4, 1, S, cost_of(rg, 0, 1), cost_of(rg, 0, 1)), kExact));
}

TEST_CASE("all-to-all: every pair at once, each port carrying what its device sends and receives") {
  const double c_pair = 5e7;
  auto uniform = [&](int n) {
    std::vector<std::vector<double>> b(n, std::vector<double>(n, c_pair));
    for (int i = 0; i < n; ++i) b[i][i] = 0;
    return b;
  };
  auto a2a = [&](const std::vector<std::vector<double>>& b) {
    return [b](TaskGraph& g, const std::vector<int>& d, const std::vector<Deps>& r) {
      append_all_to_all(g, d, r, b, kTag);
    };
  };
  // Two devices on one link (a ring of two): a + c / B.
  Cluster two = ring(2);
  CHECK(close_rel(simulated(two, first(2), a2a(uniform(2))),
                  closed_form::all_to_all(2, c_pair, cost_of(two, 0, 1)), 1e-9));
  // A switch: each device's link carries (n - 1) c each way.
  Cluster s = star(6);
  CHECK(close_rel(simulated(s, first(6), a2a(uniform(6))),
                  closed_form::all_to_all(6, c_pair, cost_of(s, 0, 1)), 1e-9));
  // Two DGX nodes: NVSwitch port (m - 1) c, NIC (n - m) c, at once.
  Cluster d = dgx2();
  const double two_tier = closed_form::all_to_all(2, 4, c_pair, cost_of(d, 0, 1), cost_of(d, 0, 4));
  CHECK(close_rel(simulated(d, first(8), a2a(uniform(8))), two_tier, kExact));
  CHECK(two_tier > 4 * c_pair / 25e9);  // the NIC's 4 x 50 MB at 25 GB/s, not the NVSwitch, paces it
  // An uneven exchange is paced by its busiest port: device 0 sends 3 c to each of the others.
  std::vector<std::vector<double>> skew = uniform(6);
  for (int j = 1; j < 6; ++j) skew[0][j] = 3 * c_pair;
  const LinkCost port = cost_of(s, 0, 1);
  CHECK(close_rel(simulated(s, first(6), a2a(skew)), port.latency + 5 * 3 * c_pair / port.bandwidth, kExact));
}

TEST_CASE("node-aggregated all-to-all: two flows per device, ending when the pairwise exchange does") {
  const double c_pair = 5e7;
  std::vector<std::vector<double>> uniform;
  auto pairwise = [&](TaskGraph& g, const std::vector<int>& d, const std::vector<Deps>& r) {
    uniform.assign(d.size(), std::vector<double>(d.size(), c_pair));
    for (size_t i = 0; i < d.size(); ++i) uniform[i][i] = 0;
    append_all_to_all(g, d, r, uniform, kTag);
  };
  auto aggregated = [&](const Cluster& c) {
    return [&c, c_pair](TaskGraph& g, const std::vector<int>& d, const std::vector<Deps>& r) {
      auto layout = node_layout(c, d);
      REQUIRE(layout);
      append_node_aggregated_all_to_all(g, d, layout->first, layout->second, r, c_pair, kTag);
      CHECK(g.tasks.size() == d.size() * static_cast<size_t>(node_aggregated_flows(static_cast<int>(d.size()),
                                                                                   layout->second)));
    };
  };
  // One node (a switch): each device's port carries (n - 1) c each way in both forms.
  Cluster s = star(6);
  CHECK(close_rel(simulated(s, first(6), aggregated(s)), simulated(s, first(6), pairwise), kExact));
  CHECK(close_rel(simulated(s, first(6), aggregated(s)), closed_form::all_to_all(6, c_pair, cost_of(s, 0, 1)),
                  kExact));
  // Two DGX nodes of four: (m - 1) c on each NVSwitch port, (n - m) c on each NIC, as the closed form.
  Cluster d = dgx2();
  const double two_tier = closed_form::all_to_all(2, 4, c_pair, cost_of(d, 0, 1), cost_of(d, 0, 4));
  CHECK(close_rel(simulated(d, first(8), aggregated(d)), two_tier, kExact));
  // Four nodes of eight on a rail-optimised fabric: the pairwise exchange crosses rails through the
  // non-blocking spine, the aggregated one stays on its rail; the NICs pace both.
  DgxSpec r;
  r.gpu = test_device();
  r.nodes = 4;
  r.gpus_per_node = 8;
  r.fabric = DgxSpec::Fabric::Rail;
  Cluster rail = *make_dgx_cluster(r);
  const double four = closed_form::all_to_all(4, 8, c_pair, cost_of(rail, 0, 1), cost_of(rail, 0, 8));
  CHECK(close_rel(simulated(rail, first(32), aggregated(rail)), four, kExact));
  CHECK(close_rel(simulated(rail, first(32), pairwise), four, kExact));
  // Nodes holding unequal shares of the group: no layout (the lowering falls back to pairwise).
  CHECK_FALSE(node_layout(d, {0, 1, 2, 4}));
}

TEST_CASE("chain broadcast: (n - 2 + k) (a + S / (k B)), k pipelined chunks") {
  const double S = 4e8;
  for (int k : {1, 4, 16}) {
    for (int n : {2, 3, 5}) {
      Cluster c = ring(n);
      INFO("ring n=" << n << " k=" << k);
      CHECK(close_rel(simulated(c, first(n),
                                [&](TaskGraph& g, const auto& d, const auto& r) {
                                  append_chain_broadcast(g, d, r, S, k, kTag);
                                }),
                      closed_form::chain_broadcast(n, S, k, cost_of(c, 0, 1)), kExact));
    }
    Cluster s = star(5);
    CHECK(close_rel(simulated(s, first(5),
                              [&](TaskGraph& g, const auto& d, const auto& r) {
                                append_chain_broadcast(g, d, r, S, k, kTag);
                              }),
                    closed_form::chain_broadcast(5, S, k, cost_of(s, 0, 1)), kExact));
    Cluster d = dgx2();
    CHECK(close_rel(simulated(d, {0, 1, 2, 3},
                              [&](TaskGraph& g, const auto& dv, const auto& r) {
                                append_chain_broadcast(g, dv, r, S, k, kTag);
                              }),
                    closed_form::chain_broadcast(4, S, k, cost_of(d, 0, 1)), kExact));
  }
}

TEST_CASE("send/receive: a + S / B on a link, a switch and across two DGX nodes") {
  const double S = 1e8;
  for (Cluster c : {ring(2), star(3), dgx2()}) {
    const int to = static_cast<int>(c.devices.size()) - 1;
    CHECK(close_rel(
        simulated(c, {0, to},
                  [&](TaskGraph& g, const auto& d, const auto&) { append_send(g, d[0], d[1], S, {}, kTag); }),
        closed_form::send(S, cost_of(c, 0, to)), kExact));
  }
}
