// An experiment (workload + cluster + strategy) and the core pipeline that prepares it for replay:
// the planner's plan (core/planner.h) -> validation -> lowering -> deadlock check. No SimGrid here.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/lower.h"
#include "core/memory.h"
#include "core/planner.h"
#include "core/result.h"
#include "core/task_graph.h"
#include "core/workload.h"

namespace pipegrid {

struct BackendRequest;  // core/backends.h

struct Experiment {
  std::string name;
  Workload workload;
  Cluster cluster;
  StrategySpec strategy;
  MemoryOptions memory;
  // Samples per micro-batch over all of a stage's replicas (Megatron's micro-batch size x d; the file's
  // strategy.micro_batch_size is per replica); 0: the workload's default.
  double micro_batch_size = 0;
  // Backend placement still to run (place_backends); the CLI's loader runs it up front, so that
  // what reads the workload before planning (the 3D search, stage costs in reports) sees it placed.
  // Shared, never changed: copies of an experiment share it.
  std::shared_ptr<const BackendRequest> backends;
  // The experiment's faults as the reports state them ("gpu3 2x slower", "link gpu0 - ib-switch at
  // 50% bandwidth"); already applied to the cluster (Device::slowdown, Link::bandwidth).
  std::vector<std::string> faults;
};

// Backend placement (core/backends.h): places e.workload's layers on e.backends' catalog for the
// cluster's device kind (one kind per experiment), at the experiment's micro-batch size, replaces
// e.workload by the placed workload and clears the request. Nothing to do without a request.
// Messages begin with the request's `where`.
Status place_backends(Experiment& e);

// A plan ready to replay: the planner's decisions and the task graph they lower to.
struct PreparedRun : Plan {
  TaskGraph graph;  // the whole graph, or with `fold` the folded one (lower_folded)
  std::optional<FoldLayout> fold;
  // Why the graph is whole where a folded lowering was asked for or the plan was large (empty: it was
  // not, or the graph is folded).
  std::string whole_because;
  std::string planner;  // the planner that chose the plan
  // Set when prepare ran the experiment's backend placement (Experiment::backends): the placed
  // workload, which the plan's layer costs come from (the experiment's own is unplaced).
  std::shared_ptr<const Workload> placed_workload;
};

// What planned the run, for reports: the partitioner under the default planner ("uniform"), else
// the planner, with the partitioner that made its stages when that is another ("bapipe (stages by
// uniform)"); never the strategy's partitioner when the planner did not use it.
std::string strategy_label(const Experiment& e, const PreparedRun& run);

// Runs the experiment's backend placement if it carries one (place_backends, on a copy: see
// PreparedRun::placed_workload), asks the strategy's planner (planner_for) for a plan, then
// validates and lowers it. Planners that explore rank candidates with the analytic evaluator and,
// with a judge, judge the finalists again; plans that fit memory win over plans that do not, then
// the fastest. prove_deadlock_free: see lower_plan (false: the caller's replay reports a deadlock,
// with check_deadlock_free's message).
// form: the graph prepare lowers. Whole: lower(); Folded: lower_folded() where the plan folds (its
// group flows copied where their routes allow, core/fold.h fold_routes), else the whole graph with
// whole_because saying why; FoldedIfLarge: the same from kFoldThresholdTasks whole-graph tasks, and
// only where every replica's traffic crosses routes alike replica 0's.
enum class GraphForm { Whole, Folded, FoldedIfLarge };
Result<PreparedRun> prepare(const Experiment& e, const PlanJudge* judge = nullptr,
                            bool prove_deadlock_free = true, GraphForm form = GraphForm::Whole);

// Lowers run's plan again as the whole graph (a folded replay that was not exact); run.fold is reset.
Status lower_whole(const Experiment& e, PreparedRun& run);

}  // namespace pipegrid
