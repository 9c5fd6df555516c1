// partitioner: the default planner. Runs the strategy's partitioner and schedule as given. With a
// single micro-batching (no mini_batch) that is the plan; otherwise every micro-batch size dividing
// the mini-batch is planned, ranked by the analytic evaluator (plans that fit memory first), the
// best 3 judged again, and the fastest kept.
#include <fmt/format.h>

#include <optional>

#include "core/lower.h"
#include "core/planners/common.h"

namespace pipegrid {

namespace {

// "4 micro-batches of 8", "1 micro-batch of 32".
std::string micro_batches_label(int count, double size) {
  return fmt::format("{} micro-batch{} of {}", count, count == 1 ? "" : "es", size);
}

// The sweep over every micro-batch size, bounded before any of it runs.
Status check_sweep_size(const PlanRequest& r, const PartitionStrategy& partitioner,
                        const ScheduleStrategy& scheduler) {
  // Every micro-batch size is planned and its task graph kept until the best is picked: the sum of
  // their sizes, bounded before planning whatever the partitioner: a plan has at most devices x
  // chunks stage replicas (or the stages asked for, if more), each running 2 passes per
  // micro-batch, and at most 2 transfers per micro-batch across each boundary between them.
  {
    const size_t D = r.cluster.devices.size();
    const size_t replicas = static_cast<size_t>(std::max(1, r.strategy.replicas));
    const size_t chunks = static_cast<size_t>(std::max(1, r.strategy.chunks));
    const size_t stage_replicas =
        std::max(D * chunks, static_cast<size_t>(std::max(0, r.strategy.stages)) * chunks * replicas);
    size_t micro_batches = 0;
    for (const MicroBatching& mb : r.micro_batchings) micro_batches += static_cast<size_t>(mb.count);
    const size_t per_micro_batch =
        2 * stage_replicas + 2 * (stage_replicas - std::min<size_t>(1, stage_replicas));
    if (micro_batches * per_micro_batch > kMaxSweepTasks)
      return Error{fmt::format(
          "global_batch {}: its {} micro-batch sizes make {} micro-batches in all, x {} tasks each ({} stage "
          "replicas x 2 passes + transfers) = {} tasks to plan and keep, above pipegrid's limit of {} "
          "(2^25); use a smaller global_batch, or micro_batches",
          r.strategy.mini_batch, r.micro_batchings.size(), micro_batches, per_micro_batch, stage_replicas,
          micro_batches * per_micro_batch, kMaxSweepTasks)};
  }
  // A partitioner that can estimate its search: the sweep's total, bounded before any of it runs
  // (each size alone may be under the limit and the sweep still take many minutes).
  if (partitioner.search_steps != nullptr) {
    double steps = 0;
    for (const MicroBatching& mb : r.micro_batchings)
      steps += partitioner.search_steps({r.workload, r.cluster, r.strategy.stages, mb.size,
                                         std::max(1, r.strategy.chunks), mb.count, r.memory, scheduler.name,
                                         std::max(1, r.strategy.replicas), r.strategy.partitioner_options});
    if (steps > kMaxPartitionSearchSteps)
      return Error{fmt::format(
          "global_batch {}: {} over its {} micro-batch sizes would take about {:.3g} search steps in all, "
          "above the limit of {:.3g} (2^30, about a minute); use a smaller global_batch, micro_batches, "
          "or fewer layers or devices",
          r.strategy.mini_batch, partitioner.name, r.micro_batchings.size(), steps,
          kMaxPartitionSearchSteps)};
  }
  return {};
}

}  // namespace

Result<Plan> plan_partitioner(const PlanRequest& r) {
  auto partitioner = find_partitioner(r.strategy.partitioner);
  if (!partitioner) return partitioner.error();
  auto scheduler = find_schedule(r.strategy.schedule);
  if (!scheduler) return scheduler.error();
  if (r.strategy.mini_batch <= 0)
    return partition_and_schedule(r, **partitioner, **scheduler, r.micro_batchings[0]);
  if (Status s = check_sweep_size(r, **partitioner, **scheduler); !s) return s.error();
  std::vector<Candidate> scored;
  std::vector<TriedPlan> left_out;  // sizes without a plan, or whose plan splits samples
  std::optional<Error> first_error;
  std::string sweep;
  double planning = 0;
  for (MicroBatching mb : r.micro_batchings) {
    Result<Candidate> c = make_candidate(r, **partitioner, **scheduler, mb);
    if (!c) {
      if (!first_error)
        first_error = Error{fmt::format("micro-batch size {}: {}", mb.size, c.error().message)};
      sweep += fmt::format("{}{}: no plan", sweep.empty() ? "" : "; ", mb.size);
      left_out.push_back({micro_batches_label(mb.count, mb.size), mb.size, mb.count, 0, -1, -1, true,
                          "no plan: " + c.error().message});
      continue;
    }
    planning += c->plan.planning_seconds;
    // Only sizes that give every replica whole samples (a stage of 3 replicas takes no 4-sample
    // micro-batch: 1.33 samples each, costed linearly, looks faster than a data loader can run it).
    if (const std::optional<int> r_split = fractional_split(c->plan)) {
      if (!first_error)
        first_error = Error{
            fmt::format("micro-batch size {}: a stage of {} replicas would split it into {} samples each",
                        mb.size, *r_split, mb.size / *r_split)};
      sweep += fmt::format("{}{}: splits samples between {} replicas", sweep.empty() ? "" : "; ", mb.size,
                           *r_split);
      left_out.push_back(
          {micro_batches_label(mb.count, mb.size), mb.size, mb.count,
           static_cast<int>(c->plan.partition.stage_count()), -1, -1, true,
           fmt::format("left out: {} replicas would take {} samples each", *r_split, mb.size / *r_split)});
      continue;
    }
    if (Status s = score(r, *c); !s) return s.error();
    sweep += fmt::format("{}{}: {:.6g} s{}", sweep.empty() ? "" : "; ", mb.size, c->analytic,
                         c->fits ? "" : " (over memory)");
    scored.push_back(std::move(*c));
  }
  if (scored.empty()) return *first_error;
  Result<size_t> best = pick(scored, std::vector<char>(scored.size(), 0), r, 3);
  if (!best) return best.error();
  std::vector<TriedPlan> tried;
  for (size_t i = 0; i < scored.size(); ++i) {
    const int m = scored[i].plan.micro_batches;
    tried.push_back(tried_plan(scored[i], micro_batches_label(m, scored[i].plan.micro_batch_size)));
    if (i == *best) tried.back().outcome = "chosen";
  }
  tried.insert(tried.end(), left_out.begin(), left_out.end());
  Plan plan = std::move(scored[*best].plan);
  plan.tried = std::move(tried);
  plan.exploration = fmt::format("micro-batch sizes tried (analytic iteration time): {}{}", sweep,
                                 r.judge ? fmt::format("; the best 3 judged by {}", r.judge->name()) : "");
  plan.planning_seconds = planning;
  return plan;
}

}  // namespace pipegrid
