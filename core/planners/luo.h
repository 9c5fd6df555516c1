// luo: the Luo-style planner (INFOCOM'22, our interpretation; see luo.cc and README "Planners") and its
// scheduler, exposed for tests and other planners.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "core/planners/common.h"

namespace pipegrid {

// How the list scheduler picks among the tasks ready on an idle device.
struct ListPolicy {
  // Ready backwards before ready forwards (early backward: frees stashed activations sooner);
  // false: forwards first (GPipe-like when the cap allows).
  bool backward_first = true;
  // Per stage: the most forwards a replica may run ahead of its backwards (at least 1).
  std::vector<int> in_flight_cap;
};

// List scheduling of the plan's forward and backward tasks: the stage-level task DAG (activations
// forward and gradients backward between replicas that share samples, as the lowering inserts them)
// is run with the plan's compute times (core/lower.h stage_costs) and the routes' transfer times
// (links as FIFO channels, as the analytic evaluator does); whenever a device is idle it starts the
// ready task of highest priority: the policy's pass first, then the lowest micro-batch, then the
// stage with the longest path to a sink. Records each device's order. Fails on a deadlock (only with
// caps that starve a DAG of stages; never on a chain with caps >= 1).
Result<Schedule> list_schedule(const PlanRequest& r, const Partition& p, double micro_batch_size,
                               int micro_batches, const ListPolicy& policy);

// Per stage: 1 + the longest path from the stage to a sink, in stages (1F1B's forwards before the
// first backward: p - i on a chain), and the most micro-batches whose activations fit its devices'
// memory beside their static state (at least 1).
std::vector<int> one_f_one_b_depths(const Partition& p);
Result<std::vector<int>> memory_caps(const PlanRequest& r, const Partition& p, double micro_batch_size);

// luo's scheduler: the order of forward and backward micro-batch tasks on every device that minimises
// the analytic iteration time of `plan` among list schedules (backward first with in-flight caps
// 1F1B's depth, depth + 1, 2 x depth and m, each within memory; forward first with caps depth and m)
// and the 1F1B and GPipe orders (when the plan has one stage per device). Each is lowered and run by
// the analytic evaluator; the fastest that fits memory wins (the fastest at all if none fits), so
// the result is never slower than 1F1B on the same plan. schedule_name is "luo"; `chosen` (if given)
// says which order won.
Result<Candidate> schedule_luo(const PlanRequest& r, Plan plan, std::string* chosen = nullptr);

}  // namespace pipegrid
