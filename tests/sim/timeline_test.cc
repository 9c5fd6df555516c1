// Task timelines of a few configurations, start and end of every task, bit for bit against timelines
// stored in tests/sim/data/timelines/ (hex floats). The stored files were written by the replay as it
// was before the compact task graph and the per-device actors (commit 9cf31ff, as of issue 14), and each is
// checked independently here, so the files are not taken on trust:
//  - configurations without link sharing (a full mesh of point-to-point links: every ordered device
//    pair has its own link direction) against the analytic evaluator, which is exact when no two
//    transfers ever share a link direction (core/evaluate.h): every start and end to 1e-9 of the
//    iteration;
//  - the configuration where max-min sharing matters (the trunk cluster of sharing_test.cc) against
//    the hand derivation repeated below.
// Rows are compared as a set keyed by what each task is (device, kind, stage, micro-batch, peer,
// bytes), so renumbering tasks does not matter; the times must be identical, with compute tasks on
// device clocks (the default) and as SimGrid Execs (ReplayOptions::simgrid_execs).
// Regenerate (only when a change of results is intended): PIPEGRID_WRITE_TIMELINES=1 test_sim
// -tc='timelines*'.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/evaluate.h"
#include "core/experiment.h"
#include "sim/replay.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

constexpr double us = 1e-6, ms = 1e-3;

// Every pair of devices joined by its own full-duplex link: routes never share a link direction.
Cluster mesh_cluster(int n, double bandwidth, double latency) {
  Cluster c;
  c.name = "mesh";
  for (int i = 0; i < n; ++i) c.devices.push_back({"gpu" + std::to_string(i), test_device(), ""});
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) c.links.push_back({i, j, bandwidth, latency, Duplex::Full});
  return c;
}

std::string rows(const TaskGraph& g, const Timeline& t) {
  std::vector<std::string> out;
  for (size_t i = 0; i < g.tasks.size(); ++i) {
    const Task& k = g.tasks[i];
    out.push_back(fmt::format("{} {} {} {} {} {} {} {:a} {:a} {:a} {:a}", k.device, static_cast<int>(k.kind),
                              static_cast<int>(k.transfer), k.stage, k.peer_stage, k.micro_batch, k.peer,
                              k.bytes, k.duration, t.start[i], t.end[i]));
  }
  std::sort(out.begin(), out.end());
  std::string s;
  for (const std::string& r : out) s += r + "\n";
  return s;
}

// Replays `e`, compares with the stored timeline `name` (or writes it), returns the run and timeline.
std::pair<PreparedRun, Timeline> check_stored(const Experiment& e, const std::string& name) {
  Result<PreparedRun> run = prepare(e);
  if (!run) FAIL(run.error().message);
  Result<sim::Replay> r = process::replay_isolated(e.cluster, run->graph);
  if (!r) FAIL(r.error().message);
  const std::string got = rows(run->graph, r->timeline);
  const std::string path = std::string(PIPEGRID_SOURCE_DIR) + "/tests/sim/data/timelines/" + name + ".txt";
  if (std::getenv("PIPEGRID_WRITE_TIMELINES")) {
    std::ofstream(path) << got;
  } else {
    std::ifstream in(path);
    REQUIRE(in.good());
    std::stringstream want;
    want << in.rdbuf();
    CHECK(got == want.str());
  }
  // The same times with compute tasks as SimGrid Execs.
  sim::ReplayOptions execs;
  execs.simgrid_execs = true;
  Result<sim::Replay> a = process::replay_isolated(e.cluster, run->graph, execs);
  if (!a) FAIL(a.error().message);
  CHECK(rows(run->graph, a->timeline) == got);
  return {std::move(*run), std::move(r->timeline)};
}

// The analytic evaluator as oracle where it is exact (no link direction shared).
void check_against_evaluator(const Experiment& e, const PreparedRun& run, const Timeline& t) {
  Result<Timeline> a = evaluate(run.graph, e.cluster);
  REQUIRE(a.ok());
  const double tol = 1e-9 * a->makespan();
  for (size_t i = 0; i < t.start.size(); ++i) {
    INFO("task " << i);
    CHECK(std::abs(t.start[i] - a->start[i]) <= tol);
    CHECK(std::abs(t.end[i] - a->end[i]) <= tol);
  }
}

}  // namespace

TEST_CASE("timelines: 1f1b chain of 4 stages and 8 micro-batches") {
  Experiment e = chain_experiment(4, 8, 1 * ms, 2 * ms, "1f1b", mesh_cluster(4, 10e9, 1 * us), 1e6);
  auto [run, t] = check_stored(e, "1f1b_p4_m8");
  check_against_evaluator(e, run, t);
  // Transfers take 1 us + 1e6 / 10e9 s = 101 us; the iteration exceeds the communication-free
  // closed form (m + p - 1)(T_F + T_BW) = 33 ms by at least the 2 (p - 1) transfers of the first
  // forward and the last backward.
  CHECK(t.makespan() >= 33 * ms + 6 * 101 * us - 1e-12);
}

TEST_CASE("timelines: gpipe on 2 stages of 2 replicas with a ring all-reduce") {
  Experiment e = chain_experiment(2, 4, 2 * ms, 4 * ms, "gpipe", mesh_cluster(4, 10e9, 1 * us), 2e6);
  e.strategy.replicas = 2;
  auto [run, t] = check_stored(e, "gpipe_2x2_m4");
  check_against_evaluator(e, run, t);
  size_t allreduce = 0;
  for (const Task& k : run.graph.tasks) allreduce += k.transfer == TransferKind::DataParallel;
  CHECK(allreduce == 2 * 2 * 2);  // 2 stages x 2 replicas x 2 (n - 1) ring steps
}

TEST_CASE("timelines: graph-1f1b on a stage DAG of two branches joined") {
  // a1 -> a2 and b1 -> b2 joined by c (graphpipe_test.cc's join-fusion case): a stage DAG of depth 3.
  auto layer = [](const std::string& name, double f, double b) {
    Layer l;
    l.name = name;
    l.output_bytes = l.stash_bytes = 1e5;
    l.parameter_bytes = 4e6;
    l.parameters = 1e6;
    l.measured = MeasuredCost{f, b, 0, 1, ""};
    return l;
  };
  Experiment e;
  for (const char* n : {"a1", "a2", "b1", "b2"}) e.workload.add_layer(layer(n, 1 * ms, 2 * ms));
  const int c = e.workload.add_layer(layer("c", 1 * us, 1 * us));
  e.workload.add_edge(0, 1);
  e.workload.add_edge(2, 3);
  e.workload.add_edge(1, c);
  e.workload.add_edge(3, c);
  e.cluster = mesh_cluster(4, 10e9, 1 * us);
  e.strategy.micro_batches = 6;
  e.strategy.partitioner = "graphpipe";
  e.strategy.schedule = "graph-1f1b";
  auto [run, t] = check_stored(e, "graph1f1b_join_m6");
  REQUIRE(run.partition.stage_count() == 4);
  CHECK(run.partition.depth() == 3);
  check_against_evaluator(e, run, t);
}

TEST_CASE("timelines: max-min sharing of a trunk by replicated stages (mixed latencies)") {
  // sharing_test.cc's trunk cluster: gpu0, gpu1 on s0, gpu2, gpu3 on s1, a 10 GB/s trunk (1 us);
  // access links 1 TB/s, 1 us except gpu1's 20 us. GPipe over 2 stages of 2 replicas, one micro-batch,
  // 1 ms per pass and replica, 100 MB activations per replica pair, 20 kB of parameters per stage.
  // Derivation (times in us, see sharing_test.cc for each step): the two activations enter the
  // trunk at 1003 and 1022 and share it: the first ends at 20984, the second at 21003; the gradients
  // enter at 22987 and 23025 and end at 42949 and 42987; stage 0's ring all-reduce ends at 44029.02.
  Cluster c;
  for (int i = 0; i < 4; ++i) c.devices.push_back({"gpu" + std::to_string(i), test_device(), ""});
  c.switches = {"s0", "s1"};
  const double access = 1e12;
  c.links = {{0, 4, access, 1 * us, Duplex::Full},
             {1, 4, access, 20 * us, Duplex::Full},
             {2, 5, access, 1 * us, Duplex::Full},
             {3, 5, access, 1 * us, Duplex::Full},
             {4, 5, 10e9, 1 * us, Duplex::Full}};
  Experiment e = chain_experiment(2, 1, 2 * ms, 2 * ms, "gpipe", c, 200e6);
  for (int l = 0; l < 2; ++l) e.workload.graph[l].parameter_bytes = 20e3;
  e.strategy.replicas = 2;
  auto [run, t] = check_stored(e, "sharing_trunk_gpipe");
  double act_end[2] = {0, 0}, grad_end[2] = {0, 0};
  for (size_t i = 0; i < run.graph.tasks.size(); ++i) {
    const Task& k = run.graph.tasks[i];
    if (k.transfer == TransferKind::Activation) act_end[k.device] = t.end[i];  // from gpu0 or gpu1
    if (k.transfer == TransferKind::Gradient) grad_end[k.peer] = t.end[i];     // to gpu0 or gpu1
  }
  CHECK(close_rel(act_end[0], 20984 * us, 1e-9));
  CHECK(close_rel(act_end[1], 21003 * us, 1e-9));
  CHECK(close_rel(grad_end[0], 42949 * us, 1e-9));
  CHECK(close_rel(grad_end[1], 42987 * us, 1e-9));
  CHECK(close_rel(t.makespan(), 44029.02 * us, 1e-9));
}

TEST_CASE("timelines: 1f1b on a switch where activations and gradients share uplinks") {
  // 8 GPUs behind one switch (25 GB/s, 1 us per access link: routes of 2 us over two links), 60 MB
  // activations. Stage i sends activations to i + 1 and gradients to i - 1 over its one uplink; a
  // transfer alone takes 2 us + 60e6 / 25e9 s = 2402 us, longer than a backward (2 ms): an activation
  // sent after F is still in flight when the gradient of the next B leaves, so they share max-min. Checked:
  // compute tasks take exactly their durations, no transfer beats its time alone, some took longer.
  Cluster c = make_switch_cluster(8, "gpu", test_device(), 25e9, 1 * us);
  Experiment e = chain_experiment(8, 16, 1 * ms, 2 * ms, "1f1b", c, 60e6);
  auto [run, t] = check_stored(e, "1f1b_switch_p8_m16");
  int shared = 0;
  for (size_t i = 0; i < run.graph.tasks.size(); ++i) {
    const Task& k = run.graph.tasks[i];
    const double d = t.end[i] - t.start[i];
    if (k.is_compute()) {
      CHECK(std::abs(d - k.duration) <= 1e-12);
      continue;
    }
    CHECK(d >= 2402 * us - 1e-12);
    shared += d > 2402 * us + 1e-9;
  }
  CHECK(shared > 0);  // sharing did happen
}
