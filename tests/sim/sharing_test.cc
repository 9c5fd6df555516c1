// How flows that cross one link direction share it in the replay: max-min fair by default, whatever
// the route latencies (latency only delays a flow's start); RTT-weighted with `sharing: tcp`
// (SimGrid's CM02 with real latencies, where a flow's penalty is its route latency). Every expected
// value is computed by hand below from the platform the test builds.
#include <doctest/doctest.h>

#include "core/cluster.h"
#include "core/experiment.h"
#include "core/task_graph.h"
#include "sim/replay.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

constexpr double us = 1e-6, ms = 1e-3;
constexpr double kAccess = 1e12;  // access links: 1 TB/s, never a bottleneck here

// gpu0, gpu1 on switch s0; gpu2, gpu3 on s1; one 10 GB/s trunk s0 -- s1 (1 us). Every access link
// has 1 us of latency except gpu1's (20 us). Route latencies: gpu0 <-> gpu2 3 us, gpu1 <-> gpu3
// 22 us, gpu0 <-> gpu1 21 us, gpu2 <-> gpu3 2 us.
Cluster trunk_cluster(Sharing sharing) {
  Cluster c;
  for (int i = 0; i < 4; ++i) c.devices.push_back({"gpu" + std::to_string(i), test_device(), ""});
  c.switches = {"s0", "s1"};
  const int s0 = 4, s1 = 5;
  c.links = {{0, s0, kAccess, 1 * us, Duplex::Full},
             {1, s0, kAccess, 20 * us, Duplex::Full},
             {2, s1, kAccess, 1 * us, Duplex::Full},
             {3, s1, kAccess, 1 * us, Duplex::Full},
             {s0, s1, 10e9, 1 * us, Duplex::Full}};
  c.sharing = sharing;
  return c;
}

// GPipe over two stages of two data-parallel replicas (stage 0 on gpu0, gpu1; stage 1 on gpu2,
// gpu3), one micro-batch: 1 ms per pass and replica, 100 MB activations and gradients per replica
// pair (gpu0 <-> gpu2, gpu1 <-> gpu3, all over the trunk), 20 kB of parameters per stage (ring
// all-reduce of two 10 kB chunks, 10 ns each on an access link).
struct Iteration {
  double iteration = 0;
  double first_activation_end = 0;  // the gpu0 -> gpu2 activation
};

Iteration iteration(Sharing sharing) {
  // Replicas halve the chain's per-micro-batch times and activations.
  Experiment e = chain_experiment(2, 1, 2 * ms, 2 * ms, "gpipe", trunk_cluster(sharing), 200e6);
  for (int l = 0; l < 2; ++l) e.workload.graph[l].parameter_bytes = 20e3;
  e.strategy.replicas = 2;
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  Iteration out;
  int activation = -1;
  for (size_t t = 0; t < run->graph.tasks.size(); ++t) {
    const Task& task = run->graph.tasks[t];
    if (task.is_compute()) {
      if (task.duration > 0) REQUIRE(task.duration == pipegrid::testing::approx(1 * ms));
      continue;
    }
    if (task.transfer == TransferKind::Activation || task.transfer == TransferKind::Gradient)
      REQUIRE(task.bytes == pipegrid::testing::approx(100e6));
    if (task.transfer == TransferKind::DataParallel) REQUIRE(task.bytes == pipegrid::testing::approx(10e3));
    if (task.transfer == TransferKind::Activation && task.device == 0) activation = static_cast<int>(t);
  }
  REQUIRE(activation >= 0);
  Result<sim::Replay> r = process::replay_isolated(e.cluster, run->graph);
  if (!r) FAIL(r.error().message);
  out.iteration = r->timeline.makespan();
  out.first_activation_end = r->timeline.end[activation];
  return out;
}

}  // namespace

TEST_CASE("max-min sharing: two flows with route latencies 3 us and 22 us get equal shares of a trunk") {
  // Times in us; the trunk carries 10e3 bytes/us, so two flows get 5e3 each.
  // Forward: F on gpu0 and gpu1 [0, 1000]. Activation A (gpu0 -> gpu2) enters the network at
  // 1000 + 3 = 1003, B (gpu1 -> gpu3) at 1000 + 22 = 1022. A alone for 19 us: 190e3 bytes; then
  // 5e3 each: A's 99.81e6 left take 19962 us, A ends at 1022 + 19962 = 20984. B has 190e3 left and
  // the whole trunk: ends at 20984 + 19 = 21003 (= 1003 + 200e6 / 10e3, the trunk never idles).
  // gpu2: F [20984, 21984], B [21984, 22984]; gpu3: F [21003, 22003], B [22003, 23003].
  // Gradient A' (gpu2 -> gpu0) enters at 22984 + 3 = 22987, B' (gpu3 -> gpu1) at 23003 + 22 = 23025:
  // A' alone for 38 us (380e3 bytes), then 5e3 each: A' ends at 23025 + 99.62e6 / 5e3 = 42949, B'
  // at 42949 + 380e3 / 10e3 = 42987. Backward on gpu0 [42949, 43949], on gpu1 [42987, 43987].
  // Ring all-reduce of stage 0 (10 kB chunks, route 21 us, 1e6 bytes/us: 0.01 us alone): step 0
  // x0 gpu0 -> gpu1 at 43949 (ends 43970.01); y0 gpu1 -> gpu0 at 43987, enters at 44008, ends
  // 44008.01; step 1 y1 gpu1 -> gpu0 has x0 and gpu1's backward but waits for y0, ahead of it on the
  // connection gpu1 -> gpu0 (the replay sends a collective's chunks on a connection in order): it
  // goes at 44008.01 and ends at 44008.01 + 21 + 0.01 = 44029.02; x1 gpu0 -> gpu1 waits for y0's
  // arrival: the same 44029.02, the other direction. Stage 1's all-reduce (2 us routes) ends long
  // before; the optimizer steps take 0.
  const Iteration it = iteration(Sharing::MaxMin);
  CHECK(close_rel(it.first_activation_end, 20984 * us, 1e-9));
  CHECK(close_rel(it.iteration, 44029.02 * us, 1e-9));
}

TEST_CASE("tcp sharing: shares of a trunk are inversely proportional to route latencies (CM02)") {
  // CM02 gives a flow the LMM penalty of its route latency: A (3 us) and B (22 us) get the trunk in
  // the ratio 1/3 : 1/22 = 22 : 3, i.e. A 10e3 x 22/25 = 8.8e3 bytes/us and B 1.2e3. Times in us.
  // Forward: A alone from 1003 to 1022 (190e3 bytes), then 8.8e3: 99.81e6 / 8.8e3 = 11342.04545...,
  // A ends at 1022 + 11342.04545... = 12364.04545... The trunk never idles: B ends at
  // 1003 + 200e6 / 10e3 = 21003. gpu2: F [12364.045.., 13364.045..], B until 14364.045..; gpu3:
  // F [21003, 22003], B [22003, 23003]. Gradient A' enters at 14367.045.., B' at 23025: A' alone
  // for 23025 - 14367.045.. = 8657.954.. us (86.579545..e6 bytes), then 8.8e3 for its last
  // 13.420454..e6 bytes: 1525.0516.. us, A' ends at 24550.0516... B' ends when the trunk has
  // carried both gradients since 14367.045..: 14367.045.. + 20000 = 34367.045... Backward on gpu1
  // until 35367.045..; the stage-0 ring as in the max-min case (one chunk per connection at a time):
  // y0 ends at 35367.045.. + 21.01, y1 and x1 (both sent then) 21.01 later: 35367.045.. + 42.02.
  const double a_end = 1022 + (100e6 - 190e3) / 8.8e3;
  const Iteration it = iteration(Sharing::Tcp);
  CHECK(close_rel(it.first_activation_end, a_end * us, 1e-9));
  CHECK(close_rel(a_end, 12364.0454545454545, 1e-15));
  const double b_gradient_end = (a_end + 2000 + 3) + 200e6 / 10e3;
  CHECK(close_rel(it.iteration, (b_gradient_end + 1000 + 42.02) * us, 1e-9));
}

TEST_CASE("max-min sharing: progressive filling with three flows, two bottlenecks and staggered starts") {
  // a, b on switch s1; x on s2; c on s2; y, z on s3. L1 = s1 -- s2 (10 GB/s = 10e6 bytes/ms),
  // L2 = s2 -- s3 (4 GB/s = 4e6 bytes/ms), both 1 ms of latency; access links 1 TB/s with latencies
  // (ms) a 1, b 10, c 5, x 1, y 1, z 1. Flows (all launched at 0): A a -> x over L1 (route 3 ms),
  // B b -> y over L1 and L2 (13 ms), C c -> z over L2 (7 ms). Times in ms, rates in 1e6 bytes/ms.
  //   3..7   A alone on L1: 10.                                      A 40
  //   7..13  A 10; C alone on L2: 4.                                 A 100, C 24
  //   13..23 L2 is the bottleneck of B and C: 2 each; A gets L1's 8. A 180, B 20, C 44: C ends
  //   23..33 L1 fair share 5, but B is capped at 4 by L2; A gets 6.  A 240: A ends; B 60
  //   33..43 B alone at 4 (L2).                                      B 100: B ends
  Cluster c;
  for (const char* n : {"a", "b", "c", "x", "y", "z"}) c.devices.push_back({n, test_device(), ""});
  c.switches = {"s1", "s2", "s3"};
  const int s1 = 6, s2 = 7, s3 = 8;
  c.links = {{0, s1, kAccess, 1 * ms, Duplex::Full}, {1, s1, kAccess, 10 * ms, Duplex::Full},
             {2, s2, kAccess, 5 * ms, Duplex::Full}, {3, s2, kAccess, 1 * ms, Duplex::Full},
             {4, s3, kAccess, 1 * ms, Duplex::Full}, {5, s3, kAccess, 1 * ms, Duplex::Full},
             {s1, s2, 10e9, 1 * ms, Duplex::Full},   {s2, s3, 4e9, 1 * ms, Duplex::Full}};
  TaskGraph g;
  g.device_order.resize(c.devices.size());
  g.static_memory.resize(c.devices.size());
  g.add(transfer(0, 3, 240e6));
  g.add(transfer(1, 4, 100e6));
  g.add(transfer(2, 5, 44e6));
  Result<sim::Replay> r = process::replay_isolated(c, g);
  REQUIRE(r.ok());
  CHECK(close_rel(r->timeline.end[0], 33 * ms, 1e-9));
  CHECK(close_rel(r->timeline.end[1], 43 * ms, 1e-9));
  CHECK(close_rel(r->timeline.end[2], 23 * ms, 1e-9));
}
