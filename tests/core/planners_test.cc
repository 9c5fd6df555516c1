// The planner table: its entries, unknown names, the older `partitioner: NAME` spelling, and bapipe
// run through the table against a closed-form optimum.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "core/evaluate.h"
#include "core/experiment.h"
#include "core/metrics.h"
#include "core/planner.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

TEST_CASE("the planner table lists the partitioner wrapper (the default) and bapipe") {
  std::vector<std::string_view> names;
  for (const PlannerInfo& p : planners()) {
    names.push_back(p.name);
    CHECK(!p.description.empty());
    CHECK((p.plan != nullptr));
  }
  CHECK(names.front() == kDefaultPlanner);
  CHECK(std::count(names.begin(), names.end(), "bapipe") == 1);
  CHECK(((*find_planner("bapipe"))->plan == &plan_bapipe));
  CHECK(((*find_planner(kDefaultPlanner))->plan == &plan_partitioner));
}

TEST_CASE("an unknown planner is an error that lists the valid names") {
  Result<const PlannerInfo*> p = find_planner("alpa");
  REQUIRE(!p.ok());
  CHECK(p.error().message == "unknown planner \"alpa\" (valid: partitioner, bapipe, luo, dapple, piper)");
  Experiment e =
      chain_experiment(4, 8, 1e-3, 2e-3, "1f1b", make_switch_cluster(4, "gpu", test_device(), 25e9, 1e-6));
  e.strategy.planner = "alpa";
  Result<PreparedRun> run = prepare(e);
  REQUIRE(!run.ok());
  CHECK(run.error().message == "unknown planner \"alpa\" (valid: partitioner, bapipe, luo, dapple, piper)");
}

TEST_CASE(
    "the planner follows strategy.planner, else a planner named like the partitioner, else the default") {
  StrategySpec s;
  CHECK((*planner_for(s))->name == kDefaultPlanner);
  s.partitioner = "balanced";
  CHECK((*planner_for(s))->name == kDefaultPlanner);
  s.partitioner = "bapipe";
  CHECK((*planner_for(s))->name == "bapipe");
  s.planner = std::string(kDefaultPlanner);  // bapipe's partition step alone, with the given schedule
  CHECK((*planner_for(s))->name == kDefaultPlanner);
}

TEST_CASE("bapipe through the planner table finds the work bound: one stage data-parallel on every device") {
  // 4 equal layers (F 1 ms + B 2 ms per sample, cost linear in samples), 4 devices, free
  // communication and ample memory, mini-batch 4. No plan beats total work / devices =
  // 4 samples x 4 layers x 3 ms / 4 = 12 ms; a pipeline pays a bubble, and one stage over the 4
  // devices (each replica b / 4 samples per micro-batch, gradients all-reduced for free) reaches it.
  Experiment e =
      chain_experiment(4, 1, 1e-3, 2e-3, "1f1b", make_switch_cluster(4, "gpu", test_device(), 1e15, 0), 1024);
  e.strategy.mini_batch = 4;
  e.strategy.planner = "bapipe";  // the partitioner stays "uniform": the planner is chosen by name
  const std::vector<MicroBatching> mbs{{1, 4}, {2, 2}, {4, 1}};
  const PlanRequest request{e.workload, e.cluster, e.strategy, e.memory, mbs, nullptr};
  Result<Plan> plan = (*find_planner("bapipe"))->plan(request);
  REQUIRE(plan.ok());
  REQUIRE(plan->partition.stage_count() == 1);
  CHECK(plan->partition.stage(0).layers.size() == 4);
  CHECK(plan->partition.stage(0).devices == std::vector<int>{0, 1, 2, 3});
  CHECK(plan->micro_batch_size * plan->micro_batches == 4);
  CHECK(plan->exploration.rfind("bapipe explored ", 0) == 0);
  Result<TaskGraph> g = lower_plan(request, *plan);
  REQUIRE(g.ok());
  const Metrics m = compute_metrics(e.cluster, *g, *evaluate(*g, e.cluster));
  CHECK(m.feasible());
  CHECK(m.iteration_time_s == pipegrid::testing::approx(12e-3).epsilon(1e-6));

  // The older spelling (partitioner: bapipe) and the pipeline give the same plan.
  e.strategy.planner.clear();
  e.strategy.partitioner = "bapipe";
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  CHECK(run->planner == "bapipe");
  CHECK(run->partition.stage(0).devices == plan->partition.stage(0).devices);
  CHECK(run->schedule_name == plan->schedule_name);
  CHECK(run->micro_batch_size == plan->micro_batch_size);
  CHECK(run->exploration == plan->exploration);
}

TEST_CASE("the default planner runs the partitioner and schedule given, without exploring") {
  Experiment e =
      chain_experiment(4, 8, 1e-3, 2e-3, "gpipe", make_switch_cluster(4, "gpu", test_device(), 25e9, 1e-6));
  e.strategy.planner = std::string(kDefaultPlanner);
  e.strategy.partitioner = "bapipe";  // its partition step alone: no schedules or sizes explored
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  CHECK(run->planner == kDefaultPlanner);
  CHECK(run->schedule_name == "gpipe");
  CHECK(run->micro_batches == 8);
  CHECK(run->exploration.empty());
  CHECK(run->partition.stage_count() == 4);
}

TEST_CASE("every partitioner and planner plans a chain over 64 one-device machines") {
  // 64 devices on one switch, each its own machine (no `node`): the shape that overflowed dapple's
  // state count (63 machines and up). Each strategy must return a plan (8 layers, 8 micro-batches)
  // whose stages use distinct devices of the cluster.
  auto chain_on_64 = [] {
    return chain_experiment(8, 8, 1e-3, 2e-3, "1f1b",
                            make_switch_cluster(64, "gpu", test_device(), 25e9, 1e-6));
  };
  for (const char* partitioner : {"uniform", "balanced", "dp", "pipedream", "bapipe", "graphpipe"}) {
    Experiment e = chain_on_64();
    e.strategy.partitioner = partitioner;
    Result<PreparedRun> run = prepare(e);
    INFO("partitioner " << partitioner << ": " << (run.ok() ? "" : run.error().message));
    CHECK(run.ok());
  }
  for (const char* planner : {"luo", "dapple", "bapipe", "piper"}) {
    Experiment e = chain_on_64();
    e.strategy.planner = planner;
    Result<PreparedRun> run = prepare(e);
    INFO("planner " << planner << ": " << (run.ok() ? "" : run.error().message));
    REQUIRE(run.ok());
    std::set<int> used;
    for (size_t s = 0; s < run->partition.stage_count(); ++s)
      for (int d : run->partition.stage(s).devices) {
        CHECK(d >= 0);
        CHECK(d < 64);
        CHECK(used.insert(d).second);
      }
  }
}
