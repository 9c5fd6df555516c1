// core/jobs.h without a replay: a job's view of the cluster keeps the shared cluster's routes,
// placements pick the devices their definitions say, joined graphs keep each job's tasks and add the
// iteration barriers, and iteration times follow a timeline written by hand.
#include "core/jobs.h"

#include <doctest/doctest.h>

#include "core/topologies/generators.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

// 4 machines of 2 devices (m0: d0 d1, ...), each machine on its own switch, switches on a core.
Cluster four_machines() {
  Cluster c;
  c.name = "four";
  for (int i = 0; i < 8; ++i)
    c.devices.push_back({"d" + std::to_string(i), test_device(), "m" + std::to_string(i / 2)});
  c.switches = {"s0", "s1", "s2", "s3", "core"};
  for (int i = 0; i < 8; ++i) c.links.push_back({i, 8 + i / 2, 1e11, 1e-6, Duplex::Full});
  for (int s = 0; s < 4; ++s) c.links.push_back({8 + s, 12, 1e10, 1e-6, Duplex::Full});
  return c;
}

std::vector<bool> none_taken(const Cluster& c) {
  return std::vector<bool>(c.devices.size(), false);
}

}  // namespace

TEST_CASE("job_cluster: the job's devices first, the others become switches, routes unchanged") {
  const Cluster c = four_machines();
  const std::vector<int> devices = {5, 2, 7};
  Result<Cluster> j = job_cluster(c, devices);
  REQUIRE(j.ok());
  REQUIRE(j->devices.size() == 3);
  CHECK(j->devices[0].name == "d5");
  CHECK(j->devices[1].name == "d2");
  CHECK(j->machine_of(0) == "m2");
  CHECK(j->switches.size() == 5 + 5);
  CHECK(validate(*j).ok());
  const Router shared(c), mine(*j);
  for (size_t a = 0; a < devices.size(); ++a)
    for (size_t b = 0; b < devices.size(); ++b) {
      if (a == b) continue;
      Result<Route> r1 = shared.route(devices[a], devices[b]);
      Result<Route> r2 = mine.route(static_cast<int>(a), static_cast<int>(b));
      REQUIRE(r1.ok());
      REQUIRE(r2.ok());
      CHECK(r1->hops == r2->hops);  // the same links, in the same directions
    }
  CHECK(!job_cluster(c, std::vector<int>{1, 1}).ok());
  CHECK(!job_cluster(c, std::vector<int>{8}).ok());
}

TEST_CASE("job_cluster keeps a fat-tree's destination-mod-k routes") {
  Result<Cluster> c = make_fat_tree_cluster(4, 16, "gpu", test_device(), {1e10, 1e-6});
  REQUIRE(c.ok());
  const std::vector<int> devices = {9, 0, 14, 3};
  Result<Cluster> j = job_cluster(*c, devices);
  REQUIRE(j.ok());
  const Router shared(*c), mine(*j);
  for (size_t a = 0; a < devices.size(); ++a)
    for (size_t b = 0; b < devices.size(); ++b)
      if (a != b)
        CHECK(shared.route(devices[a], devices[b])->hops ==
              mine.route(static_cast<int>(a), static_cast<int>(b))->hops);
}

TEST_CASE("placements: packed, spread and random take the devices their definitions say") {
  const Cluster c = four_machines();
  std::vector<bool> taken = none_taken(c);
  CHECK(*place_job(c, taken, 3, JobPlacement::Packed, 0) == std::vector<int>{0, 1, 2});
  // Spread: 4 devices on machines at stride 4 / 2 = 2: m0 and m2.
  CHECK(*place_job(c, taken, 4, JobPlacement::Spread, 0) == std::vector<int>{0, 1, 4, 5});
  taken[1] = true;  // m0 is no longer whole: spread takes m1 and m3 of the whole m1, m2, m3 (stride 3 / 2)
  CHECK(*place_job(c, taken, 4, JobPlacement::Spread, 0) == std::vector<int>{2, 3, 4, 5});
  CHECK(*place_job(c, taken, 3, JobPlacement::Packed, 0) == std::vector<int>{0, 2, 3});
  // Random: whole free machines, the same draw for the same seed.
  Result<std::vector<int>> r1 = place_job(c, taken, 4, JobPlacement::Random, 7);
  REQUIRE(r1.ok());
  CHECK(*r1 == *place_job(c, taken, 4, JobPlacement::Random, 7));
  for (int d : *r1) CHECK(d >= 2);
  CHECK((*r1)[0] % 2 == 0);
  CHECK((*r1)[1] == (*r1)[0] + 1);
  Result<std::vector<int>> too_many = place_job(c, taken, 7, JobPlacement::Spread, 0);
  REQUIRE(!too_many.ok());
  CHECK(too_many.error().message == "7 devices wanted, the 3 whole free machines of cluster four have 6");
  CHECK(!place_job(c, taken, 8, JobPlacement::Packed, 0).ok());
}

TEST_CASE("join_jobs: each job's iterations in order, a start task and barriers, times by hand") {
  // A job of two devices: F0 on its device 0, a transfer to device 1, F1 there.
  TaskGraph g;
  g.device_order.resize(2);
  g.static_memory.resize(2);
  Task f0;
  f0.device = 0;
  f0.duration = 1;
  Task f1 = f0;
  f1.device = 1;
  const int32_t a = g.add(f0), t = g.add(transfer(0, 1, 10)), b = g.add(f1);
  g.depend(a, t);
  g.depend(t, b);
  g.device_order[0] = {a};
  g.device_order[1] = {b};
  const std::vector<JobRun> jobs = {{&g, {3, 1}, 2, 0}, {&g, {0, 2}, 1, 5.0}};
  Result<JobsGraph> j = join_jobs(4, jobs);
  REQUIRE(j.ok());
  // Job 0: 3 + barrier + 3 tasks; job 1: start task + 3.
  CHECK(j->begin == std::vector<int32_t>{0, 7, 11});
  CHECK(j->first[0] == std::vector<int32_t>{0, 4});
  CHECK(j->first[1] == std::vector<int32_t>{8});
  const TaskGraph& all = j->graph;
  CHECK(all.tasks[1].device == 3);
  CHECK(all.tasks[1].peer == 1);
  CHECK(all.device_order[3] == std::vector<int32_t>{0, 3, 4});  // F0, the barrier, F0 again
  CHECK(all.device_order[1] == std::vector<int32_t>{2, 6});
  CHECK(all.tasks[7].duration == 5.0);
  CHECK(all.device_order[0] == std::vector<int32_t>{7, 8});
  // The barrier waits for iteration 0's sink (F1) and opens iteration 1's source (F0).
  CHECK(all.successors(2).size() == 1);
  CHECK(all.successors(2)[0] == 3);
  CHECK(all.successors(3)[0] == 4);
  CHECK(all.predecessor_count[8] == 1);  // job 1's F0 waits for its start
  CHECK(j->job_of(6) == 0);
  CHECK(j->job_of(7) == 1);
  // A timeline by hand: job 0's first iteration ends at 4, its second runs [4, 9]; job 1 starts at 5
  // and ends at 8.
  Timeline tl;
  tl.start = {0, 1, 3, 4, 4, 5, 8, 0, 5, 6, 7};
  tl.end = {1, 3, 4, 4, 5, 8, 9, 5, 6, 7, 8};
  CHECK(iteration_times(*j, tl, 0) == std::vector<double>{4, 5});
  CHECK(iteration_times(*j, tl, 1) == std::vector<double>{3});
  const Timeline second = iteration_timeline(*j, tl, 0, 1);
  CHECK(second.start == std::vector<double>{0, 1, 4});
  CHECK(second.end == std::vector<double>{1, 4, 5});
  const std::vector<JobRun> overlapping = {{&g, {0, 1}, 1, 0}, {&g, {1, 2}, 1, 0}};
  Result<JobsGraph> bad = join_jobs(4, overlapping);
  REQUIRE(!bad.ok());
  CHECK(bad.error().message == "job 1: device 1 is another job's");
}
