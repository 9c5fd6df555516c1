// Planner plug-ins: a planner decides a whole plan for a workload on a cluster (which layers each
// stage holds and which devices run it, the schedule and its micro-batch order, the micro-batch size
// and count) and says what it explored. One interface, one table (registry.cc, `pipegrid list`).
// The core pipeline (core/experiment.h) asks the planner for a plan, then validates and lowers it.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/cluster.h"
#include "core/collectives.h"
#include "core/context_parallel.h"
#include "core/memory.h"
#include "core/moe.h"
#include "core/partition.h"
#include "core/result.h"
#include "core/schedule.h"
#include "core/strategy.h"
#include "core/task_graph.h"
#include "core/tensor_parallel.h"
#include "core/workload.h"

namespace pipegrid {

// The strategy as the user wrote it (experiment file `strategy:`). Planners read what they need.
struct StrategySpec {
  // The planner; empty: the planner named like `partitioner` if there is one (the older spelling
  // `partitioner: bapipe`), else kDefaultPlanner (runs `partitioner` with `schedule`).
  std::string planner;
  std::string partitioner = "uniform";
  std::string schedule = "1f1b";
  bool schedule_given = false;  // set by the file; planners that explore schedules try only this one then
  int micro_batches = 1;
  int stages = 0;  // pipeline ranks; 0: one per device, at most one per layer (per chunk)
  int chunks = 1;  // model chunks per rank (interleaved-1f1b): ranks x chunks stages
  // Data-parallel replicas per stage (uniform, balanced): stage i on devices i r .. i r + r - 1;
  // the default stage count becomes devices / r.
  int replicas = 1;
  // Gradients of replicated stages: as NCCL picks per call, its tree or its ring per NIC (channel)
  // (AllReduceAlgorithm::Nccl; the experiment loader's default on clusters of GPUs).
  AllReduceAlgorithm allreduce = AllReduceAlgorithm::Nccl;
  // Tensor parallelism (core/tensor_parallel.h): each replica of every stage is a group of
  // `tensor_parallel` consecutive devices. Ranks in Megatron's order: t fastest, then the replicas
  // (d), then the pipeline stages (p): stage q, replica j, rank i on device (q d + j) t + i.
  int tensor_parallel = 1;
  bool sequence_parallel = false;
  bool tp_overlap = false;       // TP collectives overlap the compute piece after them
  bool tp_wgrad_overlap = true;  // TensorParallelOptions::wgrad_overlap
  // Expert parallelism of the stages holding MoE blocks (core/moe.h, Megatron-Core's MoE parallel
  // folding): expert-parallel size, expert tensor-parallel size (0: the tensor-parallel size, Megatron's
  // default for --expert-tensor-parallel-size), the dispatcher, capacity factor and routing.
  int expert_parallel = 1;
  int expert_tensor_parallel = 0;
  MoeOptions moe;
  // Megatron-Core's --overlap-moe-expert-parallel-comm: each forward followed by a backward of another
  // micro-batch runs with it as one overlapped pair (Schedule::paired).
  bool moe_overlap = false;
  // Context parallelism (core/context_parallel.h): each replica's sequence split over
  // `context_parallel` groups of t devices (rank order tp-cp-dp: stage q, replica j, context rank c,
  // tensor rank i on device ((q d + j) cp + c) t + i), with the attention's exchange algorithm.
  int context_parallel = 1;
  ContextParallelOptions context;
  // Data-parallel gradients: reduced in buckets during the first stage's last backward (Megatron-LM's
  // --overlap-grad-reduce; LoweringOptions::dp_overlap), and in this many bytes per parameter (0: the
  // workload's element size).
  bool dp_overlap = false;
  double gradient_reduce_bytes = 0;
  // Samples per iteration to explore (the file's `global_batch` given alone; `mini_batch` is its older
  // name). When set, every micro-batch size that divides it is tried (m = mini_batch / size) and the
  // plan the analytic evaluator finds fastest (among those that fit memory, if any does) is kept;
  // `micro_batches` and the workload's micro-batch size are then ignored. 0: the one micro-batching
  // given (micro_batches of Experiment::micro_batch_size samples).
  int mini_batch = 0;
  // Planners that can (luo): also plan with every other registered planner and keep the best plan
  // (off by default: a call then costs what every planner costs).
  bool planner_baselines = false;
  PartitionerOptions partitioner_options;  // straight, hierarchy, activation_compression_ratio, ...
  std::string schedule_text;               // `file` schedule: the CSV text
  std::string schedule_source;             // `file` schedule: its path, for messages
};

// The options a plan's tensor-, expert- and context-parallel stages are costed with: the strategy's,
// and what the stash keeps (the memory options' recompute modules and activation_fp8_input_store).
inline TensorParallelOptions tensor_parallel_options(const StrategySpec& s, const MemoryOptions& m) {
  TensorParallelOptions o{s.sequence_parallel, s.tp_overlap, s.moe, s.context, m.modules, s.tp_wgrad_overlap};
  o.activation_fp8_input_store = m.activation_fp8_input_store;
  return o;
}

// Judges candidate plans during an exploration more precisely than the analytic evaluator, e.g. by
// replaying them in SimGrid (tools/process/isolated_replay.h). Returns the iteration time in seconds.
class PlanJudge {
 public:
  virtual ~PlanJudge() = default;
  virtual Result<double> iteration_time(const Cluster& c, const TaskGraph& g) const = 0;
  virtual std::string_view name() const = 0;
};

// One way to cut a mini-batch: `count` micro-batches of `size` samples.
struct MicroBatching {
  double size = 1;
  int count = 1;
};
// "8 micro-batches of 2", "1 micro-batch of 64": the planners' labels.
std::string micro_batching_text(MicroBatching mb);

struct PlanRequest {
  const Workload& workload;
  const Cluster& cluster;        // any interconnect: devices, switches, links, routes
  const StrategySpec& strategy;  // the user's choices (names, stages, replicas, options)
  const MemoryOptions& memory;   // static memory model, recomputation: the capacity constraint
  // The micro-batchings allowed: every size dividing strategy.mini_batch, or the single one given.
  // Never empty. A planner picks one (or, if it explores sizes, from these).
  std::vector<MicroBatching> micro_batchings;
  const PlanJudge* judge = nullptr;  // times finalists of an exploration; null: analytic only
};

// A whole plan: what runs where and in which order. No times; the simulator supplies them.
// One plan a planner tried, for reports (`plan.tried` in the JSON): what it was and how it compared.
struct TriedPlan {
  std::string what;  // e.g. "gpipe, 16 micro-batches of 2, 4 stages x 2 replicas"
  double micro_batch_size = 0;
  int micro_batches = 0;
  int stages = 0;          // 0: no plan was made
  double analytic_s = -1;  // the analytic evaluator's iteration time; < 0: not evaluated
  double judged_s = -1;    // the judge's (SimGrid from the CLI); < 0: not judged
  bool fits = true;        // every device within its memory
  std::string outcome;     // "chosen", "" (a candidate), or why it was left out
};

struct Plan {
  Partition partition;        // stages (layers, devices: placement and replicas) and stage edges
  Schedule schedule;          // per device, the ordered actions: the micro-batch order
  std::string schedule_name;  // a schedule table name, or the planner's own name for its order
  // The partitioner table name that made the stages; empty: the planner made them itself (prepare
  // then records the planner's name), e.g. luo and dapple.
  std::string partitioner;
  double micro_batch_size = 1;
  int micro_batches = 1;
  std::string exploration;       // what was explored and how the candidates compared; "" if nothing
  double planning_seconds = 0;   // wall time spent partitioning (summed over the candidates)
  std::vector<TriedPlan> tried;  // what was tried, structured (planners that explore fill it)
};

struct PlannerInfo {
  std::string_view name;
  std::string_view description;  // one line, for `pipegrid list`
  Result<Plan> (*plan)(const PlanRequest&);
  // What it takes from the strategy (the parser checks keys against it):
  // plans with the strategy's partitioner, which decides the replicas (PartitionStrategy::replicas)
  // and takes tensor_parallel; the other planners choose each stage's devices themselves.
  bool runs_partitioner = false;
  bool takes_baselines = false;  // `baselines`: also plans with the other planners, keeps the best
  // Plans with the first device's costs for every device (PartitionStrategy's flag of that name).
  bool assumes_identical_devices = false;
};

inline constexpr std::string_view kDefaultPlanner = "partitioner";

std::span<const PlannerInfo> planners();

// Unknown names are errors that list the valid ones.
Result<const PlannerInfo*> find_planner(std::string_view name);

// The planner a strategy asks for (see StrategySpec::planner).
Result<const PlannerInfo*> planner_for(const StrategySpec& s);

// The data-parallel degree d the strategy fixes for every stage on a cluster of `devices`: its
// `replicas` where the planner runs a partitioner that takes them, `devices` where the partitioner
// spans them all (dp); 0 where the planner or the partitioner chooses each stage's replicas, or a
// name is unknown.
int fixed_replicas(const StrategySpec& s, size_t devices);

std::vector<std::string> device_names(const Cluster& c);

// Validates a plan's schedule against its partition, lowers it to a task graph (with the request's
// memory options and all-reduce) and checks the graph for deadlock. Tasks keep the lowering's order.
// Planners use it to evaluate candidates; the core pipeline runs it on the plan returned.
//
// With prove_deadlock_free = false the deadlock check is left to the caller's replay (one pass over
// the graph less: about 5% of `pipegrid run` on a 1F1B chain of p = 128, m = 1,024). The caller must
// then report a replay that does not complete with check_deadlock_free's message
// (sim::ReplayOptions::schedule does).
Result<TaskGraph> lower_plan(const PlanRequest& r, const Plan& p, bool prove_deadlock_free = true);

// Implementations (each in its own file under planners/).
Result<Plan> plan_partitioner(const PlanRequest& r);
Result<Plan> plan_bapipe(const PlanRequest& r);
Result<Plan> plan_luo(const PlanRequest& r);
Result<Plan> plan_dapple(const PlanRequest& r);
Result<Plan> plan_piper(const PlanRequest& r);

}  // namespace pipegrid
