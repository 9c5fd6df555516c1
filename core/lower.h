// Lowering: the one pass that turns (partition, schedule) into a TaskGraph, inserting the
// communication no scheduler has to think about:
//  - activations from every replica of a producing stage to every replica of a consuming stage
//    that shares samples with it (replicas split each micro-batch into equal contiguous slices);
//  - gradients of the same size back, from the consumer's backward to the producer's backward;
//  - an all-reduce of each replicated stage's gradients after its last backward on each replica
//    (core/collectives.h: ring by default);
//  - one optimizer step per device at the end.
// Dependencies between stages on the same device need no transfer.
#pragma once

#include "core/cluster.h"
#include "core/collectives.h"
#include "core/memory.h"
#include "core/partition.h"
#include "core/result.h"
#include "core/schedule.h"
#include "core/task_graph.h"
#include "core/workload.h"

namespace pipegrid {

struct LoweringOptions {
  int micro_batches = 1;
  double micro_batch_size = 1;  // samples per micro-batch
  MemoryOptions memory;
  AllReduceAlgorithm allreduce = AllReduceAlgorithm::Ring;  // gradients of replicated stages
};

// Per stage and replica: what one micro-batch slice costs, under a recomputation mode.
//  - stash: what a forward keeps until its backward (W when split): all layers' stash bytes
//    (none), the stage's input only (full), or the selective stash bytes (selective);
//  - recompute: what the backward re-materialises first (full: every layer's stash; selective:
//    the part not stashed) and the forward time it re-runs; held until the stash is freed;
//  - workspace: the backward's own transient, the activation gradient of the stage's largest
//    layer output, from the start to the end of each B.
struct StageCost {
  PassTimes times;             // for the replica's slice of the micro-batch
  double stash_bytes = 0;      // activations kept from F to B (or W), for the slice
  double recompute_bytes = 0;  // re-materialised at the start of B
  double recompute_s = 0;      // extra forward time paid by B
  double workspace_bytes = 0;  // held during each B
  double parameters = 0;       // count
  double parameter_bytes = 0;
};

// cost[s][j] for replica j of stage s.
Result<std::vector<std::vector<StageCost>>> stage_costs(const Workload& w, const Cluster& c,
                                                        const Partition& p, double micro_batch_size,
                                                        Recompute recompute = Recompute::None);

// The size of the task graph a plan lowers to, counted before anything is allocated: compute tasks
// (`passes` per stage replica and micro-batch: 2, or 3 with a split backward; one optimizer step per
// device), transfers (two per pair of replicas of neighbouring stages on different devices that
// share samples, per micro-batch) and ring all-reduce steps (2 (r - 1) r per stage of r replicas).
struct TaskCount {
  size_t compute = 0, transfers = 0, ring_steps = 0, dependencies = 0;
  size_t total() const { return compute + transfers + ring_steps; }
};
TaskCount count_tasks(const Partition& p, int micro_batches, int passes);

// The most tasks one iteration may have: 2^25 = 33,554,432 (at about 150 bytes per task in the
// task graph and as much again in a replay, some 10 GB; task ids are 32-bit). The largest
// configuration measured (tests/bench/scale_bench.cc) has 16.8 M.
inline constexpr size_t kMaxTasks = size_t{1} << 25;

// An error naming the product and the limit when `n` is above kMaxTasks.
Status check_task_count(const TaskCount& n, const Partition& p, int micro_batches, int passes);

// Precondition: the schedule passed validate_schedule() (see validate.h). Fails (before allocating)
// on a graph of more than kMaxTasks tasks.
Result<TaskGraph> lower(const Workload& w, const Cluster& c, const Partition& p, const Schedule& s,
                        const LoweringOptions& o);

}  // namespace pipegrid
