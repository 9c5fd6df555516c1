#include "core/cluster.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "core/topologies/generators.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using pipegrid::testing::test_device;

TEST_CASE("switch cluster: devices named <name><index>, two hops between any two") {
  Cluster c = make_switch_cluster(4, "gpu", test_device(), 25e9, 1e-6);
  REQUIRE(validate(c).ok());
  CHECK(c.devices[3].name == "gpu3");
  Router r(c);
  Route route = *r.route(0, 3);
  REQUIRE(route.hops.size() == 2);
  CHECK(route.hops[0].link == 0);
  CHECK(!route.hops[0].reverse);  // gpu0 -> switch is the link's a -> b
  CHECK(route.hops[1].link == 3);
  CHECK(route.hops[1].reverse);  // switch -> gpu3 is b -> a
  CHECK(route.latency == pipegrid::testing::approx(2e-6));
  CHECK(route.bandwidth == 25e9);
  CHECK(route.transfer_time(25e9) == pipegrid::testing::approx(1 + 2e-6));
}

TEST_CASE("two devices on one switch port each: the two links, whichever way each was written") {
  // a (node 0) and b (node 1) hang off switch s (node 2); a's link is written s -> a, b's b -> s.
  Cluster c;
  for (const char* n : {"a", "b"}) c.devices.push_back({n, test_device(), ""});
  c.switches = {"s"};
  c.links = {{2, 0, 10e9, 1e-6, Duplex::Full}, {1, 2, 5e9, 2e-6, Duplex::Full}};
  REQUIRE(validate(c).ok());
  Router r(c);
  Route ab = *r.route(0, 1);
  REQUIRE(ab.hops.size() == 2);
  CHECK(ab.hops[0] == Hop{0, true});  // a -> s over a link written s -> a
  CHECK(ab.hops[1] == Hop{1, true});  // s -> b over a link written b -> s
  CHECK(ab.latency == pipegrid::testing::approx(3e-6));
  CHECK(ab.bandwidth == 5e9);
  Route ba = *r.route(1, 0);
  REQUIRE(ba.hops.size() == 2);
  CHECK(ba.hops[0] == Hop{1, false});
  CHECK(ba.hops[1] == Hop{0, false});
}

TEST_CASE("a device with two links is routed by the search, not as a single-port device") {
  // a (0) is on switch s (2) over a 5 us link and on switch t (3) over a 1 us one; t -- s 0.5 us;
  // b (1) on s. a -> b: a -> t -> s -> b (2.5 us) beats a -> s -> b (6 us).
  Cluster c;
  for (const char* n : {"a", "b"}) c.devices.push_back({n, test_device(), ""});
  c.switches = {"s", "t"};
  c.links = {{0, 2, 10e9, 5e-6, Duplex::Full},
             {0, 3, 10e9, 1e-6, Duplex::Full},
             {3, 2, 10e9, 0.5e-6, Duplex::Full},
             {1, 2, 10e9, 1e-6, Duplex::Full}};
  REQUIRE(validate(c).ok());
  Router r(c);
  Route ab = *r.route(0, 1);
  REQUIRE(ab.hops.size() == 3);
  CHECK(ab.hops[0] == Hop{1, false});
  CHECK(ab.hops[1] == Hop{2, false});
  CHECK(ab.hops[2] == Hop{3, true});
  CHECK(ab.latency == pipegrid::testing::approx(2.5e-6));
  Route ba = *r.route(1, 0);
  REQUIRE(ba.hops.size() == 3);
  CHECK(ba.hops[2] == Hop{1, true});
}

TEST_CASE("a route is the same whether its source's whole tree was built or one search stopped at it") {
  // A 4 x 4 mesh with equal links: many equal shortest paths. A router asked about every
  // destination of a source in a row builds the source's whole tree after a few queries; a fresh
  // router per query searches only as far as the destination. Both must pick the same paths.
  Cluster c;
  const int n = 4;
  for (int i = 0; i < n * n; ++i) c.devices.push_back({"d" + std::to_string(i), test_device(), ""});
  for (int y = 0; y < n; ++y)
    for (int x = 0; x < n; ++x) {
      if (x + 1 < n) c.links.push_back({y * n + x, y * n + x + 1, 1e9, 1e-6, Duplex::Full});
      if (y + 1 < n) c.links.push_back({y * n + x, (y + 1) * n + x, 1e9, 1e-6, Duplex::Full});
    }
  REQUIRE(validate(c).ok());
  Router shared(c);
  int compared = 0;
  for (int from = 0; from < n * n; ++from)
    for (int to = 0; to < n * n; ++to) {
      if (from == to) continue;
      Route a = *shared.route(from, to);
      Route b = *Router(c).route(from, to);
      CHECK(a.hops == b.hops);
      CHECK(a.hops.size() == static_cast<size_t>(std::abs(from % n - to % n) + std::abs(from / n - to / n)));
      ++compared;
    }
  CHECK(compared == 240);
}

TEST_CASE("routes minimise latency, then hops") {
  // a -- b -- d (fast, 2 hops) versus a -- d (slow, 1 hop); a -- c -- d ties with a -- b -- d on
  // latency and hops: the first found is kept, deterministically.
  Cluster c;
  for (const char* n : {"a", "b", "c", "d"}) c.devices.push_back({n, test_device(), ""});
  c.links = {{0, 1, 10e9, 1e-6, Duplex::Full},
             {1, 3, 10e9, 1e-6, Duplex::Full},
             {0, 3, 10e9, 5e-6, Duplex::Full},
             {0, 2, 5e9, 1e-6, Duplex::Full},
             {2, 3, 5e9, 1e-6, Duplex::Full}};
  REQUIRE(validate(c).ok());
  Router r(c);
  Route route = *r.route(0, 3);
  CHECK(route.hops.size() == 2);
  CHECK(route.latency == pipegrid::testing::approx(2e-6));
  // Equal latency, fewer hops wins.
  Cluster c2;
  for (const char* n : {"a", "b", "c"}) c2.devices.push_back({n, test_device(), ""});
  c2.links = {
      {0, 1, 1e9, 1e-6, Duplex::Full}, {1, 2, 1e9, 1e-6, Duplex::Full}, {0, 2, 1e9, 2e-6, Duplex::Full}};
  Router r2(c2);
  CHECK(r2.route(0, 2)->hops.size() == 1);
}

TEST_CASE("invalid clusters are rejected before any simulation") {
  Cluster c = make_switch_cluster(2, "gpu", test_device(), 25e9, 1e-6);
  Cluster dup = c;
  dup.links.push_back({1, 2, 25e9, 1e-6, Duplex::Full});
  CHECK(validate(dup).error().message == "link 2 duplicates another link between \"gpu1\" and \"switch\"");
  Cluster self = c;
  self.links.push_back({0, 0, 25e9, 1e-6, Duplex::Full});
  CHECK(validate(self).error().message == "link 2 joins \"gpu0\" to itself");
  Cluster zero = c;
  zero.links[0].bandwidth = 0;
  CHECK(validate(zero).error().message ==
        "link 0 between \"gpu0\" and \"switch\" needs a positive bandwidth");
  Cluster apart = c;
  apart.links.pop_back();
  REQUIRE(validate(apart).ok());
  CHECK(Router(apart).route(0, 1).error().message == "\"gpu0\" and \"gpu1\" are not connected");
}

TEST_CASE("routes between alike machines, moved from machines 0 and 1, are the search's own") {
  // The oracle: the same cluster without Cluster::machine_symmetry, every route searched. Rails and one
  // switch; NVLink faster than, slower than and as fast as InfiniBand. On rails at equal latencies a
  // route between two rails has three equally short paths (through the spine, or either machine's
  // NVLink), which the search breaks by its queue's order, not by the machines: no symmetry there.
  for (const auto fabric : {DgxSpec::Fabric::Rail, DgxSpec::Fabric::Switch})
    for (const double nvlink_latency : {0.5e-6, 3e-6, 1e-6}) {
      DgxSpec s;
      s.nodes = 5;
      s.gpus_per_node = 4;
      s.fabric = fabric;
      s.nvlink.latency = nvlink_latency;
      const Cluster moved = *make_dgx_cluster(s);
      const bool ties = fabric == DgxSpec::Fabric::Rail && nvlink_latency == s.infiniband.latency;
      REQUIRE(moved.machine_symmetry.has_value() == !ties);
      Cluster searched = moved;
      searched.machine_symmetry.reset();
      const Router a(moved), b(searched);
      int compared = 0;
      for (int from = 0; from < 20; ++from)
        for (int to = 0; to < 20; ++to) {
          if (from / 4 == to / 4) continue;
          const Route x = *a.route(from, to), y = *b.route(from, to);
          CHECK(x.hops == y.hops);
          CHECK(x.latency == y.latency);
          CHECK(x.bandwidth == y.bandwidth);
          ++compared;
        }
      CHECK(compared == 20 * 16);
    }
  DgxSpec pods;
  pods.nodes = 4;
  pods.fabric = DgxSpec::Fabric::Rail;
  pods.pod_nodes = 2;
  CHECK_FALSE(make_dgx_cluster(pods)->machine_symmetry.has_value());  // two pods: machines not alike
}
