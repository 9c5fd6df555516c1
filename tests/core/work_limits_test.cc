// Work-size limits (issue 16): the task graph's size is counted before anything is allocated, and
// plans, mini-batch sweeps and planner searches above the documented limits are refused with a
// message naming the product and the limit.
#include <doctest/doctest.h>

#include "core/experiment.h"
#include "core/lower.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

TEST_CASE("count_tasks: a 1F1B chain has 2pm + p compute tasks and 2(p - 1)m transfers") {
  // p = 4 stages, m = 8 micro-batches, one device each: F and B of every (stage, micro-batch) plus
  // one optimizer step per device = 2*4*8 + 4 = 68; activations and gradients across each of the 3
  // boundaries per micro-batch = 2*3*8 = 48; no all-reduce. 116 in all.
  Experiment e =
      chain_experiment(4, 8, 1e-3, 2e-3, "1f1b", make_switch_cluster(4, "gpu", test_device(), 1e9, 0));
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  const TaskCount n = count_tasks(run->partition, 8, 2);
  CHECK(n.compute == 68);
  CHECK(n.transfers == 48);
  CHECK(n.ring_steps == 0);
  CHECK(run->graph.tasks.size() == 116);
}

TEST_CASE("count_tasks: replicated stages add their ring all-reduce steps") {
  // 2 stages x 2 replicas on 4 devices, m = 3: compute 2*2*3*2 + 4 optimizer steps = 28; replica
  // i of the first stage shares its half of each micro-batch with replica i of the second only
  // (2 pairs), 2 transfers per pair and micro-batch = 12; a ring of r = 2 takes 2(r - 1) steps of
  // r transfers = 4 per stage, 8 in all. 48 tasks.
  Experiment e =
      chain_experiment(2, 3, 1e-3, 2e-3, "1f1b", make_switch_cluster(4, "gpu", test_device(), 1e9, 0));
  e.strategy.replicas = 2;
  e.strategy.stages = 2;
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  const TaskCount n = count_tasks(run->partition, 3, 2);
  CHECK(n.compute == 28);
  CHECK(n.transfers == 12);
  CHECK(n.ring_steps == 8);
  CHECK(run->graph.tasks.size() == 48);
}

TEST_CASE("a plan above the task limit is refused before it is scheduled") {
  // 64 stages x 1,000,000 micro-batches x 2 passes = 128,000,000 compute tasks > 2^25.
  Experiment e = chain_experiment(64, 1000000, 1e-3, 2e-3, "gpipe",
                                  make_switch_cluster(64, "gpu", test_device(), 1e9, 0));
  Result<PreparedRun> run = prepare(e);
  REQUIRE_FALSE(run.ok());
  CHECK(run.error().message.find("1000000 micro-batches x 64 stage replicas (64 stages) x 2 passes") !=
        std::string::npos);
  CHECK(run.error().message.find("128000064 compute tasks") != std::string::npos);  // + 64 optimizer steps
  CHECK(run.error().message.find("limit of 33554432") != std::string::npos);
}

TEST_CASE("a mini-batch whose divisors make too many micro-batches is refused before planning") {
  // 720720 = 2^4 3^2 5 7 11 13 has (4+1)(2+1)(1+1)^4 = 240 divisors summing to
  // 31 * 13 * 6 * 8 * 12 * 14 = 3,249,792 micro-batches; each costs 8 stages x 2 passes + 2 x 7
  // transfers = 30 tasks: 97,493,760 > 2^25.
  Experiment e =
      chain_experiment(8, 1, 1e-3, 2e-3, "1f1b", make_switch_cluster(8, "gpu", test_device(), 1e9, 0));
  e.strategy.mini_batch = 720720;
  Result<PreparedRun> run = prepare(e);
  REQUIRE_FALSE(run.ok());
  CHECK(run.error().message.find("240 micro-batch sizes make 3249792 micro-batches in all, x 30 tasks") !=
        std::string::npos);
  CHECK(run.error().message.find("= 97493760 tasks") != std::string::npos);
}

TEST_CASE("a mini-batch sweep within the limit still plans") {
  // 64 has 7 divisors summing to 127 micro-batches, x 30 tasks: far below the limit.
  Experiment e =
      chain_experiment(8, 1, 1e-3, 2e-3, "1f1b", make_switch_cluster(8, "gpu", test_device(), 1e9, 0));
  e.strategy.mini_batch = 64;
  CHECK(prepare(e).ok());
}

TEST_CASE("graphpipe refuses a chain too long for its memo before planning") {
  // One series node of 2,000 leaves: 2000 * 2001 / 2 runs x 9 device counts (18,009,000) + the
  // runs' layer lists (2000 * 2001 * 2002 / 6 = 1,335,334,000) = 1.35e9 cells > 2^28.
  Experiment e = chain_experiment(2000, 8, 1e-3, 2e-3, "graph-1f1b",
                                  make_switch_cluster(8, "gpu", test_device(), 1e9, 0));
  e.strategy.partitioner = "graphpipe";
  Result<PreparedRun> run = prepare(e);
  REQUIRE_FALSE(run.ok());
  CHECK(run.error().message.find("graphpipe: planning needs about 1.35e+09 memo cells") != std::string::npos);
}

TEST_CASE("graphpipe refuses a series of more parts than its memo keys hold") {
  // 10,000 layers in a chain: one series node of 10,000 children, above 4,095 (12 bits of the key).
  Experiment e = chain_experiment(10000, 8, 1e-3, 2e-3, "graph-1f1b",
                                  make_switch_cluster(8, "gpu", test_device(), 1e9, 0));
  e.strategy.partitioner = "graphpipe";
  Result<PreparedRun> run = prepare(e);
  REQUIRE_FALSE(run.ok());
  CHECK(run.error().message.find("a node of 10000 parts") != std::string::npos);
  CHECK(run.error().message.find("limit of 4095") != std::string::npos);
}
