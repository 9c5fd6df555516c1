// The registry's capability fields (core/strategy.h, core/planner.h) against what the strategies do:
// the parser checks the strategy's keys against these fields, so they must say what prepare runs.
#include <doctest/doctest.h>

#include "core/experiment.h"
#include "core/models/zoo.h"
#include "core/topologies/generators.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using pipegrid::testing::test_device;

namespace {

// A small GPT (8 blocks) on 8 devices behind one switch: every partitioner can plan it.
Experiment small_gpt(const std::string& partitioner) {
  Experiment e;
  ModelArgs a{{"layers", 8}, {"hidden", 256}, {"heads", 8}, {"sequence", 128}, {"vocabulary", 1024}};
  e.workload = *build_model(**find_model("gpt"), a, Precision::AMP);
  DeviceSpec gpu = test_device();
  gpu.peak_flops[static_cast<int>(Precision::FP16)] = 100e12;
  e.cluster = make_switch_cluster(8, "gpu", gpu, 100e9, 1e-6);
  e.strategy.partitioner = partitioner;
  e.strategy.micro_batches = 4;
  e.micro_batch_size = 8;
  return e;
}

}  // namespace

TEST_CASE("registry: partitioners given `replicas` place that many on every stage, dp one stage on all") {
  for (const PartitionStrategy& p : partition_strategies()) {
    INFO(p.name);
    if (p.replicas == ReplicaChoice::Chosen) continue;
    Experiment e = small_gpt(std::string(p.name));
    if (p.replicas == ReplicaChoice::Given) {
      e.strategy.replicas = 2;
      e.strategy.stages = 2;
    }
    Result<PreparedRun> run = prepare(e);
    REQUIRE_MESSAGE(run.ok(), run.error().message);
    const int d = fixed_replicas(e.strategy, e.cluster.devices.size());
    CHECK(d == (p.replicas == ReplicaChoice::Given ? 2 : 8));
    for (size_t s = 0; s < run->partition.stage_count(); ++s) CHECK(run->partition.stage(s).replicas() == d);
  }
}

TEST_CASE("registry: partitioners that take tensor_parallel place groups of t devices") {
  for (const PartitionStrategy& p : partition_strategies()) {
    if (!p.takes_tensor_parallel) continue;
    INFO(p.name);
    Experiment e = small_gpt(std::string(p.name));
    e.strategy.tensor_parallel = 2;
    e.strategy.stages = 2;
    e.strategy.replicas = 2;
    Result<PreparedRun> run = prepare(e);
    REQUIRE_MESSAGE(run.ok(), run.error().message);
    for (size_t s = 0; s < run->partition.stage_count(); ++s) {
      CHECK(run->partition.stage(s).tensor_parallel == 2);
      CHECK(run->partition.stage(s).devices.size() == 4);
    }
  }
}

TEST_CASE("fixed_replicas: d where the strategy fixes it, 0 where a planner or partitioner chooses") {
  StrategySpec s;
  s.partitioner = "uniform";
  CHECK(fixed_replicas(s, 8) == 1);
  s.replicas = 4;
  CHECK(fixed_replicas(s, 8) == 4);
  s.planner = "dapple";  // chooses each stage's devices; `replicas` is not its
  CHECK(fixed_replicas(s, 8) == 0);
  s.planner.clear();
  s.replicas = 1;
  s.partitioner = "dp";
  CHECK(fixed_replicas(s, 8) == 8);
  s.partitioner = "graphpipe";
  CHECK(fixed_replicas(s, 8) == 0);
  s.partitioner = "bapipe";  // the older spelling of planner: bapipe
  CHECK(fixed_replicas(s, 8) == 0);
  for (const PlannerInfo& p : planners()) {
    s.planner = std::string(p.name);
    s.partitioner = "uniform";
    CHECK((fixed_replicas(s, 8) == 1) == p.runs_partitioner);
  }
}
