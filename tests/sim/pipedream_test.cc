// A PipeDream plan replayed with 1F1B in SimGrid.
#include <doctest/doctest.h>

#include <filesystem>

#include "core/experiment.h"
#include "core/models/pipedream_profile.h"
#include "core/topologies/generators.h"
#include "sim/replay.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"
#include "tests/support/process.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
namespace fs = std::filesystem;

namespace {
const fs::path kDir = fs::path(PIPEGRID_PROFILES_DIR) / "pipedream";
}

TEST_CASE("pipedream plans replay with 1f1b on a switch cluster") {
  REQUIRE_MESSAGE(fs::exists(kDir), kDir << " is missing: the profiles are part of the repository");
  Experiment e;
  e.workload = *parse_pipedream_profile(testing::read_file((kDir / "vgg16_graph.txt").string()), "vgg16", {});
  DeviceSpec v100 = testing::test_device(16e9);
  v100.kind = "v100";
  e.cluster = make_switch_cluster(4, "gpu", v100, 1e9, 0);
  e.strategy.partitioner = "pipedream";
  e.strategy.schedule = "1f1b";
  e.strategy.micro_batches = 4;
  e.micro_batch_size = 128;  // the profiled batch: the planner sees PipeDream's own numbers
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  // PipeDream's own answer (workloads/profiles/pipedream/SOURCE.md) is 0.205520896 s with 3
  // replicas then 1; 3 replicas would split 128 samples into 42.67 each, so pipegrid's pipedream
  // takes whole samples only (issue 30): replica counts divide 128, and the answer cannot beat
  // PipeDream's unconstrained optimum.
  CHECK(run->partition.plan.predicted_time_per_stage_s >= 0.205520896 * (1 - 1e-6));
  for (size_t s = 0; s < run->partition.stage_count(); ++s)
    CHECK(128 % run->partition.stage(s).devices.size() == 0);
  Result<sim::Replay> r = process::replay_isolated(e.cluster, run->graph);
  REQUIRE(r.ok());
  // The iteration cannot beat the first stage's share of compute for 4 micro-batches.
  double first = 0;
  for (int l : run->partition.stage(0).layers)
    first += e.workload.layer(l).measured->forward_s + e.workload.layer(l).measured->backward_s;
  CHECK(r->timeline.makespan() >= 4 * first / static_cast<double>(run->partition.stage(0).devices.size()));
}
