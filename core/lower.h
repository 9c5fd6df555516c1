// Lowering: the one pass that turns (partition, schedule) into a TaskGraph, inserting the
// communication no scheduler has to think about:
//  - activations from every replica of a producing stage to every replica of a consuming stage
//    that shares samples with it (replicas split each micro-batch into equal contiguous slices);
//  - gradients of the same size back, from the consumer's backward to the producer's backward;
//  - an all-reduce of each replicated stage's gradients after its last backward on each replica
//    (core/collectives.h: ring by default); with `dp_overlap`, the first stage's in buckets while
//    its last backward runs (dp_buckets);
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
#include "core/tensor_parallel.h"
#include "core/workload.h"

namespace pipegrid {

struct StageCost;

// Megatron-LM's default gradient bucket under --overlap-grad-reduce (megatron/core/distributed/
// distributed_data_parallel.py at core_r0.8.0): max(40 M, 1 M x d) parameters; the buckets of a
// stage holding `parameters` per device, at least 1.
int dp_buckets(double parameters, int replicas);

struct LoweringOptions {
  int micro_batches = 1;
  double micro_batch_size = 1;  // samples per micro-batch
  MemoryOptions memory;
  AllReduceAlgorithm allreduce = AllReduceAlgorithm::Ring;  // gradients of replicated stages
  TensorParallelOptions tensor_parallel;                    // stages with tensor_parallel > 1
  // Megatron-LM's --overlap-grad-reduce: the first stage's gradients in K = dp_buckets() buckets,
  // bucket k ready once (k + 1) / K of its last backward has run (the gradients come out evenly over
  // the pass), the buckets all-reduced in turn; lowered as two all-reduces that end when the K would
  // (lower.cc). Other stages all-reduce in one piece after their last backward, as Megatron does (it
  // buckets pipeline rank 0's first model chunk only). With ZeRO-1 (memory.zero1) the reduction is a
  // reduce-scatter, half an all-reduce's traffic, and the parameter all-gather is taken as hidden
  // behind the next iteration's forward (--overlap-param-gather).
  bool dp_overlap = false;
  // Bytes per parameter the data-parallel gradients are reduced in; 0: the workload's element size
  // (Megatron-LM reduces in fp32, 4, under bf16: --accumulate-allreduce-grads-in-fp32).
  double gradient_reduce_bytes = 0;
  // Costs per stage and device given by the caller instead of stage_costs() of the workload (the 3D
  // search's one-replica estimate, core/planners/search3d.h); null: computed.
  const std::vector<std::vector<StageCost>>* costs = nullptr;
};

// A pass of a tensor-parallel stage on one device: compute pieces separated by the group's
// collectives (core/tensor_parallel.h), merged across the stage's layers.
struct TpProgram {
  std::vector<double> compute;        // seconds; kinds.size() + 1 pieces
  std::vector<CollectiveKind> kinds;  // the collectives between them
  std::vector<double> bytes;          // each collective's whole tensor, for the replica's slice
  size_t collectives() const { return kinds.size(); }
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
  // Tensor parallelism (the stage's tensor_parallel > 1): F, B and B's input-gradient part (split
  // backward) as programs; B's include the forward (with its collectives) under full recomputation
  // and the attention core's forward under selective recomputation. Empty otherwise.
  TpProgram tp_forward, tp_backward, tp_backward_input;
};

// cost[s][j] for device j of stage s (replica j without tensor parallelism). Under tensor
// parallelism, memory follows Korthikanti et al. (arXiv 2205.05198, Table 2): per transformer layer
// and sample, s h (10 + 24/t + 5 a s / (h t)) x 2-byte units without recomputation, s h (34 + 5 a s /
// h) / t with sequence parallelism, the attention core's 5 a s^2 dropped under selective
// recomputation, and 2 s h (the layer's input) under full recomputation, which re-materialises one
// layer at a time (recompute_bytes: the largest layer's activations).
Result<std::vector<std::vector<StageCost>>> stage_costs(const Workload& w, const Cluster& c,
                                                        const Partition& p, double micro_batch_size,
                                                        Recompute recompute = Recompute::None,
                                                        const TensorParallelOptions& tp = {});

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
