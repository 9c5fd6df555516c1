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
#include "core/stage_costs.h"
#include "core/task_graph.h"
#include "core/tensor_parallel.h"
#include "core/workload.h"

namespace pipegrid {

// Above this many stepped ring flows of data-parallel multi-ring all-reduces (NCCL's ring per NIC)
// in one iteration, they are lowered as merged rings: each device sends one flow of
// 2 (n - 1) / n x S / rings per ring (core/collectives.h append_merged_rings) instead of 2 (n - 1)
// steps of S / (n rings). On a ring of equal links the bandwidth term is the same; the merged ring
// pays one route latency where the stepped one pays 2 (n - 1) in SimGrid's replay (the analytic
// evaluator pipelines latency, so there the two agree; docs/speed.md measures the
// difference on DeepSeek-V3 at 2,048 GPUs).
inline constexpr size_t kAutoMergeRingFlows = size_t{1} << 22;

// Megatron-LM's default gradient bucket under --overlap-grad-reduce (megatron/core/distributed/
// distributed_data_parallel.py at core_r0.8.0): max(40 M, 1 M x d) parameters; the buckets of a
// stage holding `parameters` per device, at least 1.
int dp_buckets(double parameters, int replicas);
// The first stage's buckets under dp_overlap as lower() builds them, for a stage of `dense` and `expert`
// parameters per device on `replicas` gradient replicas (d x cp): the dense buffer's K and the expert
// buffer's K_e (Megatron-Core's expert_parallel_buffers, the same bucket size). 1: one piece after the
// last backward, as DualPipe's mirrored stages and every stage behind a one-bucket dense buffer reduce.
struct DpBuckets {
  int dense = 1, expert = 1;
};
DpBuckets first_stage_buckets(double dense, double expert, int replicas, bool mirrored);

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

// The size of the task graph a plan lowers to, counted before anything is allocated: compute tasks
// (`passes` per stage replica and micro-batch: 2, or 3 with a split backward; one optimizer step per
// device), transfers (two per pair of replicas of neighbouring stages on different devices that
// share samples, per micro-batch) and ring all-reduce steps (2 (r - 1) r per stage of r replicas).
struct TaskCount {
  size_t compute = 0, transfers = 0, ring_steps = 0, dependencies = 0;
  size_t total() const { return compute + transfers + ring_steps; }
};
TaskCount count_tasks(const Partition& p, int micro_batches, int passes);
// The same as a lower bound for the checks made before the lowering knows its rings: where algorithm
// `a` has them lowered merged (NCCL's ring per NIC, its trees: above kAutoMergeRingFlows stepped
// flows), one flow per device of each data-parallel group instead of the stepped ring's 2 (r - 1).
TaskCount count_tasks(const Partition& p, int micro_batches, int passes, AllReduceAlgorithm a);

// The most tasks one iteration may have: 2^31 - 1 = 2,147,483,647, the range of the task ids (32-bit).
inline constexpr size_t kMaxTasks = (size_t{1} << 31) - 1;
// What one task costs from lowering to metrics, measured at the peak of `run` (the task graph with
// its dependencies and memory changes, the replay's arrays, the fold's copy and the unfolded
// timeline): GPT-3 175B on 1,024 A100s 1.00 GB / 11.1 M tasks whole and 1.17 GB folded (105 B), Llama
// 3 405B on 8,192 H100s 2.1 GB / 20.8 M folded (103 B); rounded up (docs/scale.md, "Task limit").
inline constexpr double kBytesPerTask = 128;

// A global_batch sweep keeps every candidate's micro-batches until the best is picked: at most 2^25
// tasks over all its micro-batch sizes (core/planners/partitioner.cc).
inline constexpr size_t kMaxSweepTasks = size_t{1} << 25;

// The memory this machine had available when first asked in this process (Linux: /proc/meminfo's
// MemAvailable; elsewhere the physical memory); infinity when unknown.
double available_memory_bytes();

// An error naming the product and the limit when `n` is above kMaxTasks, or when its estimated
// memory (n.total() x kBytesPerTask) is above `available_bytes`.
Status check_task_count(const TaskCount& n, const Partition& p, int micro_batches, int passes,
                        double available_bytes = available_memory_bytes());

// Precondition: the schedule passed validate_schedule() (see validate.h). Fails (before allocating)
// on a graph of more than kMaxTasks tasks or more than the machine's available memory holds.
Result<TaskGraph> lower(const Workload& w, const Cluster& c, const Partition& p, const Schedule& s,
                        const LoweringOptions& o);

// A dependency of the whole graph from a replayed task (a pipeline transfer, a flow from another
// replica, a group flow replayed) to a task of device `copy`, whose tasks are copies of its image's:
// its representative is `to` (the image's task at the same place).
struct Crossing {
  int32_t from = -1, to = -1, copy = -1;
};

// The replica fold lowered directly (docs/scale.md, "The folded lowering"): the graph fold_replicas
// (core/fold.h) makes from the whole graph, without building the whole graph. Replica 0's compute
// tasks and group flows; every replica's pipeline transfers, gradient collectives and flows between
// replicas, each started when its representative's producer in replica 0 ends; every device's
// optimizer step, replica j's after its image's last task; with groups_folded false, every replica's
// group flows too. The dependencies into replica j's copied tasks are kept aside as crossings, for
// check_folded (core/fold.h).
// With ranks folded (FoldOptions::ranks, docs/scale.md "The rank fold") each tensor-parallel group is
// replayed as its rank 0 too: a device's image is then rank 0 of replica 0's group at its place, a
// group's ring collectives are lowered as the two flows into and out of rank 0 (the others, on links
// of their own alike theirs, end with them), and every rank's pipeline transfers and gradient
// collectives stay in the replay.
struct FoldLayout {
  int replicas = 0;
  std::vector<int> replica, image;  // per device: its data-parallel replica and the device whose tasks
                                    // it copies (itself: not copied; -1: in no stage)
  int ranks_folded = 1;             // the tensor-parallel size folded onto rank 0 (1: ranks not folded)
  std::vector<Crossing> crossings;
  size_t whole_tasks = 0;      // the tasks lower() builds (counted before lowering when graph is empty)
  bool groups_folded = false;  // replica j's group flows copied from replica 0's
  // With groups_folded, only its tensor-parallel flows: its context- and expert-parallel flows (on
  // links they share with other traffic) are lowered for every replica, like its pipeline transfers.
  bool tensor_only = false;
  size_t copied_flows = 0;  // of which group flows copied
  // Copied though their channels carry other traffic too: the replay must show that traffic at other
  // times (check_time_shared, core/fold.h).
  bool time_shared = false;
  bool copied(size_t d) const { return image[d] >= 0 && image[d] != static_cast<int>(d); }
  // Whether replica j's group flows of this kind are copies of replica 0's (not lowered).
  bool folds(TransferKind k) const {
    return groups_folded && is_group_flow(k) && (!tensor_only || k == TransferKind::TensorParallel);
  }
};
struct FoldedGraph {
  TaskGraph graph;  // empty when the whole graph has fewer than lower_folded's min_whole_tasks
  FoldLayout layout;
};

// An error where the plan does not fold: one replica, replicas of different sizes, a device at two
// places, replicas whose schedules or stage costs differ (routing skew, slower devices), round-robin
// replicas. Stops after counting (an empty graph) when the whole graph has fewer than
// `min_whole_tasks` tasks. groups: replica j's group flows copied from replica 0's (fold_routes says
// where they may be); ranks: tensor-parallel ranks folded too where the plan allows it (every stage of
// the same t >= 2 without context or expert parallelism, each group's ring inside one machine, no
// collective engine; FoldLayout::ranks_folded says whether they were), which fold_routes checks.
struct FoldOptions {
  bool groups = true, ranks = false;
  bool tensor_only = false;  // with groups: only the tensor-parallel flows (FoldLayout::tensor_only)
};
Result<FoldedGraph> lower_folded(const Workload& w, const Cluster& c, const Partition& p, const Schedule& s,
                                 const LoweringOptions& o, FoldOptions fold, size_t min_whole_tasks = 0);

}  // namespace pipegrid
