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

using namespace pipegrid;
namespace fs = std::filesystem;

namespace {
const fs::path kDir = fs::path(PIPEGRID_SHARED_DIR) / "reference/pipedream";
}

TEST_CASE("pipedream plans replay with 1f1b on a switch cluster") {
  if (!fs::exists(kDir)) {
    MESSAGE("skipped: " << kDir << " is missing");
    return;
  }
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
  CHECK(run->partition.plan.predicted_time_per_stage_s ==
        pipegrid::testing::approx(0.205520896).epsilon(1e-6));
  CHECK(run->partition.stage_count() == 2);
  CHECK(run->partition.stage(0).devices.size() == 3);
  Result<sim::Replay> r = sim::replay_isolated(e.cluster, run->graph);
  REQUIRE(r.ok());
  // The iteration cannot beat the replicated first stage's share of compute for 4 micro-batches.
  double first = 0;
  for (int l : run->partition.stage(0).layers)
    first += e.workload.layer(l).measured->forward_s + e.workload.layer(l).measured->backward_s;
  CHECK(r->timeline.makespan() >= 4 * first / 3);
}
