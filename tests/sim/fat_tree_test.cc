// A 1024-device fat-tree: the platform builds and a 1F1B pipeline with data-parallel replicas
// simulates, within bounds computed by hand and by the contention-free evaluator.
#include <doctest/doctest.h>

#include "core/evaluate.h"
#include "core/metrics.h"
#include "core/topologies/generators.h"
#include "sim/replay.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;

TEST_CASE("1F1B with 64 replicas per stage on a 1024-device 16-ary fat-tree") {
  // 16 stages x 64 replicas, 16 micro-batches; each replica computes 1/64 of a micro-batch.
  const int p = 16, r = 64, m = 16;
  const double tf = 64e-3, tbw = 128e-3, B = 25e9;
  Cluster c = *make_fat_tree_cluster(16, 1024, "gpu", test_device(80e9), {B, 1e-6});
  Experiment e = chain_experiment(p, m, tf, tbw, "1f1b", std::move(c), 64.0 * (1 << 20));
  e.strategy.replicas = r;
  PreparedRun run = *prepare(e);
  REQUIRE(run.partition.stage_count() == static_cast<size_t>(p));
  CHECK(run.partition.stage(3).devices.front() == 3 * r);
  CHECK(run.partition.stage(3).devices.back() == 4 * r - 1);
  Result<sim::Replay> replay = process::replay_isolated(e.cluster, run.graph);
  REQUIRE(replay.ok());
  const Metrics metrics = compute_metrics(e.cluster, run.graph, replay->timeline);
  int used = 0;
  for (const DeviceMetrics& d : metrics.devices) used += d.used;
  CHECK(used == 1024);
  const double t = replay->timeline.makespan();
  // Lower bounds: the 1F1B pipeline of the replicas' compute, (m + p - 1)(T_F + T_BW) / r, plus the
  // ring all-reduce of each stage's 1 MiB of gradients at the link bandwidth, 2 (r - 1)/r x G / B;
  // and the same task graph without contention (the analytic evaluator).
  const double pipeline = (m + p - 1) * (tf + tbw) / r;
  const double allreduce = 2.0 * (r - 1) / r * (1 << 20) / B;
  CHECK(t >= pipeline + allreduce);
  const double free = evaluate(run.graph, e.cluster)->makespan();
  CHECK(t >= free * (1 - 1e-9));
  // Destination-mod-k routing gives every pod-to-pod flow of the pipeline its own links; what is
  // left is a ring step of one stage sharing an edge uplink with a gradient of the next, now and
  // then: a few per cent at most (with shortest-path ties broken by index instead, every flow from
  // a pod climbed through the same aggregation and core switch and the iteration took 3 x longer).
  CHECK(t <= free * 1.05);
}
