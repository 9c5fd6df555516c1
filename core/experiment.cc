#include "core/experiment.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/evaluate.h"
#include "core/lower.h"
#include "core/metrics.h"
#include "core/strategy.h"
#include "core/validate.h"

namespace pipegrid {

std::vector<std::string> device_names(const Cluster& c) {
  std::vector<std::string> names;
  names.reserve(c.devices.size());
  for (const Device& d : c.devices) names.push_back(d.name);
  return names;
}

namespace {

// One (micro-batch size, micro-batch count): partition, schedule, validate, lower, deadlock check.
Result<PreparedRun> prepare_one(const Experiment& e, const PartitionStrategy& partitioner,
                                const ScheduleStrategy& scheduler, double micro_batch_size, int m) {
  PreparedRun run{};
  run.micro_batch_size = micro_batch_size;
  run.micro_batches = m;
  const int chunks = std::max(1, e.strategy.chunks);
  int stages = e.strategy.stages;
  if (stages == 0)
    stages = static_cast<int>(std::min(e.cluster.devices.size(), e.workload.layer_count() / chunks));
  const auto t0 = std::chrono::steady_clock::now();
  Result<Partition> part =
      partitioner.build({e.workload, e.cluster, stages, run.micro_batch_size, chunks, m, e.memory, e.strategy.schedule});
  run.planning_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!part) return part.error();
  run.partition = std::move(*part);

  ScheduleRequest req{run.partition, e.cluster.devices.size(), m, chunks, e.strategy.schedule_text,
                      e.strategy.schedule_source};
  Result<Schedule> sched = scheduler.build(req);
  if (!sched) return sched.error();
  run.schedule = std::move(*sched);

  const std::vector<std::string> names = device_names(e.cluster);
  if (Status s = validate_schedule(run.schedule, run.partition, m, names); !s) return s.error();
  LoweringOptions lo;
  lo.micro_batches = m;
  lo.micro_batch_size = run.micro_batch_size;
  lo.memory = e.memory;
  Result<TaskGraph> g = lower(e.workload, e.cluster, run.partition, run.schedule, lo);
  if (!g) return g.error();
  run.graph = std::move(*g);
  if (Status s = check_deadlock_free(run.graph, run.schedule, names); !s) return s.error();
  return run;
}

}  // namespace

Result<PreparedRun> prepare(const Experiment& e) {
  if (Status s = validate(e.cluster); !s) return s.error();
  if (Status s = check_acyclic(e.workload); !s) return s.error();
  if (e.strategy.micro_batches < 1)
    return Error{fmt::format("expected at least 1 micro-batch, got {}", e.strategy.micro_batches)};
  auto partitioner = find_partitioner(e.strategy.partitioner);
  if (!partitioner) return partitioner.error();
  auto scheduler = find_schedule(e.strategy.schedule);
  if (!scheduler) return scheduler.error();
  if (e.strategy.mini_batch <= 0) {
    const double b = e.micro_batch_size > 0 ? e.micro_batch_size : e.workload.micro_batch_size;
    return prepare_one(e, **partitioner, **scheduler, b, e.strategy.micro_batches);
  }
  // Every micro-batch size dividing the mini-batch; keep the fastest by the analytic evaluator,
  // preferring plans that fit every device's memory.
  std::optional<PreparedRun> best;
  bool best_fits = false;
  double best_time = 0;
  std::optional<Error> first_error;
  std::string sweep;
  double planning = 0;
  for (int b = 1; b <= e.strategy.mini_batch; ++b) {
    if (e.strategy.mini_batch % b != 0) continue;
    Result<PreparedRun> run = prepare_one(e, **partitioner, **scheduler, b, e.strategy.mini_batch / b);
    if (!run) {
      if (!first_error) first_error = Error{fmt::format("micro-batch size {}: {}", b, run.error().message)};
      sweep += fmt::format("{}{}: {}", sweep.empty() ? "" : "; ", b, "no plan");
      continue;
    }
    planning += run->planning_seconds;
    Result<Timeline> t = evaluate(run->graph, e.cluster);
    if (!t) return t.error();
    const Metrics m = compute_metrics(e.cluster, run->graph, *t);
    sweep += fmt::format("{}{}: {:.6g} s{}", sweep.empty() ? "" : "; ", b, m.iteration_time_s,
                         m.feasible() ? "" : " (over memory)");
    const bool better = !best || (m.feasible() && !best_fits) ||
                        (m.feasible() == best_fits && m.iteration_time_s < best_time);
    if (better) {
      best = std::move(*run);
      best_fits = m.feasible();
      best_time = m.iteration_time_s;
    }
  }
  if (!best) return *first_error;
  best->sweep = "micro-batch sizes tried (analytic iteration time): " + sweep;
  best->planning_seconds = planning;
  return std::move(*best);
}

}  // namespace pipegrid
