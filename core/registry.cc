#include <fmt/format.h>

#include "core/planner.h"
#include "core/strategy.h"

namespace pipegrid {
namespace {

constexpr PartitionStrategy kPartitioners[] = {
    {"uniform", "equal layer counts per stage (in topological order), stage i on device i",
     &partition_uniform},
    {"balanced", "contiguous stages minimising the slowest stage's compute time, stage i on device i",
     &partition_balanced},
    {"megatron", "Megatron-LM's split: equal runs of transformer blocks, embeddings first, head last",
     &partition_megatron},
    {"graphpipe",
     "GraphPipe-style: a DAG of stages from the series-parallel decomposition, min bottleneck TPS",
     &partition_graphpipe, &graphpipe_search_steps},
    {"bapipe",
     "BaPipe's partition step: contiguous stages, replicas per stage, min slowest stage under memory",
     &partition_bapipe},
    {"pipedream", "PipeDream's planner (SOSP'19): antichain DP with replication, hierarchy, straight mode",
     &partition_pipedream},
    {"dp", "pure data parallelism: one stage with every layer on every device, gradients all-reduced",
     &partition_dp},
};

constexpr ScheduleStrategy kSchedules[] = {
    {"gpipe", "GPipe: all forwards of the mini-batch, then all backwards, then the optimizer step",
     &schedule_gpipe},
    {"1f1b",
     "synchronous 1F1B (PipeDream-Flush): warm-up forwards, one forward/one backward, drain, one step",
     &schedule_1f1b},
    {"interleaved-1f1b",
     "Megatron's interleaved 1F1B: `chunks` model chunks per device, stage s on device s mod p",
     &schedule_interleaved_1f1b},
    {"zb-h1", "zero bubble H1: B/W split, W deferred to fill the drain, 1F1B's memory (p micro-batches)",
     &schedule_zb_h1},
    {"zb-h2", "zero bubble H2: B/W split, 2p-1 micro-batches in flight, no bubble in steady state",
     &schedule_zb_h2},
    {"file", "a schedule read from a torch.distributed.pipelining-style CSV (`schedule_file`)",
     &schedule_file},
    {"graph-1f1b", "1F1B on a DAG of stages: 1 + (longest path to a sink) forwards before the first backward",
     &schedule_graph_1f1b},
};

// The first entry is the default (kDefaultPlanner). A planner named like a partitioner is also
// chosen by `partitioner: NAME` (the older spelling, see planner_for).
constexpr PlannerInfo kPlanners[] = {
    {kDefaultPlanner,
     "the strategy's partitioner and schedule; with mini_batch, every micro-batch size dividing it",
     &plan_partitioner},
    {"bapipe",
     "BaPipe-style: explores schedules x micro-batch sizes x stages x replicas, fastest plan that fits",
     &plan_bapipe},
    {"luo",
     "Luo-style (INFOCOM'22, our interpretation): stages x device groups on the real interconnect, own "
     "scheduler",
     &plan_luo},
    {"dapple",
     "DAPPLE-style: DP over stages x replica counts, fresh/append/scatter-first placement on machines, 1F1B",
     &plan_dapple},
    {"piper",
     "Piper-style (NeurIPS'21, our interpretation): DP over contiguous stages, each with its own t and d, "
     "1F1B",
     &plan_piper},
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

}  // namespace pipegrid
