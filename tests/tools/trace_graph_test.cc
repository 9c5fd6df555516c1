// The trace graph (tools/output/trace_graph.h): a task graph as Chakra-style nodes and back, against
// hand-written node lists and closed-form replay times (make_switch_cluster: 2 a + S / B per
// transfer; core/collectives.h's ring on a ring of links: 2 (n - 1) a + 2 (n - 1)/n S / B).
#include "tools/output/trace_graph.h"

#include <doctest/doctest.h>

#include "core/topologies/generators.h"
#include "sim/replay.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;
using nlohmann::json;

namespace {

json comp(int id, int rank, double seconds, std::vector<int> deps, const std::string& name = "F s0 m0") {
  return {{"id", id},     {"rank", rank},          {"type", "comp"},
          {"name", name}, {"duration_s", seconds}, {"deps", deps}};
}
json comm(int id, int rank, const char* type, int peer, double bytes, int tag, std::vector<int> deps) {
  return {{"id", id},     {"rank", rank},   {"type", type}, {"name", "activation s0 s1 m0"},
          {"peer", peer}, {"bytes", bytes}, {"tag", tag},   {"deps", deps}};
}
json graph(int ranks, json nodes) {
  return {{"ranks", ranks}, {"nodes", std::move(nodes)}};
}

double makespan(const Cluster& c, const json& j) {
  Result<TaskGraph> g = output::from_trace_graph(j, c);
  REQUIRE(g.ok());
  Result<sim::Replay> r = process::replay_isolated(c, *g);
  REQUIRE(r.ok());
  return r->timeline.makespan();
}

}  // namespace

TEST_CASE("trace graph in: compute, a send/receive pair, compute: t_F + 2 a + S / B + t_B") {
  const double B = 25e9, a = 1e-6, S = 1e6;
  const Cluster c = make_switch_cluster(2, "gpu", test_device(), B, a);
  const json j = graph(2, json::array({comp(0, 0, 1e-3, {}), comm(1, 0, "send", 1, S, 7, {0}),
                                       comm(2, 1, "recv", 0, S, 7, {}), comp(3, 1, 2e-3, {2})}));
  CHECK(close_rel(makespan(c, j), 1e-3 + 2 * a + S / B + 2e-3, 1e-9));
}

TEST_CASE("trace graph in: an all-reduce node per rank is the ring all-reduce after each rank's compute") {
  const double B = 25e9, a = 2e-6, S = 1e8;
  const int n = 4;
  const Cluster c = *make_ring_cluster(n, "gpu", test_device(), {B, a});
  json nodes = json::array();
  for (int r = 0; r < n; ++r) {
    nodes.push_back(comp(2 * r, r, 1e-3, {}));
    nodes.push_back({{"id", 2 * r + 1},
                     {"rank", r},
                     {"type", "allreduce"},
                     {"name", "allreduce s0 s0 m-1"},
                     {"group", {0, 1, 2, 3}},
                     {"bytes", S},
                     {"tag", 0},
                     {"deps", {2 * r}}});
  }
  const double expected = 1e-3 + 2.0 * (n - 1) * a + 2.0 * (n - 1) / n * S / B;
  CHECK(close_rel(makespan(c, graph(n, nodes)), expected, 0.01));
}

TEST_CASE("trace graph out: one producer, one transfer, one consumer, written as four nodes") {
  TaskGraph g;
  g.device_order.resize(2);
  Task f;
  f.kind = TaskKind::Forward;
  f.stage = 0;
  f.micro_batch = 0;
  f.device = 0;
  f.duration = 1e-3;
  const int32_t t0 = g.add(f);
  Task x;
  x.kind = TaskKind::Transfer;
  x.transfer = TransferKind::Activation;
  x.stage = 0;
  x.peer_stage = 1;
  x.micro_batch = 0;
  x.device = 0;
  x.peer = 1;
  x.bytes = 4096;
  const int32_t t1 = g.add(x);
  f.stage = 1;
  f.device = 1;
  const int32_t t2 = g.add(f);
  g.depend(t0, t1);
  g.depend(t1, t2);
  g.device_order[0] = {t0};
  g.device_order[1] = {t2};
  Result<json> j = output::to_trace_graph(g, 2);
  REQUIRE(j.ok());
  const json want = json::array({comp(0, 0, 1e-3, {}, "F s0 m0"),
                                 {{"id", 1},
                                  {"rank", 0},
                                  {"type", "send"},
                                  {"name", "activation s0 s1 m0"},
                                  {"peer", 1},
                                  {"bytes", 4096.0},
                                  {"tag", 1},
                                  {"deps", {0}}},
                                 {{"id", 2},
                                  {"rank", 1},
                                  {"type", "recv"},
                                  {"name", "activation s0 s1 m0"},
                                  {"peer", 0},
                                  {"bytes", 4096.0},
                                  {"tag", 1},
                                  {"deps", json::array()}},
                                 comp(3, 1, 1e-3, {2}, "F s1 m0")});
  CHECK((*j)["nodes"] == want);
  CHECK((*j)["ranks"] == 2);
}

TEST_CASE("trace graph in: located errors") {
  const Cluster c = make_switch_cluster(2, "gpu", test_device(), 25e9, 1e-6);
  auto error = [&](const json& nodes) {
    Result<TaskGraph> g = output::from_trace_graph(graph(2, nodes), c);
    REQUIRE_FALSE(g.ok());
    return g.error().message;
  };
  CHECK(error(json::array({comm(0, 0, "send", 0, 8, 1, {})})) ==
        "rank 0 node \"activation s0 s1 m0\" (id 0): a send to its own rank");
  CHECK(error(json::array({comm(0, 1, "recv", 0, 8, 5, {})})) ==
        "rank 1 node \"activation s0 s1 m0\" (id 0): a receive from rank 0 to rank 1 (tag 5) has no matching "
        "send");
  CHECK(error(json::array({comp(0, 0, 1e-3, {}), comp(1, 1, 1e-3, {0})})) ==
        "rank 1 node \"F s0 m0\" (id 1): depends on node 0 of another rank");
  CHECK(error(json::array({comp(0, 5, 1e-3, {})})) ==
        "rank 5 node \"F s0 m0\" (id 0): rank 5 is not a device of the cluster (0 to 1)");
  CHECK(error(json::array({{{"id", 0},
                            {"rank", 0},
                            {"type", "allreduce"},
                            {"group", {0, 0}},
                            {"bytes", 8},
                            {"deps", json::array()}}})) ==
        "rank 0 node \"\" (id 0): a rank appears twice in the group [0, 0]");
  // The shape, checked first: the node, the key, what was expected and what was found (until
  // 2026-12-05 a version 2 or another format was read as version 1, a dependency on the node itself
  // was dropped, and a wrong type gave the JSON library's message without the node or key).
  json bad = comp(0, 0, 1e-3, {});
  bad["duration_s"] = "1ms";
  CHECK(error(json::array({comp(0, 0, 1e-3, {}), bad})) ==
        "node 1 (id 0): \"duration_s\": expected a time in seconds, from 0 to 1e9, found \"1ms\" (a string)");
  CHECK(error(json::array({comp(3, 0, 1e-3, {3})})) == "node 0 (id 3): \"deps\": the node depends on itself");
  json no_tag = comm(0, 0, "send", 1, 8, 1, {});
  no_tag.erase("tag");
  CHECK(error(json::array({no_tag})) == "node 0 (id 0): \"tag\": expected an integer tag, found nothing");
  // Until 2026-12-05 these were read silently: a send and its receive of different sizes (the
  // first read won), all-reduce members of different sizes (the last won), two sends with one tag,
  // an unknown key, a receive's duration, 1e308 bytes.
  CHECK(error(json::array({comm(0, 0, "send", 1, 1000, 7, {}), comm(1, 1, "recv", 0, 5e6, 7, {})})) ==
        "rank 1 node \"activation s0 s1 m0\" (id 1): 5000000 bytes, but its send rank 0 node \"activation s0 "
        "s1 "
        "m0\" (id 0) has 1000 bytes");
  json ar0 = {{"id", 0},         {"rank", 0},     {"type", "allreduce"},
              {"group", {0, 1}}, {"bytes", 1000}, {"deps", json::array()}};
  json ar1 = ar0;
  ar1["id"] = 1;
  ar1["rank"] = 1;
  ar1["bytes"] = 1e9;
  CHECK(error(json::array({ar0, ar1})) ==
        "rank 1 node \"\" (id 1): an all-reduce of 1000000000 bytes, but its member rank 0 node \"\" (id 0) "
        "has "
        "1000 bytes");
  CHECK(error(json::array({comm(0, 0, "send", 1, 8, 7, {}), comm(1, 0, "send", 1, 8, 7, {}),
                           comm(2, 1, "recv", 0, 8, 7, {}), comm(3, 1, "recv", 0, 8, 7, {})})) ==
        "rank 0 node \"activation s0 s1 m0\" (id 1): a second send from rank 0 to rank 1 with tag 7 (the "
        "first: "
        "rank 0 node \"activation s0 s1 m0\" (id 0)); each (sender, receiver, tag) names one transfer");
  json channel = comm(1, 1, "recv", 0, 8, 7, {});
  channel["channel"] = 2;
  CHECK(error(json::array({comm(0, 0, "send", 1, 8, 7, {}), channel})) ==
        "rank 1 node \"activation s0 s1 m0\" (id 1): channel 2, but its send rank 0 node \"activation s0 s1 "
        "m0\" "
        "(id 0) has channel 0");
  json typo = comp(0, 0, 1e-3, {});
  typo["durration"] = 1;
  CHECK(
      error(json::array({typo})) ==
      "node 0 (id 0): \"durration\": not a key of a \"comp\" node (did you mean \"duration_s\"? expected id, "
      "rank, type, name, duration_s, deps)");
  json timed_recv = comm(1, 1, "recv", 0, 8, 7, {});
  timed_recv["duration_s"] = 5;
  CHECK(error(json::array({comm(0, 0, "send", 1, 8, 7, {}), timed_recv})) ==
        "node 1 (id 1): \"duration_s\": not a key of a \"recv\" node (expected id, rank, type, name, peer, "
        "bytes, "
        "tag, channel, deps)");
  CHECK(error(json::array({comm(0, 0, "send", 1, 1e308, 7, {})})) ==
        "node 0 (id 0): \"bytes\": expected a size in bytes, from 0 to 1e18, found 1e+308 (a number)");
  auto top = [&](json j) {
    Result<TaskGraph> g = output::from_trace_graph(j, c);
    REQUIRE_FALSE(g.ok());
    return g.error().message;
  };
  CHECK(top({{"format", "pipegrid-trace-graph"}, {"version", 2}, {"nodes", json::array()}}) ==
        "\"version\": expected 1 (this pipegrid reads version 1), found 2 (a number)");
  CHECK(top({{"format", "chakra"}, {"nodes", json::array()}}) ==
        "\"format\": expected \"pipegrid-trace-graph\", found \"chakra\" (a string)");
  CHECK(top({{"nodes", 5}}) == "\"nodes\": expected a list of nodes, found 5 (a number)");
  CHECK(
      top({{"nodes", json::array()}, {"rank", 2}}) ==
      "\"rank\": not a key of a trace graph (expected format, version, ranks, samples_per_iteration, nodes)");
}

// Each rank sends to the other, and its receive waits for its own send (as in ASTRA-sim's custom
// collective traces, whose sends are eager). pipegrid's transfer starts when both its send's and its
// receive's dependencies are done, so transfer 0 -> 1 waits for 1 -> 0 and 1 -> 0 for 0 -> 1: a cycle
// through transfers only. Reading the traces reports it with the trace's nodes (until 2026-12-05 the
// replay reported it with task labels that are not in the traces, "gpu0 waits at 0F-1 ...").
TEST_CASE("trace graph in: receives that wait for their rank's own send around a ring deadlock, reported") {
  const Cluster c = make_switch_cluster(2, "gpu", test_device(), 25e9, 1e-6);
  const std::string head = "the traces deadlock (each rank runs its compute nodes in its node order):\n  ";
  for (bool with_compute : {false, true}) {
    json nodes = json::array({comm(0, 0, "send", 1, 8, 0, {}), comm(1, 0, "recv", 1, 8, 0, {0}),
                              comm(2, 1, "send", 0, 8, 0, {}), comm(3, 1, "recv", 0, 8, 0, {2})});
    if (with_compute) {
      nodes.push_back(comp(4, 0, 1e-3, {1}));
      nodes.push_back(comp(5, 1, 1e-3, {3}));
    }
    Result<TaskGraph> g = output::from_trace_graph(graph(2, nodes), c);
    REQUIRE_FALSE(g.ok());
    CHECK(g.error().message ==
          head +
              (with_compute
                   ? "rank 0 node \"F s0 m0\" (id 4) waits for rank 0 node \"activation s0 s1 m0\" (id 1)\n"
                     "  rank 1 node \"F s0 m0\" (id 5) waits for rank 1 node \"activation s0 s1 m0\" (id 3)"
                   : "rank 0 node \"activation s0 s1 m0\" (id 0) waits for rank 0 node \"activation s0 s1 "
                     "m0\" (id 1)\n  rank 0 node \"activation s0 s1 m0\" (id 1) waits for rank 0 node "
                     "\"activation s0 s1 m0\" (id 0)"));
  }
  // A compute node that depends on a later one of its rank.
  Result<TaskGraph> g = output::from_trace_graph(
      graph(2, json::array({comp(0, 0, 1e-3, {1}, "c0"), comp(1, 0, 1e-3, {}, "c1"), comp(2, 1, 1e-3, {})})),
      c);
  REQUIRE_FALSE(g.ok());
  CHECK(
      g.error().message ==
      head +
          "rank 0 node \"c0\" (id 0) waits for rank 0 node \"c1\" (id 1), which comes after it on its rank");
}

namespace {

json allreduce(int id, int rank, int tag, double bytes, std::vector<int> deps) {
  return {{"id", id},
          {"rank", rank},
          {"type", "allreduce"},
          {"name", "allreduce s0 s0 m-1"},
          {"group", {0, 1, 2, 3}},
          {"bytes", bytes},
          {"tag", tag},
          {"deps", deps}};
}

}  // namespace

// DualPipe's ranks hold two stages and reduce one stage's gradients after the other's: a collective
// node after a collective node (refused until 2026-12-05). Two rings of S in a row: twice the ring.
TEST_CASE("trace graph in: an all-reduce after an all-reduce runs after it, a cycle of them is an error") {
  const double B = 25e9, a = 2e-6, S = 1e8;
  const int n = 4;
  const Cluster c = *make_ring_cluster(n, "gpu", test_device(), {B, a});
  json nodes = json::array();
  for (int r = 0; r < n; ++r) {
    nodes.push_back(comp(3 * r, r, 1e-3, {}));
    nodes.push_back(allreduce(3 * r + 1, r, 0, S, {3 * r}));
    nodes.push_back(allreduce(3 * r + 2, r, 1, S, {3 * r + 1}));
  }
  const double ring = 2.0 * (n - 1) * a + 2.0 * (n - 1) / n * S / B;
  CHECK(close_rel(makespan(c, graph(n, nodes)), 1e-3 + 2 * ring, 0.01));
  // Rank 0 runs tag 1 before tag 0, the others tag 0 before tag 1: each waits for the other.
  nodes[1]["deps"] = {2};
  nodes[2]["deps"] = {0};
  Result<TaskGraph> g = output::from_trace_graph(graph(n, nodes), c);
  REQUIRE_FALSE(g.ok());
  CHECK(g.error().message ==
        "an all-reduce among ranks [0, 1, 2, 3] (tag 0) waits, through its dependencies, for itself or for a "
        "collective that does");
}

// A tensor-parallel all-reduce of two devices as core/collectives.h lowers it: each flow starts once
// both ends reached it. The receive carries the receiver's dependency (a rendezvous); until 2026-12-05
// the export refused every tensor-parallel plan.
TEST_CASE("trace graph out: a flow that waits for both ends puts the receiver's wait on the receive") {
  TaskGraph g;
  g.device_order.resize(2);
  Task f;
  f.kind = TaskKind::Forward;
  f.duration = 1e-3;
  f.device = 0;
  const int32_t f0 = g.add(f);
  f.device = 1;
  const int32_t f1 = g.add(f);
  Task x;
  x.kind = TaskKind::Transfer;
  x.transfer = TransferKind::TensorParallel;
  x.stage = x.peer_stage = x.micro_batch = 0;
  x.device = 0;
  x.peer = 1;
  x.bytes = 4096;
  const int32_t t01 = g.add(x);
  x.device = 1;
  x.peer = 0;
  const int32_t t10 = g.add(x);
  for (int32_t t : {t01, t10}) {
    g.depend(f0, t);
    g.depend(f1, t);
  }
  g.device_order[0] = {f0};
  g.device_order[1] = {f1};
  Result<json> j = output::to_trace_graph(g, 2);
  REQUIRE(j.ok());
  const json& nodes = (*j)["nodes"];
  REQUIRE(nodes.size() == 6);
  // F on 0 (id 0), F on 1 (id 1), send 0 -> 1 after id 0 (2), its receive on 1 after id 1 (3), and
  // the reverse pair (4, 5).
  CHECK(nodes[2]["type"] == "send");
  CHECK(nodes[2]["deps"] == json({0}));
  CHECK(nodes[3]["type"] == "recv");
  CHECK(nodes[3]["deps"] == json({1}));
  CHECK(nodes[4]["deps"] == json({1}));
  CHECK(nodes[5]["deps"] == json({0}));
  CHECK(nodes[2]["name"] == "tp s0 s0 m0");
  // Back in: one transfer per pair, after both ends' compute: 1 ms + 2 a + S / B.
  const double B = 25e9, a = 1e-6;
  const Cluster c = make_switch_cluster(2, "gpu", test_device(), B, a);
  CHECK(close_rel(makespan(c, *j), 1e-3 + 2 * a + 4096 / B, 1e-9));
}
