// All-reduce collectives as transfers on the simulated network, against closed forms
// (docs/reference/closed-forms.md for the ring; the hierarchical one derived in the test).
#include "core/collectives.h"

#include <doctest/doctest.h>

#include "core/planners/common.h"
#include "core/topologies/generators.h"
#include "sim/replay.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

// Time of one all-reduce of `bytes` among the first n devices of c, everything ready at 0.
double allreduce_time(const Cluster& c, AllReduceAlgorithm a, int n, double bytes) {
  TaskGraph g;
  g.device_order.resize(c.devices.size());
  g.static_memory.resize(c.devices.size());
  std::vector<int> devices(n);
  for (int i = 0; i < n; ++i) devices[i] = i;
  append_allreduce(g, a, c, devices, std::vector<int32_t>(n, -1), bytes);
  Result<sim::Replay> r = process::replay_isolated(c, g);
  REQUIRE(r.ok());
  return r->timeline.makespan();
}

}  // namespace

TEST_CASE("ring all-reduce on a ring of links: 2(n-1) a + 2(n-1)/n x S / B") {
  const double B = 25e9, a = 2e-6;
  for (int n : {2, 3, 4, 8}) {
    Cluster c = *make_ring_cluster(n, "gpu", test_device(), {B, a});
    for (double S : {1e6, 1e8, 1e9}) {
      INFO("n=" << n << " S=" << S);
      const double expected = 2.0 * (n - 1) * a + 2.0 * (n - 1) / n * S / B;
      CHECK(close_rel(allreduce_time(c, AllReduceAlgorithm::Ring, n, S), expected, 0.01));
    }
  }
}

TEST_CASE("ring all-reduce through a switch: every step crosses two links, directions never shared") {
  const double B = 10e9, a = 1e-6, S = 4e8;
  const int n = 5;
  Cluster c = make_switch_cluster(n, "gpu", test_device(), B, a);
  CHECK(close_rel(allreduce_time(c, AllReduceAlgorithm::Ring, n, S), 2.0 * (n - 1) * (2 * a + S / n / B),
                  1e-6));
}

TEST_CASE("hierarchical all-reduce on DGX-style nodes: reduce, ring across nodes, broadcast") {
  // m GPUs per node on an NVSwitch (links Bn, an), L nodes on one InfiniBand switch (Bi, ai).
  // Reduce: m - 1 flows share the leader's NVLink link: 2 an + (m - 1) S / Bn. Ring among the L
  // leaders, each step over two InfiniBand links: 2 (L - 1) (2 ai + S / (L Bi)). Broadcast: the
  // leader's link again: 2 an + (m - 1) S / Bn.
  DgxSpec s;
  s.gpu = test_device();
  s.nvlink = {300e9, 0.5e-6};
  s.infiniband = {25e9, 1e-6};
  const double S = 1e9;
  for (auto [L, m] : {std::pair{2, 8}, {4, 4}, {3, 2}}) {
    s.nodes = L;
    s.gpus_per_node = m;
    Cluster c = *make_dgx_cluster(s);
    const double intra = 2 * s.nvlink.latency + (m - 1) * S / s.nvlink.bandwidth;
    const double across = 2.0 * (L - 1) * (2 * s.infiniband.latency + S / L / s.infiniband.bandwidth);
    INFO("L=" << L << " m=" << m);
    CHECK(close_rel(allreduce_time(c, AllReduceAlgorithm::Hierarchical, L * m, S), 2 * intra + across, 1e-6));
  }
}

TEST_CASE(
    "hierarchical all-reduce degenerates: one device per machine is the ring, one machine has no ring") {
  const double B = 10e9, a = 1e-6, S = 3e8;
  Cluster ring =
      *make_ring_cluster(4, "gpu", test_device(), {B, a});  // no `node`: each device its own machine
  CHECK(close_rel(allreduce_time(ring, AllReduceAlgorithm::Hierarchical, 4, S),
                  allreduce_time(ring, AllReduceAlgorithm::Ring, 4, S), 1e-9));
  Cluster one = make_switch_cluster(4, "gpu", test_device(), B, a);
  for (Device& d : one.devices) d.node = "box";
  CHECK(
      close_rel(allreduce_time(one, AllReduceAlgorithm::Hierarchical, 4, S), 2 * (2 * a + 3 * S / B), 1e-6));
}

TEST_CASE(
    "multi-ring all-reduce across DGX-style nodes: m rings, one per NIC, m times the ring's bandwidth") {
  // L nodes of m GPUs (NVSwitch inside at Bn, one InfiniBand NIC per GPU at Bi, Bn >> Bi). The single
  // ring crosses each node boundary through one NIC: bandwidth-bound 2 (n - 1)/n x S / Bi. The m
  // rings of multi-ring carry S/m each and cross through m different NICs: 2 (n - 1)/n x S / (m Bi).
  // Latency terms are < 0.1% at these sizes.
  DgxSpec s;
  s.gpu = test_device();
  s.nvlink = {2400e9, 0.1e-6};
  s.infiniband = {25e9, 0.1e-6};
  const double S = 4e9;
  for (auto [L, m] : {std::pair{2, 8}, {4, 4}, {3, 2}}) {
    s.nodes = L;
    s.gpus_per_node = m;
    Cluster c = *make_dgx_cluster(s);
    const int n = L * m;
    const double ring_bound = 2.0 * (n - 1) / n * S / s.infiniband.bandwidth;
    INFO("L=" << L << " m=" << m);
    CHECK(close_rel(allreduce_time(c, AllReduceAlgorithm::Ring, n, S), ring_bound, 0.02));
    CHECK(close_rel(allreduce_time(c, AllReduceAlgorithm::MultiRing, n, S), ring_bound / m, 0.02));
  }
}

TEST_CASE(
    "multi-ring all-reduce when latency-bound: 2 (n - 1) steps of the crossing route's latency, as the "
    "ring") {
  // Every step of every ring has a flow crossing machines, so a step takes the crossing route's
  // latency a_x, for the ring and for each of the m rings at once: 2 (n - 1) a_x + 2(n-1)/n S/B, S = 8 B
  // (the bytes' term below 1e-6 of it). Until 2026-12-05 the m rings shared one connection per device
  // pair and queued their flows on it: m - 1 rings use each pair inside a machine, so a step paid
  // (m - 1) of its latencies in a row (L = 2, m = 8: 210 us for 60.0 us).
  DgxSpec s;
  s.gpu = test_device();
  s.nvlink = {2400e9, 0.5e-6};
  s.infiniband = {25e9, 2e-6};
  for (int m : {4, 8}) {
    s.nodes = 2;
    s.gpus_per_node = m;
    Cluster c = *make_dgx_cluster(s);
    const int n = 2 * m;
    const double ring = allreduce_time(c, AllReduceAlgorithm::Ring, n, 8);
    const double multi = allreduce_time(c, AllReduceAlgorithm::MultiRing, n, 8);
    INFO("m=" << m << " ring " << ring << " multi-ring " << multi);
    const double steps = 2.0 * (n - 1);
    // a_x: the slowest route from a device of machine 0 to one of machine 1 (all alike here).
    Router router(c);
    double a_x = 0;
    for (int i = 0; i < m; ++i)
      for (int j = m; j < n; ++j) a_x = std::max(a_x, router.route(i, j)->latency);
    CHECK(close_rel(ring / steps, a_x, 0.01));
    CHECK(close_rel(multi / steps, a_x, 0.01));
  }
}

TEST_CASE("multi-ring degenerates to the ring: one machine, or one device per machine") {
  const double B = 10e9, a = 1e-6, S = 3e8;
  Cluster ring = *make_ring_cluster(4, "gpu", test_device(), {B, a});
  CHECK(allreduce_time(ring, AllReduceAlgorithm::MultiRing, 4, S) ==
        allreduce_time(ring, AllReduceAlgorithm::Ring, 4, S));
  Cluster one = make_switch_cluster(4, "gpu", test_device(), B, a);
  for (Device& d : one.devices) d.node = "box";
  CHECK(allreduce_time(one, AllReduceAlgorithm::MultiRing, 4, S) ==
        allreduce_time(one, AllReduceAlgorithm::Ring, 4, S));
}

TEST_CASE("double binary tree all-reduce through a switch, by hand: phases of flows sharing ports") {
  // Every flow crosses two links (2a); c = S / 2 per tree, one chunk (S / 2 <= 512 KiB).
  const double B = 10e9, a = 1e-6;
  const double S = 1e6;
  // Two machines: the trees run opposite ways. Up: 0 -> 1 and 1 -> 0 at once, each alone in its
  // direction (2a + c / B); then down, the same: 4a + S / B, the ring's time on two.
  Cluster two = make_switch_cluster(2, "gpu", test_device(), B, a);
  CHECK(close_rel(allreduce_time(two, AllReduceAlgorithm::Tree, 2, S), 4 * a + S / B, 1e-6));
  CHECK(close_rel(allreduce_time(two, AllReduceAlgorithm::Ring, 2, S), 4 * a + S / B, 1e-6));
  // Four machines (T1: 0 <- 2 <- {1, 3}; T2: 3 <- 1 <- {2, 0}): (1) 1 -> 2, 3 -> 2, 2 -> 1, 0 -> 1
  // share the in-ports of 2 and 1: 2a + 2c / B; (2) 2 -> 0 and 1 -> 3: 2a + c / B; (3) the roots send
  // down, 0 -> 2 and 3 -> 1: 2a + c / B; (4) 2 -> {1, 3} and 1 -> {2, 0} share the out-ports of 2 and
  // 1: 2a + 2c / B. In all 8a + 3 S / B (unpipelined, a ring takes 12a + 1.5 S / B).
  Cluster four = make_switch_cluster(4, "gpu", test_device(), B, a);
  CHECK(close_rel(allreduce_time(four, AllReduceAlgorithm::Tree, 4, S), 8 * a + 3 * S / B, 1e-6));
}

TEST_CASE("double binary tree all-reduce pipelined in k chunks on two machines: 2 (k + 1) a + S / B") {
  // Per tree k chunks of c = S / (2k). The first up-chunks go alone in each direction (2a + c / B);
  // then in each of k - 1 rounds a direction carries one tree's next up-chunk and the other's
  // down-chunk at once, sharing it (the trees are separate connections, as NCCL's channels):
  // 2a + 2c / B; the last down-chunks alone (2a + c / B).
  const double B = 10e9, a = 1e-6;
  Cluster two = make_switch_cluster(2, "gpu", test_device(), B, a);
  for (int k : {2, 4, 8}) {
    const double S = 2.0 * k * kTreeChunkBytes;
    INFO("k=" << k);
    CHECK(close_rel(allreduce_time(two, AllReduceAlgorithm::Tree, 2, S), 2 * (k + 1) * a + S / B, 1e-6));
  }
}

TEST_CASE("nccl all-reduce: NCCL's model picks the tree or the ring per NIC, and the flows are that one's") {
  // Two DGX-style machines of 4 GPUs: a small all-reduce is latency-bound (NCCL's tree), a large one
  // bandwidth-bound (its ring); each then takes exactly the time of the algorithm picked.
  DgxSpec s;
  s.nodes = 8;
  s.gpus_per_node = 2;
  s.gpu = test_device();
  s.nvlink = {300e9, 0.5e-6};
  s.infiniband = {25e9, 1e-6};
  Cluster c = *make_dgx_cluster(s);
  Router router(c);
  std::vector<int> all(16);
  for (int i = 0; i < 16; ++i) all[i] = i;
  for (double S : {64e3, 4e9}) {
    const AllReduceAlgorithm pick =
        resolve_allreduce(AllReduceAlgorithm::Nccl, CollectiveKind::AllReduce, c, router, all, S);
    INFO("S=" << S);
    CHECK(pick == (S < 1e6 ? AllReduceAlgorithm::Tree : AllReduceAlgorithm::MultiRing));
    CHECK(allreduce_time(c, AllReduceAlgorithm::Nccl, 16, S) == allreduce_time(c, pick, 16, S));
  }
  // A reduce-scatter has no tree in NCCL: the ring per NIC.
  CHECK(resolve_allreduce(AllReduceAlgorithm::Nccl, CollectiveKind::ReduceScatter, c, router, all, 64e3) ==
        AllReduceAlgorithm::MultiRing);
  CHECK(resolve_allreduce(AllReduceAlgorithm::Tree, CollectiveKind::ReduceScatter, c, router, all, 64e3) ==
        AllReduceAlgorithm::MultiRing);
}

namespace engine_cases {

// FPGAs fpga0 .. on one switch (links 12.5 GB/s, 0.5 us), then `gpus` GPUs, with the engine.
Cluster engine_switch(int fpgas, int gpus, const CollectiveEngine& e) {
  DeviceSpec fpga = test_device();
  fpga.family = "fpga";
  Cluster c = make_switch_cluster(fpgas + gpus, "dev", fpga, 12.5e9, 0.5e-6);
  for (int i = fpgas; i < fpgas + gpus; ++i) c.devices[static_cast<size_t>(i)].spec.family = "gpu";
  c.engine = e;
  return c;
}

TaskGraph empty_graph(const Cluster& c) {
  TaskGraph g;
  g.device_order.resize(c.devices.size());
  g.static_memory.resize(c.devices.size());
  return g;
}

double replay_time(const Cluster& c, const TaskGraph& g) {
  Result<sim::Replay> r = process::replay_isolated(c, g);
  REQUIRE(r.ok());
  return r->timeline.makespan();
}

}  // namespace engine_cases

TEST_CASE(
    "FPGA collective engine in SimGrid: call + 2 (n - 1) (step + 2a) + 2 (n - 1) / n x S / its bandwidth") {
  const CollectiveEngine e{"test", 500e-6, 20e-6, 4e9, 10e9};
  for (int n : {2, 4, 8}) {
    Cluster c = engine_cases::engine_switch(n, 0, e);
    for (double S : {1024.0, 32e6}) {
      INFO("n=" << n << " S=" << S);
      const double expected = 500e-6 + 2.0 * (n - 1) * (20e-6 + 1e-6) + 2.0 * (n - 1) / n * S / 4e9;
      CHECK(close_rel(allreduce_time(c, AllReduceAlgorithm::Ring, n, S), expected, 1e-9));
    }
  }
  // 4 boards, 32 MB by hand: 500 + 6 x 21 + 1.5 x 32e6 / 4e9 s = 12,626 us.
  CHECK(close_rel(allreduce_time(engine_cases::engine_switch(4, 0, e), AllReduceAlgorithm::Ring, 4, 32e6),
                  12626e-6, 1e-9));
}

TEST_CASE(
    "FPGA collective engine on a ring over FPGAs and a GPU: its figures on the FPGA-to-FPGA flows alone") {
  // dev0, dev1, dev2 FPGAs, dev3 a GPU; the ring 0 -> 1 -> 2 -> 3 -> 0 has two engine hops (step 20
  // us + 2 a) and two raw ones (2 a = 1 us). A device's flows leave one after another on its
  // connection, each engine flow holding it for its step: dev0's 2 (n - 1) = 6 flows, all to the FPGA
  // dev1, take its call and 6 x (20 + 1) us, plus 6 chunks of 256 B at the engine's 4 GB/s: 626.38 us
  // (the raw flows, 1 us each, wait on it). Until 2026-12-05 a collective with a GPU in it took the
  // engine's rate but neither its call nor its steps: about 6 us.
  const CollectiveEngine e{"test", 500e-6, 20e-6, 4e9, 10e9};
  Cluster c = engine_cases::engine_switch(3, 1, e);
  CHECK(close_rel(allreduce_time(c, AllReduceAlgorithm::Ring, 4, 1024), 500e-6 + 6 * 21e-6 + 6 * 256 / 4e9,
                  1e-6));
  // The closed form's slowest hop sees the same: the engine's step and call where two FPGAs meet.
  Router router(c);
  Result<LinkCost> hop = ring_link_cost(router, {0, 1, 2, 3});
  REQUIRE(hop);
  CHECK(close_rel(hop->latency, 21e-6, 1e-9));
  CHECK(hop->call == 500e-6);
  CHECK(hop->bandwidth == 4e9);
  // The planners' cached routes (dapple's and piper's all-reduce estimates) cost the ring alike; they
  // left the engine out until 2026-12-05.
  RouteCache cache(c);
  const LinkCost cached = cache.ring({0, 1, 2, 3});
  CHECK(cached.latency == hop->latency);
  CHECK(cached.bandwidth == hop->bandwidth);
  CHECK(cached.call == hop->call);
  // A ring of GPUs only on the same cluster: no engine figure at all.
  Result<LinkCost> none = ring_link_cost(router, {3});
  REQUIRE(none);
  CHECK(none->call == 0);
}

TEST_CASE(
    "FPGA collective engine in SimGrid: sends at send_bandwidth, a GPU's at the link's, flows share the "
    "engine's rate") {
  const CollectiveEngine e{"test", 500e-6, 20e-6, 4e9, 10e9};
  Cluster c = engine_cases::engine_switch(3, 1, e);
  // A stage hand-over between two FPGAs: no call or step, at 10 GB/s: 1 us + 1e8 / 1e10 = 10,001 us.
  TaskGraph send = engine_cases::empty_graph(c);
  send.add(transfer(0, 1, 1e8));
  CHECK(close_rel(engine_cases::replay_time(c, send), 1e-6 + 1e8 / 10e9, 1e-9));
  // FPGA to GPU: the link's 12.5 GB/s.
  TaskGraph mixed = engine_cases::empty_graph(c);
  mixed.add(transfer(0, 3, 1e8));
  CHECK(close_rel(engine_cases::replay_time(c, mixed), 1e-6 + 1e8 / 12.5e9, 1e-9));
  // Without the engine two flows out of fpga0 share its 12.5 GB/s link: 6.25 GB/s each. With it, both
  // go through fpga0's send port (sim/platform.h), which they share: 5 GB/s each, 1 us + 1e8 / 5e9.
  TaskGraph two_sends = engine_cases::empty_graph(c);
  for (int peer : {1, 2}) two_sends.add(transfer(0, peer, 1e8));
  CHECK(close_rel(engine_cases::replay_time(c, two_sends), 1e-6 + 1e8 / 5e9, 1e-9));
  Cluster raw = c;
  raw.engine.reset();
  CHECK(close_rel(engine_cases::replay_time(raw, two_sends), 1e-6 + 1e8 / 6.25e9, 1e-9));
  // Two collective flows (after their step, 20 us) share 4 GB/s: 2 GB/s each, 21 us + 1e8 / 2e9; four
  // (to fpga1 and fpga2 on two channels each) 1 GB/s each.
  for (int flows : {2, 4}) {
    TaskGraph g = engine_cases::empty_graph(c);
    for (int k = 0; k < flows; ++k) {
      Task t = transfer(0, 1 + k % 2, 1e8);
      t.transfer = TransferKind::DataParallel;
      t.channel = static_cast<uint16_t>(k);
      t.duration = 20e-6;
      g.add(t);
    }
    INFO(flows << " flows");
    CHECK(close_rel(engine_cases::replay_time(c, g), 21e-6 + 1e8 / (4e9 / flows), 1e-9));
  }
}

TEST_CASE(
    "FPGA collective engine in SimGrid: a send beside a ring step gets what the engine leaves of the link") {
  // fpga0 sends a collective's flow of 1e8 B to fpga1 and a stage hand-over of 3e8 B to fpga2 at once,
  // both on its 12.5 GB/s link. The engine's port holds the collective flow at 4 GB/s and the send at
  // most 10 GB/s; the link gives the send the 8.5 GB/s left. By hand: the collective flow ends at
  // 1 us + 1e8 / 4e9 = 25.001 ms, when the send has moved 25 ms x 8.5 GB/s = 2.125e8 B; the rest,
  // 0.875e8 B, at its own 10 GB/s takes 8.75 ms: 33.751 ms. (Until 2026-12-05 SimGrid's bandwidth
  // factor charged every link 1 / factor per byte, 3.125 B for each byte of the collective flow: both
  // flows then ran at 2.86 GB/s, and the send ended 4.6 ms later.)
  const CollectiveEngine e{"test", 500e-6, 20e-6, 4e9, 10e9};
  Cluster c = engine_cases::engine_switch(3, 1, e);
  TaskGraph g = engine_cases::empty_graph(c);
  Task ring = transfer(0, 1, 1e8);
  ring.transfer = TransferKind::DataParallel;
  g.add(ring);
  g.add(transfer(0, 2, 3e8));
  Result<sim::Replay> r = process::replay_isolated(c, g);
  REQUIRE(r.ok());
  CHECK(close_rel(r->timeline.end[0], 1e-6 + 1e8 / 4e9, 1e-9));
  CHECK(close_rel(r->timeline.end[1], 1e-6 + 1e8 / 4e9 + 0.875e8 / 10e9, 1e-9));
  // A device named as another's port host would be: the port takes another name, same times.
  Cluster named = c;
  named.devices[1].name = "dev0 (collective engine)";
  named.devices[2].name = "dev0 (collective engine) #2";
  CHECK(engine_cases::replay_time(named, g) == engine_cases::replay_time(c, g));
}
