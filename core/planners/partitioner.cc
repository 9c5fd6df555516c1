// partitioner: the default planner. Runs the strategy's partitioner and schedule as given. With a
// single micro-batching (no mini_batch) that is the plan; otherwise every micro-batch size dividing
// the mini-batch is planned, ranked by the analytic evaluator (plans that fit memory first), the
// best 3 judged again, and the fastest kept.
#include <fmt/format.h>

#include <optional>

#include "core/planners/common.h"

namespace pipegrid {

Result<Plan> plan_partitioner(const PlanRequest& r) {
  auto partitioner = find_partitioner(r.strategy.partitioner);
  if (!partitioner) return partitioner.error();
  auto scheduler = find_schedule(r.strategy.schedule);
  if (!scheduler) return scheduler.error();
  if (r.strategy.mini_batch <= 0)
    return partition_and_schedule(r, **partitioner, **scheduler, r.micro_batchings[0]);
  std::vector<Candidate> scored;
  std::optional<Error> first_error;
  std::string sweep;
  double planning = 0;
  for (MicroBatching mb : r.micro_batchings) {
    Result<Candidate> c = make_candidate(r, **partitioner, **scheduler, mb);
    if (!c) {
      if (!first_error)
        first_error = Error{fmt::format("micro-batch size {}: {}", mb.size, c.error().message)};
      sweep += fmt::format("{}{}: no plan", sweep.empty() ? "" : "; ", mb.size);
      continue;
    }
    planning += c->plan.planning_seconds;
    if (Status s = score(r, *c); !s) return s.error();
    sweep += fmt::format("{}{}: {:.6g} s{}", sweep.empty() ? "" : "; ", mb.size, c->analytic,
                         c->fits ? "" : " (over memory)");
    scored.push_back(std::move(*c));
  }
  if (scored.empty()) return *first_error;
  Result<size_t> best = pick(scored, std::vector<char>(scored.size(), 0), r, 3);
  if (!best) return best.error();
  Plan plan = std::move(scored[*best].plan);
  plan.exploration = fmt::format("micro-batch sizes tried (analytic iteration time): {}{}", sweep,
                                 r.judge ? fmt::format("; the best 3 judged by {}", r.judge->name()) : "");
  plan.planning_seconds = planning;
  return plan;
}

}  // namespace pipegrid
