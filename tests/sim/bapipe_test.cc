// BaPipe-style exploration, confirmed in SimGrid, against the baselines it contains.
#include <doctest/doctest.h>

#include "core/experiment.h"
#include "core/models/zoo.h"
#include "core/topologies/generators.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

double simulated(const Experiment& e, const PlanJudge& judge) {
  Result<PreparedRun> run = prepare(e, &judge);
  if (!run) FAIL(run.error().message);
  return *judge.iteration_time(e.cluster, run->graph);
}

}  // namespace

TEST_CASE("bapipe beats or ties uniform + 1f1b and uniform + gpipe with the same micro-batch freedom") {
  const process::SimGridJudge judge;
  DeviceSpec v100;
  v100.kind = "v100";
  v100.memory_bytes = 16e9;
  v100.memory_bandwidth = 900e9;
  v100.peak_flops = {15.7e12, 0, 125e12, 125e12, 125e12};  // fp32, tf32 (none), fp16, bf16, int8
  v100.efficiency = 0.5;
  v100.layer_overhead_s = 10e-6;
  for (const char* model : {"vgg16", "resnet50"}) {
    for (int devices : {2, 4}) {
      Experiment e;
      e.workload = *build_model(**find_model(model), {}, Precision::FP16);
      e.cluster = make_switch_cluster(devices, "gpu", v100, 12.5e9, 5e-6);
      e.memory.optimizer = Optimizer::MixedAdam;
      e.strategy.mini_batch = 64;
      e.strategy.partitioner = "bapipe";
      const double bapipe = simulated(e, judge);
      e.strategy.partitioner = "uniform";
      for (const char* s : {"1f1b", "gpipe"}) {
        e.strategy.schedule = s;
        const double baseline = simulated(e, judge);
        INFO(model << " on " << devices << " devices vs uniform + " << s);
        CHECK(bapipe <= baseline * (1 + 1e-9));
      }
    }
  }
}

TEST_CASE("bapipe beats or ties pure data parallelism, which is in its space (16 U280-like boards)") {
  // Found in the FPGA what-if study: on 16 boards with 4x the U280's DSPs, ResNet-50's pipeline
  // estimate ranked twelve pipelines (estimated 26 ms, run 41 ms) above every data-parallel plan
  // (estimated and run at 28 ms), which was then never evaluated. dp, planned on its own, is the
  // oracle: bapipe's plan must be at least as fast.
  const process::SimGridJudge judge;
  Experiment e = resnet50_on_u280_ring(16, 4 * 9024, 128);
  e.strategy.schedule = "1f1b";
  e.strategy.schedule_given = true;
  e.strategy.partitioner = "bapipe";
  const double bapipe = simulated(e, judge);
  e.strategy.partitioner = "dp";
  const double dp = simulated(e, judge);
  CHECK(bapipe <= dp * (1 + 1e-9));
}
