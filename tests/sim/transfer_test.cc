// SimGrid's flow model as pipegrid configures it (CM02, TCP-gamma 0, crosstraffic 0, split-duplex
// links), checked on hand-built task graphs against a + S / B.
#include <doctest/doctest.h>

#include "core/cluster.h"
#include "core/task_graph.h"
#include "core/topologies/generators.h"
#include "sim/replay.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

Cluster pair_cluster(double bw, double lat, Duplex duplex) {
  Cluster c;
  c.devices = {{"a", test_device(), ""}, {"b", test_device(), ""}};
  c.links = {{0, 1, bw, lat, duplex}};
  return c;
}

std::vector<double> durations(const Cluster& c, const std::vector<Task>& transfers) {
  TaskGraph g;
  g.device_order.resize(c.devices.size());
  g.static_memory.resize(c.devices.size());
  for (const Task& t : transfers) g.add(t);
  Result<sim::Replay> r = process::replay_isolated(c, g);
  REQUIRE(r.ok());
  std::vector<double> out;
  for (size_t i = 0; i < transfers.size(); ++i) out.push_back(r->timeline.end[i] - r->timeline.start[i]);
  return out;
}

}  // namespace

TEST_CASE("one transfer of S bytes over one link takes latency + S / bandwidth") {
  for (double s : {1.0, 1e3, 1e6, 1e9}) {
    for (double lat : {0.0, 1e-6, 1e-4}) {
      Cluster c = pair_cluster(25e9, lat, Duplex::Full);
      INFO("S=" << s << " latency=" << lat);
      CHECK(close_rel(durations(c, {transfer(0, 1, s)})[0], lat + s / 25e9, 1e-6));
    }
  }
}

TEST_CASE("two flows sharing one link direction each take twice as long") {
  Cluster c = pair_cluster(10e9, 1e-6, Duplex::Full);
  auto d = durations(c, {transfer(0, 1, 1e9), transfer(0, 1, 1e9)});
  CHECK(close_rel(d[0], 1e-6 + 2 * 1e9 / 10e9, 1e-6));
  CHECK(close_rel(d[1], 1e-6 + 2 * 1e9 / 10e9, 1e-6));
}

TEST_CASE("full-duplex links carry both directions at full speed - shared links split them") {
  auto full = durations(pair_cluster(10e9, 0, Duplex::Full), {transfer(0, 1, 1e9), transfer(1, 0, 1e9)});
  CHECK(close_rel(full[0], 0.1, 1e-6));
  CHECK(close_rel(full[1], 0.1, 1e-6));
  auto shared = durations(pair_cluster(10e9, 0, Duplex::Shared), {transfer(0, 1, 1e9), transfer(1, 0, 1e9)});
  CHECK(close_rel(shared[0], 0.2, 1e-6));
  CHECK(close_rel(shared[1], 0.2, 1e-6));
}

TEST_CASE(
    "flows on disjoint links do not slow each other, and a multi-hop route adds latencies and is limited by "
    "its slowest link") {
  // a -- s1 -- b and c -- s1 -- d would share nothing but the switch (switches have no capacity).
  Cluster c;
  for (const char* n : {"a", "b", "c", "d"}) c.devices.push_back({n, test_device(), ""});
  c.switches = {"s1"};
  c.links = {{0, 4, 10e9, 1e-6, Duplex::Full},
             {1, 4, 5e9, 2e-6, Duplex::Full},
             {2, 4, 10e9, 1e-6, Duplex::Full},
             {3, 4, 10e9, 1e-6, Duplex::Full}};
  auto d = durations(c, {transfer(0, 1, 1e9), transfer(2, 3, 1e9)});
  CHECK(close_rel(d[0], 3e-6 + 1e9 / 5e9, 1e-6));   // slowest hop 5 GB/s, latencies 1 + 2 us
  CHECK(close_rel(d[1], 2e-6 + 1e9 / 10e9, 1e-6));  // unaffected by the other flow
}

TEST_CASE("flows of different sizes share a link max-min fairly (progressive filling)") {
  // Three flows of 1, 2 and 4 GB start together on a 10 GB/s link: each gets B/3 until the first
  // ends at 3 x 1 GB / B = 0.3 s; then B/2 each: the second ends after 2 x 1 GB / B more = 0.5 s;
  // the last runs alone: 2 GB / B more = 0.7 s.
  Cluster c = pair_cluster(10e9, 0, Duplex::Full);
  auto d = durations(c, {transfer(0, 1, 1e9), transfer(0, 1, 2e9), transfer(0, 1, 4e9)});
  CHECK(close_rel(d[0], 0.3, 1e-6));
  CHECK(close_rel(d[1], 0.5, 1e-6));
  CHECK(close_rel(d[2], 0.7, 1e-6));
}

TEST_CASE(
    "dgx1-v100-8 in SimGrid: an NVLink pair, a PCIe pair, and two PCIe flows sharing a switch's uplink") {
  Dgx1Spec s;
  s.gpu = test_device();
  Cluster c = *make_dgx1_cluster(s);
  // gpu0 -> gpu3: two NVLink2 links, 2 x 25 GB/s, 1 us: 1e-6 + 1e9 / 50e9 = 20.001 ms.
  CHECK(close_rel(durations(c, {transfer(0, 3, 1e9)})[0], 1e-6 + 1e9 / 50e9, 1e-6));
  // gpu0 -> gpu1: one link, 25 GB/s: 40.001 ms.
  CHECK(close_rel(durations(c, {transfer(0, 1, 1e9)})[0], 1e-6 + 1e9 / 25e9, 1e-6));
  // gpu0 -> gpu5: no NVLink; PCIe (15.75 GB/s) through both CPUs, 4 x 1 us + 0.5 us QPI.
  CHECK(close_rel(durations(c, {transfer(0, 5, 1e9)})[0], 4.5e-6 + 1e9 / 15.75e9, 1e-6));
  // gpu0 -> gpu5 and gpu1 -> gpu4 both climb from PCIe switch 0 to CPU 0: that uplink direction is
  // shared, 7.875 GB/s each (QPI's 38.4 GB/s is not the limit).
  auto d = durations(c, {transfer(0, 5, 1e9), transfer(1, 4, 1e9)});
  // gpu1 -> gpu4 has no NVLink either (topo row 1: NV1 0, NV2 2, NV1 3, NV2 5).
  CHECK(close_rel(d[0], 4.5e-6 + 1e9 / 7.875e9, 1e-6));
  CHECK(close_rel(d[1], 4.5e-6 + 1e9 / 7.875e9, 1e-6));
}

TEST_CASE("rail pods with 1:r oversubscription: flows between pods share the pod's uplink, by hand") {
  // 4 nodes of 2 GPUs, 2 nodes per pod, NICs of 50 GB/s (1 us per link): each pod's uplink carries
  // 4 x 50 / r GB/s. A flow on one rail inside a pod crosses two NIC links (2 us); between pods NIC, rail,
  // pod spine, core and down (6 us). Four flows from pod 0 to pod 1 (gpu i -> gpu i + 4) share the uplink.
  DgxSpec s;
  s.nodes = 4;
  s.gpus_per_node = 2;
  s.gpu = test_device();
  s.infiniband = {50e9, 1e-6};
  s.fabric = DgxSpec::Fabric::Rail;
  s.pod_nodes = 2;
  const double S = 1e9;
  for (double r : {1.0, 4.0, 7.0}) {
    INFO("oversubscription " << r);
    s.oversubscription = r;
    Result<Cluster> c = make_dgx_cluster(s);
    REQUIRE_MESSAGE(c.ok(), c.error().message);
    const double uplink = 4 * 50e9 / r;
    // One flow: the NIC or the uplink, whichever is slower.
    CHECK(close_rel(durations(*c, {transfer(0, 4, S)})[0], 6e-6 + S / std::min(50e9, uplink), 1e-6));
    // Four at once: a quarter of the uplink each, or their NICs when the uplink is not the bottleneck.
    const std::vector<double> four =
        durations(*c, {transfer(0, 4, S), transfer(1, 5, S), transfer(2, 6, S), transfer(3, 7, S)});
    for (double d : four) CHECK(close_rel(d, 6e-6 + S / std::min(50e9, uplink / 4), 1e-6));
    // Inside a pod (gpu0 -> gpu2, both on rail 0 of pod 0): the NICs alone, whatever r.
    CHECK(close_rel(durations(*c, {transfer(0, 2, S)})[0], 2e-6 + S / 50e9, 1e-6));
  }
  // Pods are refused on other fabrics, and an oversubscription below 1.
  s.fabric = DgxSpec::Fabric::Switch;
  CHECK_FALSE(make_dgx_cluster(s).ok());
  s.fabric = DgxSpec::Fabric::Rail;
  s.oversubscription = 0.5;
  CHECK_FALSE(make_dgx_cluster(s).ok());
}
