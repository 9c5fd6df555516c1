#include "core/experiment.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/lower.h"
#include "core/strategy.h"
#include "core/validate.h"

namespace pipegrid {

std::vector<std::string> device_names(const Cluster& c) {
  std::vector<std::string> names;
  names.reserve(c.devices.size());
  for (const Device& d : c.devices) names.push_back(d.name);
  return names;
}

Result<PreparedRun> prepare(const Experiment& e) {
  if (Status s = validate(e.cluster); !s) return s.error();
  if (Status s = check_acyclic(e.workload); !s) return s.error();
  if (e.strategy.micro_batches < 1)
    return Error{fmt::format("expected at least 1 micro-batch, got {}", e.strategy.micro_batches)};
  auto partitioner = find_partitioner(e.strategy.partitioner);
  if (!partitioner) return partitioner.error();
  auto scheduler = find_schedule(e.strategy.schedule);
  if (!scheduler) return scheduler.error();

  PreparedRun run{};
  run.micro_batch_size = e.micro_batch_size > 0 ? e.micro_batch_size : e.workload.micro_batch_size;
  const int chunks = std::max(1, e.strategy.chunks);
  int stages = e.strategy.stages;
  if (stages == 0)
    stages = static_cast<int>(std::min(e.cluster.devices.size(), e.workload.layer_count() / chunks));
  Result<Partition> part = (*partitioner)->build({e.workload, e.cluster, stages, run.micro_batch_size, chunks});
  if (!part) return part.error();
  run.partition = std::move(*part);

  ScheduleRequest req{run.partition,          e.cluster.devices.size(), e.strategy.micro_batches,
                      chunks,                 e.strategy.schedule_text, e.strategy.schedule_source};
  Result<Schedule> sched = (*scheduler)->build(req);
  if (!sched) return sched.error();
  run.schedule = std::move(*sched);

  const std::vector<std::string> names = device_names(e.cluster);
  if (Status s = validate_schedule(run.schedule, run.partition, e.strategy.micro_batches, names); !s) return s.error();
  LoweringOptions lo;
  lo.micro_batches = e.strategy.micro_batches;
  lo.micro_batch_size = run.micro_batch_size;
  lo.memory = e.memory;
  Result<TaskGraph> g = lower(e.workload, e.cluster, run.partition, run.schedule, lo);
  if (!g) return g.error();
  run.graph = std::move(*g);
  if (Status s = check_deadlock_free(run.graph, run.schedule, names); !s) return s.error();
  return run;
}

}  // namespace pipegrid
