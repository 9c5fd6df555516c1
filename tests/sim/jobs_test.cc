// Several jobs on one network (core/jobs.h): two data-parallel jobs whose gradient all-reduces cross
// one trunk, replayed together, against iteration times counted by hand from max-min sharing.
#include "core/jobs.h"

#include <doctest/doctest.h>

#include "core/experiment.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

constexpr double ms = 1e-3;

// gpu0, gpu2 on switch s0; gpu1, gpu3 on s1; one 10 GB/s trunk s0 -- s1; 1 TB/s access links; no
// latencies.
Cluster trunk() {
  Cluster c;
  c.name = "trunk";
  for (int i = 0; i < 4; ++i) c.devices.push_back({"gpu" + std::to_string(i), test_device(), ""});
  c.switches = {"s0", "s1"};
  const int s0 = 4, s1 = 5;
  c.links = {{0, s0, 1e12, 0, Duplex::Full},
             {2, s0, 1e12, 0, Duplex::Full},
             {1, s1, 1e12, 0, Duplex::Full},
             {3, s1, 1e12, 0, Duplex::Full},
             {s0, s1, 10e9, 0, Duplex::Full}};
  return c;
}

// One layer on two data-parallel replicas: 1 ms forward and 1 ms backward per replica, 200 MB of
// gradients, reduced by a ring all-reduce of two 100 MB chunks (two steps, one flow each way per
// step), then an optimizer step of no time.
struct Job {
  Experiment experiment;
  PreparedRun run;
  std::vector<int> devices;
};

Job job(const Cluster& shared, std::vector<int> devices) {
  Result<Cluster> c = job_cluster(shared, devices);
  REQUIRE(c.ok());
  Experiment e = chain_experiment(1, 1, 2 * ms, 2 * ms, "gpipe", *c);
  e.workload.graph[0].parameter_bytes = 200e6;
  e.strategy.replicas = 2;
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  for (const Task& t : run->graph.tasks) {
    if (t.is_compute() && t.duration > 0) REQUIRE(t.duration == approx(1 * ms));
    if (t.transfer == TransferKind::DataParallel) REQUIRE(t.bytes == approx(100e6));
  }
  return {std::move(e), std::move(*run), std::move(devices)};
}

struct Together {
  std::vector<std::vector<double>> times;  // per job, per iteration
  SharedTraffic shared;
};

Together replay(const Cluster& c, const std::vector<const Job*>& jobs, const std::vector<double>& start,
                int iterations = 1) {
  std::vector<JobRun> runs;
  for (size_t j = 0; j < jobs.size(); ++j)
    runs.push_back({&jobs[j]->run.graph, jobs[j]->devices, iterations, start[j]});
  Result<JobsGraph> g = join_jobs(c.devices.size(), runs);
  REQUIRE(g.ok());
  Result<sim::Replay> r = process::replay_isolated(c, g->graph);
  if (!r) FAIL(r.error().message);
  Together out;
  for (size_t j = 0; j < jobs.size(); ++j)
    out.times.push_back(iteration_times(*g, r->timeline, static_cast<int>(j)));
  Result<SharedTraffic> s = shared_links(c, *g, r->timeline, 0);
  REQUIRE(s.ok());
  out.shared = std::move(*s);
  return out;
}

}  // namespace

TEST_CASE("two jobs' all-reduces on one trunk: max-min halves each flow's rate") {
  const Cluster c = trunk();
  const Job a = job(c, {0, 1}), b = job(c, {2, 3});  // both rings cross the trunk, both ways
  // Alone: F [0, 1], B [1, 2] ms; step 0 sends 100 MB each way over the 10 GB/s trunk: 10 ms; step 1
  // the same: the iteration ends at 22 ms.
  CHECK(replay(c, {&a}, {0}).times[0][0] == approx(22 * ms));
  CHECK(replay(c, {&b}, {0}).times[0][0] == approx(22 * ms));
  SUBCASE("at the same time: each direction of the trunk carries two flows at 5 GB/s") {
    // Both steps take 20 ms: 2 + 20 + 20 = 42 ms for each job, twice over with two iterations (the
    // barrier starts both second iterations at 42 ms). Each trunk direction carries 200 MB of each
    // job per iteration, with both jobs in flight from 2 to 42 ms.
    const Together t = replay(c, {&a, &b}, {0, 0}, 2);
    for (int j = 0; j < 2; ++j) {
      CHECK(t.times[j][0] == approx(42 * ms));
      CHECK(t.times[j][1] == approx(42 * ms));
    }
    REQUIRE(t.shared.links.size() == 2);  // the trunk, each way
    for (const SharedLink& l : t.shared.links) {
      CHECK(l.link == 4);
      CHECK(l.bytes[0] == approx(400e6));
      CHECK(l.bytes[1] == approx(400e6));
      CHECK(l.together_s == approx(80 * ms));
    }
    CHECK(t.shared.links[0].reverse != t.shared.links[1].reverse);
    REQUIRE(t.shared.busy[0].size() == 2);  // job a on the trunk: [2, 42] and [44, 84] ms
    CHECK(t.shared.busy[0][1].first == approx(44 * ms));
    CHECK(t.shared.busy[0][1].second == approx(84 * ms));
  }
  SUBCASE("b starts 12 ms later: the flows overlap from 14 to 30 ms") {
    // a: step 0 [2, 12] alone; step 1 from 12: alone to 14 (20 MB), then 5 GB/s while b's step 0
    // runs: its last 80 MB take 16 ms, to 30. b: F, B [12, 14]; step 0 from 14 at 5 GB/s to 30 (80
    // MB), its last 20 MB alone: 32; step 1 alone [32, 42]. a's iteration 30 ms; b's 42 - 12 = 30 ms.
    const Together t = replay(c, {&a, &b}, {0, 12 * ms});
    CHECK(t.times[0][0] == approx(30 * ms));
    CHECK(t.times[1][0] == approx(30 * ms));
    for (const SharedLink& l : t.shared.links) CHECK(l.together_s == approx(16 * ms));
  }
  SUBCASE("b starts when a ends: each takes its time alone") {
    const Together t = replay(c, {&a, &b}, {0, 22 * ms});
    CHECK(t.times[0][0] == approx(22 * ms));
    CHECK(t.times[1][0] == approx(22 * ms));
    for (const SharedLink& l : t.shared.links) CHECK(l.together_s == 0);
  }
}

TEST_CASE("two jobs on disjoint switches: each takes its time alone") {
  const Cluster c = trunk();
  // a on gpu0, gpu2 (both on s0), b on gpu1, gpu3 (s1): the rings use access links only, 100 MB at
  // 1 TB/s = 0.1 ms a step: 1 + 1 + 0.1 + 0.1 = 2.2 ms.
  const Job a = job(c, {0, 2}), b = job(c, {1, 3});
  const Together t = replay(c, {&a, &b}, {0, 0}, 3);
  for (int j = 0; j < 2; ++j)
    for (double x : t.times[j]) CHECK(x == approx(2.2 * ms));
  CHECK(t.shared.links.empty());
}
