// An experiment (workload + cluster + strategy) and the core pipeline that prepares it for replay:
// the planner's plan (core/planner.h) -> validation -> lowering -> deadlock check. No SimGrid here.
#pragma once

#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/memory.h"
#include "core/planner.h"
#include "core/result.h"
#include "core/task_graph.h"
#include "core/workload.h"

namespace pipegrid {

struct Experiment {
  std::string name;
  Workload workload;
  Cluster cluster;
  StrategySpec strategy;
  MemoryOptions memory;
  double micro_batch_size = 0;  // samples per micro-batch; 0: the workload's default
};

// A plan ready to replay: the planner's decisions and the task graph they lower to.
struct PreparedRun : Plan {
  TaskGraph graph;
  std::string planner;  // the planner that chose the plan
};

// What planned the run, for reports: the partitioner under the default planner ("uniform"), else
// the planner, with the partitioner that made its stages when that is another ("bapipe (stages by
// uniform)"); never the strategy's partitioner when the planner did not use it.
std::string strategy_label(const Experiment& e, const PreparedRun& run);

// Asks the strategy's planner (planner_for) for a plan, then validates and lowers it. Planners that
// explore rank candidates with the analytic evaluator and, with a judge, judge the finalists again;
// plans that fit memory win over plans that do not, then the fastest. prove_deadlock_free: see
// lower_plan (false: the caller's replay reports a deadlock, with check_deadlock_free's message).
Result<PreparedRun> prepare(const Experiment& e, const PlanJudge* judge = nullptr,
                            bool prove_deadlock_free = true);

}  // namespace pipegrid
