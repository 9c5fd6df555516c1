// core/job_queue.h against a queue counted by hand, with iteration times given by a rule instead of
// replays: 1 s per iteration for a job running alone, 2 s while two run together.
#include "core/job_queue.h"

#include <doctest/doctest.h>

#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

TEST_CASE("a queue of three jobs, first come first served, counted by hand") {
  Cluster c;
  c.name = "eight";
  for (int i = 0; i < 8; ++i)
    c.devices.push_back({"d" + std::to_string(i), test_device(), "m" + std::to_string(i / 2)});
  // A: 4 devices from 0 s, 10 iterations; B: 4 from 2 s, 5 iterations; C: all 8 from 3 s, 1 iteration.
  const std::vector<QueuedJob> jobs = {{0, 4, 10}, {2, 4, 5}, {3, 8, 1}};
  int calls = 0;
  const SetIterationTimes times = [&](const std::vector<RunningJob>& set) -> Result<std::vector<double>> {
    ++calls;
    return std::vector<double>(set.size(), set.size() == 1 ? 1.0 : 2.0);
  };
  Result<QueueOutcome> q = run_queue(c, jobs, JobPlacement::Packed, 1, times);
  REQUIRE(q.ok());
  // A alone [0, 2]: 2 iterations. With B from 2: both at 0.5 iterations/s; B's 5 take 10 s: B ends at
  // 12, A has 8 - 5 = 3 left, alone again: ends at 15. C waits from 3 (8 devices) and runs [15, 16].
  CHECK(q->jobs[0].start_s == 0);
  CHECK(q->jobs[0].end_s == approx(15));
  CHECK(q->jobs[1].start_s == 2);
  CHECK(q->jobs[1].end_s == approx(12));
  CHECK(q->jobs[2].start_s == approx(15));
  CHECK(q->jobs[2].end_s == approx(16));
  CHECK(q->jobs[0].devices == std::vector<int>{0, 1, 2, 3});
  CHECK(q->jobs[1].devices == std::vector<int>{4, 5, 6, 7});
  CHECK(q->makespan_s == approx(16));
  // Device-seconds: A 4 x 15, B 4 x 10, C 8 x 1 = 108 of 8 x 16.
  CHECK(q->utilisation == approx(108.0 / 128.0));
  CHECK(q->sets == 4);  // {A}, {A, B}, {A}, {C}
  CHECK(calls == 4);
}

TEST_CASE("a queue: a job larger than the cluster is an error, an idle gap until the next arrival") {
  Cluster c;
  c.name = "two";
  for (int i = 0; i < 2; ++i) c.devices.push_back({"d" + std::to_string(i), test_device(), ""});
  const SetIterationTimes one = [](const std::vector<RunningJob>& set) -> Result<std::vector<double>> {
    return std::vector<double>(set.size(), 1.0);
  };
  const std::vector<QueuedJob> big = {{0, 3, 1}};
  Result<QueueOutcome> bad = run_queue(c, big, JobPlacement::Packed, 1, one);
  REQUIRE(!bad.ok());
  CHECK(bad.error().message == "job 0 needs 3 devices, cluster two has 2");
  // 2 iterations from 0 s; the next job arrives at 5 s, after an idle gap: makespan 8, utilisation
  // (2 x 2 + 2 x 3) / (2 x 8).
  const std::vector<QueuedJob> gap = {{0, 2, 2}, {5, 2, 3}};
  Result<QueueOutcome> q = run_queue(c, gap, JobPlacement::Spread, 1, one);
  REQUIRE(q.ok());
  CHECK(q->jobs[1].start_s == 5);
  CHECK(q->makespan_s == approx(8));
  CHECK(q->utilisation == approx(10.0 / 16.0));
}

TEST_CASE("a queue far from 0 s ends its jobs where their time says (it looped for ever at 1e7 s)") {
  // One job of one iteration of 71.4 ms arriving at 1e7 s (then - now rounds to 0.07139999978 s,
  // leaving 3e-9 of an iteration that no longer moved the clock), and two more behind it.
  Cluster c;
  c.name = "one";
  c.devices.push_back({"d0", test_device(), ""});
  const SetIterationTimes times = [](const std::vector<RunningJob>& set) -> Result<std::vector<double>> {
    return std::vector<double>(set.size(), 0.0714);
  };
  for (double at : {3e6, 1e7, 1e8}) {  // the clock's step at 1e8 s is 1.5e-8 s
    CAPTURE(at);
    const std::vector<QueuedJob> jobs = {{at, 1, 1}, {at, 1, 5}, {at + 1, 1, 3}};
    Result<QueueOutcome> q = run_queue(c, jobs, JobPlacement::Packed, 1, times);
    REQUIRE(q.ok());
    CHECK(q->jobs[0].end_s - at == approx(0.0714).epsilon(1e-6));
    CHECK(q->jobs[1].end_s - at == approx(6 * 0.0714).epsilon(1e-6));
    CHECK(q->jobs[2].start_s - at == approx(1).epsilon(1e-6));
    CHECK(q->makespan_s - at == approx(1 + 3 * 0.0714).epsilon(1e-6));
  }
}
