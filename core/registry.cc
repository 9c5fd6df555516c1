#include <fmt/format.h>

#include <algorithm>

#include "core/planner.h"
#include "core/strategy.h"

namespace pipegrid {
namespace {

constexpr PartitionStrategy kPartitioners[] = {
    {.name = "uniform",
     .description = "equal layer counts per stage (in topological order), stage i on device i",
     .build = &partition_uniform,
     .replicas = ReplicaChoice::Given,
     .takes_tensor_parallel = true,
     .stages_in_rank_order = true},
    {.name = "balanced",
     .description = "contiguous stages minimising the slowest stage's compute time, stage i on device i",
     .build = &partition_balanced,
     .replicas = ReplicaChoice::Given,
     .takes_tensor_parallel = true,
     .stages_in_rank_order = true},
    {.name = "megatron",
     .description = "Megatron-LM's split: equal runs of transformer blocks, embeddings first, head last",
     .build = &partition_megatron,
     .replicas = ReplicaChoice::Given,
     .takes_tensor_parallel = true,
     .stages_in_rank_order = true},
    {.name = "graphpipe",
     .description =
         "GraphPipe-style: a DAG of stages from the series-parallel decomposition, min bottleneck TPS",
     .build = &partition_graphpipe,
     .search_steps = &graphpipe_search_steps,
     .replicas = ReplicaChoice::Chosen,
     .assumes_identical_devices = true,
     .blind_to_slow_devices = true},
    {.name = "bapipe",
     .description =
         "BaPipe's partition step: contiguous stages, replicas per stage, min slowest stage under memory",
     .build = &partition_bapipe,
     .replicas = ReplicaChoice::Chosen},
    {.name = "pipedream",
     .description = "PipeDream's planner (SOSP'19): antichain DP with replication, hierarchy, straight mode",
     .build = &partition_pipedream,
     .replicas = ReplicaChoice::Chosen,
     .takes_pipedream_options = true,
     .assumes_identical_devices = true,
     .blind_to_slow_devices = true},
    {.name = "dp",
     .description =
         "pure data parallelism: one stage with every layer on every device, gradients all-reduced",
     .build = &partition_dp,
     .replicas = ReplicaChoice::AllDevices},
};

constexpr ScheduleStrategy kSchedules[] = {
    {.name = "gpipe",
     .description = "GPipe: all forwards of the mini-batch, then all backwards, then the optimizer step",
     .build = &schedule_gpipe},
    {.name = "1f1b",
     .description =
         "synchronous 1F1B (PipeDream-Flush): warm-up forwards, one forward/one backward, drain, one step",
     .build = &schedule_1f1b},
    {.name = "interleaved-1f1b",
     .description =
         "Megatron's interleaved 1F1B: `chunks` model chunks per device, stage s on device s mod p",
     .build = &schedule_interleaved_1f1b,
     .takes_chunks = true,
     .needs_chunks = true,
     .places_stages = true},
    {.name = "zb-h1",
     .description =
         "zero bubble H1: B/W split, W deferred to fill the drain, 1F1B's memory (p micro-batches)",
     .build = &schedule_zb_h1},
    {.name = "zb-h2",
     .description = "zero bubble H2: B/W split, 2p-1 micro-batches in flight, no bubble in steady state",
     .build = &schedule_zb_h2},
    {.name = "dualpipe",
     .description =
         "DeepSeek-V3's DualPipe: two pipelines in opposite directions, 2 parameter copies, zero-bubble ends",
     .build = &schedule_dualpipe,
     .places_stages = true},
    {.name = "dualpipev",
     .description = "DualPipeV (cut-in-half DualPipe): 2 chunks per rank in a V, one parameter copy",
     .build = &schedule_dualpipev,
     .takes_chunks = true,
     .needs_chunks = true,
     .places_stages = true},
    {.name = "file",
     .description = "a schedule read from a torch.distributed.pipelining-style CSV (`schedule_file`)",
     .build = &schedule_file,
     .takes_chunks = true,
     .reads_file = true},
    {.name = "graph-1f1b",
     .description =
         "1F1B on a DAG of stages: 1 + (longest path to a sink) forwards before the first backward",
     .build = &schedule_graph_1f1b},
};

// The first entry is the default (kDefaultPlanner). A planner named like a partitioner is also
// chosen by `partitioner: NAME` (the older spelling, see planner_for).
constexpr PlannerInfo kPlanners[] = {
    {.name = kDefaultPlanner,
     .description =
         "the strategy's partitioner and schedule; with global_batch alone, every micro-batch size "
         "dividing it",
     .plan = &plan_partitioner,
     .runs_partitioner = true},
    {.name = "bapipe",
     .description =
         "BaPipe-style: explores schedules x micro-batch sizes x stages x replicas, fastest plan that fits",
     .plan = &plan_bapipe},
    {.name = "luo",
     .description = "Luo-style (INFOCOM'22, our interpretation): stages x device groups on the real "
                    "interconnect, own scheduler",
     .plan = &plan_luo,
     .takes_baselines = true},
    {.name = "dapple",
     .description = "DAPPLE-style: DP over stages x replica counts, fresh/append/scatter-first placement on "
                    "machines, 1F1B",
     .plan = &plan_dapple},
    {.name = "piper",
     .description =
         "Piper-style (NeurIPS'21, our interpretation): DP over contiguous stages, each with its own "
         "t and d, 1F1B",
     .plan = &plan_piper,
     .assumes_identical_devices = true},
};

template <class T>
Result<const T*> find_in(std::span<const T> table, std::string_view name, std::string_view what) {
  std::string names;
  for (const T& t : table) {
    if (t.name == name) return &t;
    names += fmt::format("{}{}", names.empty() ? "" : ", ", t.name);
  }
  return Error{fmt::format("unknown {} \"{}\" (valid: {})", what, name, names)};
}

}  // namespace

std::span<const PartitionStrategy> partition_strategies() {
  return kPartitioners;
}
std::span<const ScheduleStrategy> schedule_strategies() {
  return kSchedules;
}

Result<const PartitionStrategy*> find_partitioner(std::string_view name) {
  return find_in(partition_strategies(), name, "partitioner");
}

Result<const ScheduleStrategy*> find_schedule(std::string_view name) {
  return find_in(schedule_strategies(), name, "schedule");
}

std::span<const PlannerInfo> planners() {
  return kPlanners;
}

Result<const PlannerInfo*> find_planner(std::string_view name) {
  return find_in(planners(), name, "planner");
}

Result<const PlannerInfo*> planner_for(const StrategySpec& s) {
  if (!s.planner.empty()) return find_planner(s.planner);
  for (const PlannerInfo& p : planners())
    if (p.name == s.partitioner) return &p;
  return find_planner(kDefaultPlanner);
}

int fixed_replicas(const StrategySpec& s, size_t devices) {
  Result<const PlannerInfo*> planner = planner_for(s);
  if (!planner || !(*planner)->runs_partitioner) return 0;
  Result<const PartitionStrategy*> partitioner = find_partitioner(s.partitioner);
  if (!partitioner) return 0;
  switch ((*partitioner)->replicas) {
    case ReplicaChoice::Given:
      return std::max(1, s.replicas);
    case ReplicaChoice::AllDevices:
      return static_cast<int>(devices);
    case ReplicaChoice::Chosen:
      return 0;
  }
  return 0;
}

Result<int> interleaved_ranks(const Partition& p, int chunks, std::string_view name) {
  const int S = static_cast<int>(p.stage_count());
  if (chunks < 1) return Error{fmt::format("{} needs at least 1 chunk, got {}", name, chunks)};
  if (S % chunks != 0)
    return Error{fmt::format("{} with {} chunks needs a multiple of {} stages, the partition has {}", name,
                             chunks, chunks, S)};
  const int ranks = S / chunks;
  for (int s = ranks; s < S; ++s)
    if (p.stage(s).devices != p.stage(s % ranks).devices)
      return Error{fmt::format("{}: stage {} must run on the devices of stage {} (stage s on rank s mod {})",
                               name, s, s % ranks, ranks)};
  return ranks;
}

Result<Schedule> place_stage_actions(const ScheduleRequest& r,
                                     const std::vector<std::vector<Action>>& stage_actions,
                                     std::string_view schedule_name) {
  Schedule s;
  s.device_actions.resize(r.device_count);
  std::vector<int> owner(r.device_count, -1);
  for (size_t st = 0; st < stage_actions.size(); ++st) {
    for (int d : r.partition.stage(st).devices) {
      if (owner[d] >= 0)
        return Error{fmt::format("{} runs one stage per device, but device {} hosts stages {} and {}",
                                 schedule_name, d, owner[d], st)};
      owner[d] = static_cast<int>(st);
      s.device_actions[d] = stage_actions[st];
    }
  }
  return s;
}

std::string micro_batching_text(MicroBatching mb) {
  return fmt::format("{} micro-batch{} of {:g}", mb.count, mb.count == 1 ? "" : "es", mb.size);
}

}  // namespace pipegrid
