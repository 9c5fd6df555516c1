// A queue of jobs arriving over time on one cluster (docs/jobs.md, "A queue of jobs"): a small layer
// over the shared replays, not a second simulator. Jobs start in arrival order (first come, first
// served, no backfilling) as soon as the placement policy finds them devices; while a set of jobs
// runs, each progresses at the rate its iteration time in a replay of that set together gives; the
// set changes when a job arrives and starts or when one finishes, and each new set is replayed again.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/jobs.h"
#include "core/result.h"

namespace pipegrid {

struct QueuedJob {
  double arrival_s = 0;
  int devices = 0;        // how many it needs
  double iterations = 0;  // its length
};

// A job running with its devices (indices of the queue's jobs and of the cluster's devices).
struct RunningJob {
  int job = -1;
  std::vector<int> devices;
};

// The iteration time of each job of a set running together (the caller replays them), in its order.
using SetIterationTimes = std::function<Result<std::vector<double>>(const std::vector<RunningJob>&)>;

struct QueueOutcome {
  struct Job {
    double start_s = 0, end_s = 0;
    std::vector<int> devices;
  };
  std::vector<Job> jobs;   // in the queue's order
  double makespan_s = 0;   // the last end
  double utilisation = 0;  // device-seconds held by jobs / (devices x makespan)
  int sets = 0;            // running sets replayed (the caller may cache alike ones)
};

// Fails when a job needs more devices than the cluster has, or when the callback fails.
Result<QueueOutcome> run_queue(const Cluster& c, std::span<const QueuedJob> jobs, JobPlacement placement,
                               uint64_t seed, const SetIterationTimes& times);

}  // namespace pipegrid
