// The DAPPLE-style planner (core/planners/dapple.cc) on small cases whose best plan is derived by hand.
#include <doctest/doctest.h>

#include "core/experiment.h"
#include "core/memory.h"
#include "core/planner.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

// Two machines m0 = {gpu0, gpu1} and m1 = {gpu2, gpu3}: inside a machine 100 GB/s (gpu - switch -
// gpu), between machines 1 GB/s (the machine switches' uplinks to "net"); no latency.
Cluster two_machines() {
  Cluster c;
  c.name = "two-machines";
  for (int d = 0; d < 4; ++d)
    c.devices.push_back({"gpu" + std::to_string(d), test_device(), d < 2 ? "m0" : "m1"});
  c.switches = {"m0-sw", "m1-sw", "net"};
  for (int d = 0; d < 4; ++d) c.links.push_back({d, 4 + d / 2, 100e9, 0, Duplex::Full});
  c.links.push_back({4, 6, 1e9, 0, Duplex::Full});
  c.links.push_back({5, 6, 1e9, 0, Duplex::Full});
  return c;
}

// Two layers, F 1 ms + B `backward` per micro-batch of 2 samples each, 1 GB of weights each, run by
// the dapple planner with m micro-batches.
Experiment two_layers(double backward, double activation, Cluster cluster, int m) {
  ChainSpec spec;
  spec.layers = 2;
  spec.forward_s = 1e-3;
  spec.backward_s = backward;
  spec.activation_bytes = activation;
  spec.parameter_bytes = 1e9;
  spec.samples_per_micro_batch = 2;
  Experiment e;
  e.workload = make_chain(spec);
  e.cluster = std::move(cluster);
  e.strategy.planner = "dapple";
  e.strategy.micro_batches = m;
  return e;
}

}  // namespace

TEST_CASE("dapple keeps each replicated stage inside a machine when its all-reduce is heavy") {
  // Two layers, F 1 ms + B 3 ms per micro-batch of 2 samples each (replicas take whole samples, so
  // 2 replicas at most per stage), 1 GB of weights each, 1 MB of activations, 16 micro-batches. The planner's
  // cost per micro-batch (see dapple.cc), for the plans that matter:
  //  - 2 stages x 2 replicas, each stage in its own machine (fresh-first, or append-first once a
  //    machine is full): compute 4 / 2 = 2 ms; ring all-reduce inside a machine 2 x 1/2 x 1 GB /
  //    100 GB/s = 10 ms / 16 = 0.625 ms; stage 0 also sends 0.5 MB per replica across the 1 GB/s
  //    link and gets the gradient back: 1 ms. Stages 3.625 and 2.625 ms: estimate 6.25 + 15 x 3.625
  //    = 60.6 ms.
  //  - the same with scatter-first (a replica on each machine): the all-reduce crosses 1 GB/s:
  //    1 s / 16 = 62.5 ms per micro-batch.
  //  - one stage on gpu2, gpu3: 8 / 2 + 2 x 1/2 x 2 GB / 100 GB/s / 16 = 5.25 ms, 16 x 5.25 = 84 ms;
  //    on all four devices the all-reduce crosses 1 GB/s (187 ms per micro-batch); on one device 8 ms
  //    (128 ms).
  //  - 2 stages of 1 or 2 and 1 replicas: the 1-replica stage takes 4 ms (estimate >= 67 ms).
  // The analytic evaluation of the finalists keeps the first (about 17 x 2 ms + 10 ms all-reduce).
  Experiment e = two_layers(3e-3, 1e6, two_machines(), 16);
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  INFO(run->exploration);
  REQUIRE(run->partition.stage_count() == 2);
  CHECK(run->partition.stage(0).layers == std::vector<int>{0});
  CHECK(run->partition.stage(0).devices == std::vector<int>{0, 1});
  CHECK(run->partition.stage(1).devices == std::vector<int>{2, 3});
  CHECK(run->schedule_name == "1f1b");
  CHECK(run->micro_batches == 16);
  // The planner's predicted slowest stage, 3.625 ms as derived above.
  CHECK(run->partition.plan.predicted_time_per_stage_s == pipegrid::testing::approx(3.625e-3));
}

TEST_CASE("dapple splits a model that does not fit one device, and replicates one that does") {
  // Two layers of 1 GB of weights: the static memory of both (weights, gradients, Adam state) is
  // twice one layer's; a device holds 1.5 times one layer's. No single device (nor a replica group:
  // replicas hold every weight) can take both layers, so the plan has two stages of one layer.
  const double one = total(static_memory(1e9 / 4, 1e9, MemoryOptions{}));  // one layer's, fp32 Adam
  Experiment e = two_layers(2e-3, 1024, make_switch_cluster(4, "gpu", test_device(1.5 * one), 100e9, 0), 8);
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  REQUIRE(run->partition.stage_count() == 2);
  CHECK(run->partition.stage(0).layers == std::vector<int>{0});
  CHECK(run->partition.stage(1).layers == std::vector<int>{1});
  // With 4 devices and a fast network each stage takes 2 replicas: 8 micro-batches of 1.5 ms per
  // stage instead of 3 ms (the all-reduce of 1 GB over 100 GB/s, 10 ms, amortised over 8, costs
  // 1.25 ms per micro-batch: 2.75 < 3).
  CHECK(run->partition.stage(0).devices.size() == 2);
  CHECK(run->partition.stage(1).devices.size() == 2);

  // With half of one layer's static memory per device no stage fits anywhere: an error, not a plan.
  e.cluster = make_switch_cluster(4, "gpu", test_device(0.5 * one), 100e9, 0);
  Result<PreparedRun> none = prepare(e);
  REQUIRE(!none.ok());
  CHECK(none.error().message.find("dapple: no plan fits") != std::string::npos);
}

TEST_CASE("dapple on many one-device machines plans them as one machine, without overflowing") {
  // 64 devices on a switch, each its own machine: 2^64 usage states overflowed the state count
  // (a division by zero, SIGFPE, from 63 devices on). Above 1,024 states the planner treats all
  // devices as one machine, so the plan must be the one for the same cluster with every device in
  // one machine "m0" (that path never merges).
  Cluster separate = make_switch_cluster(64, "gpu", test_device(), 100e9, 1e-6);
  Cluster one = separate;
  for (Device& d : one.devices) d.node = "m0";
  Result<PreparedRun> a = prepare(two_layers(3e-3, 1e6, separate, 16));
  Result<PreparedRun> b = prepare(two_layers(3e-3, 1e6, one, 16));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(a->partition.stage_count() == b->partition.stage_count());
  for (size_t s = 0; s < a->partition.stage_count(); ++s) {
    CHECK(a->partition.stage(s).layers == b->partition.stage(s).layers);
    CHECK(a->partition.stage(s).devices == b->partition.stage(s).devices);
  }
  CHECK(a->micro_batch_size == b->micro_batch_size);
  CHECK(a->micro_batches == b->micro_batches);
}
