#include "core/experiment.h"

#include <fmt/format.h>

#include "core/lower.h"
#include "core/validate.h"

namespace pipegrid {

std::vector<std::string> device_names(const Cluster& c) {
  std::vector<std::string> names;
  names.reserve(c.devices.size());
  for (const Device& d : c.devices) names.push_back(d.name);
  return names;
}

Result<TaskGraph> lower_plan(const PlanRequest& r, const Plan& p, bool prove_deadlock_free) {
  const std::vector<std::string> names = device_names(r.cluster);
  if (Status s = validate_schedule(p.schedule, p.partition, p.micro_batches, names); !s) return s.error();
  LoweringOptions lo;
  lo.micro_batches = p.micro_batches;
  lo.micro_batch_size = p.micro_batch_size;
  lo.memory = r.memory;
  lo.allreduce = r.strategy.allreduce;
  lo.tensor_parallel = {r.strategy.sequence_parallel, r.strategy.tp_overlap, r.strategy.moe};
  lo.dp_overlap = r.strategy.dp_overlap;
  lo.gradient_reduce_bytes = r.strategy.gradient_reduce_bytes;
  Result<TaskGraph> g = lower(r.workload, r.cluster, p.partition, p.schedule, lo);
  if (!g) return g.error();
  // Tasks are not renumbered in execution order any more: with jemalloc as the allocator that cost
  // more than it saved, even at 1,024 devices (docs/speed.md, "Tasks kept in the lowering's order").
  if (!prove_deadlock_free) return g;
  // Deadlock freedom, proved once by a topological pass (core/validate.h); only a graph that fails it
  // is run again symbolically, for the exact message.
  std::vector<int32_t> order = execution_order(*g);
  if (order.size() != g->tasks.size()) {
    Status s = check_deadlock_free(*g, p.schedule, names);
    return s ? Error{"internal error: the task graph does not run to completion"} : s.error();
  }
  return g;
}

namespace {

// Every micro-batch size dividing the mini-batch, or the one given.
std::vector<MicroBatching> micro_batchings(const Experiment& e) {
  std::vector<MicroBatching> out;
  if (e.strategy.mini_batch > 0) {
    for (int b = 1; b <= e.strategy.mini_batch; ++b)
      if (e.strategy.mini_batch % b == 0) out.push_back({static_cast<double>(b), e.strategy.mini_batch / b});
  } else {
    out.push_back({e.micro_batch_size > 0 ? e.micro_batch_size : e.workload.micro_batch_size,
                   e.strategy.micro_batches});
  }
  return out;
}

}  // namespace

std::string strategy_label(const Experiment& e, const PreparedRun& run) {
  if (run.planner == kDefaultPlanner)
    return run.partitioner.empty() ? e.strategy.partitioner : run.partitioner;
  if (run.partitioner.empty() || run.partitioner == run.planner) return run.planner;
  return fmt::format("{} (stages by {})", run.planner, run.partitioner);
}

Result<PreparedRun> prepare(const Experiment& e, const PlanJudge* judge, bool prove_deadlock_free) {
  if (Status s = validate(e.cluster); !s) return s.error();
  if (Status s = check_acyclic(e.workload); !s) return s.error();
  if (e.strategy.micro_batches < 1)
    return Error{fmt::format("expected at least 1 micro-batch, got {}", e.strategy.micro_batches)};
  Result<const PlannerInfo*> planner = planner_for(e.strategy);
  if (!planner) return planner.error();
  const PlanRequest request{e.workload, e.cluster, e.strategy, e.memory, micro_batchings(e), judge};
  Result<Plan> plan = (*planner)->plan(request);
  if (!plan) return plan.error();
  Result<TaskGraph> graph = lower_plan(request, *plan, prove_deadlock_free);
  if (!graph) return graph.error();
  PreparedRun run;
  static_cast<Plan&>(run) = std::move(*plan);
  run.graph = std::move(*graph);
  run.planner = std::string((*planner)->name);
  if (run.partitioner.empty()) run.partitioner = run.planner;
  return run;
}

}  // namespace pipegrid
