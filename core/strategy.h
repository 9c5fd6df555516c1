// Strategy plug-ins: one interface per kind (a name, a one-line description, one function) and one
// table listing them all (registry.cc). A strategy is a pure function of plain data.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/cluster.h"
#include "core/memory.h"
#include "core/partition.h"
#include "core/result.h"
#include "core/schedule.h"
#include "core/workload.h"

namespace pipegrid {

// The megatron partitioner's uneven split, as Megatron-Core's arguments set it (megatron/training/
// arguments.py; megatron_layout in core/partitioners/megatron.h applies its rules). Either the block
// counts of the first and last pipeline ranks (0: not given), or the embedding and the loss counted
// as one block each (not both: Megatron-Core refuses the combination), or an explicit layout of every
// stage (alone).
struct MegatronSplit {
  int first_stage_blocks = 0;  // --decoder-first-pipeline-num-layers: blocks on rank 0, all its chunks
  int last_stage_blocks = 0;   // --decoder-last-pipeline-num-layers: blocks on the last rank
  bool account_for_embedding = false;  // --account-for-embedding-in-pipeline-split
  bool account_for_loss = false;       // --account-for-loss-in-pipeline-split
  std::string layout;  // --pipeline-model-parallel-layout, e.g. "Et*4|(t*4|)*14tmL"; empty: none
  bool uneven() const {
    return first_stage_blocks > 0 || last_stage_blocks > 0 || account_for_embedding || account_for_loss ||
           !layout.empty();
  }
};

// Settings of the partitioners that take them (PipeDream's, as its command-line options; megatron's
// uneven split).
struct PartitionerOptions {
  bool straight = false;                          // no replicated stages
  std::vector<std::pair<int, double>> hierarchy;  // (workers, bandwidth) innermost first; empty: derived
  std::optional<double> activation_compression_ratio = 1.0;  // none: no activation transfer terms
  bool memory_constraint = false;                            // bound each stage's stash by the device memory
  bool linearize = false;                                    // plan over the prefixes of a topological order
  MegatronSplit megatron;                                    // megatron: uneven first and last stages
  // Replicas of a stage take whole micro-batches in turn (PipeDream's round-robin; Stage::round_robin)
  // rather than splitting each: any replica count then keeps whole samples.
  bool round_robin = false;
};

struct PartitionRequest {
  const Workload& workload;
  const Cluster& cluster;
  int stages = 0;               // pipeline ranks wanted: 1 .. devices (stages = ranks x chunks <= layers)
  double micro_batch_size = 1;  // samples per micro-batch
  int chunks = 1;               // model chunks per rank (interleaving): stage s runs on rank s mod ranks
  int micro_batches = 1;        // m: planners that check memory need the in-flight counts it implies
  MemoryOptions memory;         // static memory model, recomputation
  std::string_view schedule;    // the schedule that will run the partition (in-flight counts)
  int replicas = 1;             // devices per stage (data-parallel replicas), for partitioners that take it;
                                // kAnyReplicas: the partitioner chooses per stage (bapipe)
  PartitionerOptions options = {};
  std::vector<int> stage_ranks;  // a schedule file's placement (file_stage_ranks): stage s on rank
                                 // stage_ranks[s]; empty: rank_of_stage's rule
};
inline constexpr int kAnyReplicas = -1;

// Whether `replicas` replicas of a stage split a micro-batch of `micro_batch_size` samples into whole
// samples each (replicas divide the size). A fractional micro-batch (a scaled profile) has no whole
// samples to keep: any count is allowed then. Planners and partitioners that choose replica counts
// consider only the counts this allows (issue 30: a split into 0.25 samples, costed linearly, made
// plans look faster than any real data loader runs them).
inline bool whole_samples_per_replica(double micro_batch_size, int replicas) {
  if (replicas <= 1 || micro_batch_size != static_cast<double>(static_cast<long long>(micro_batch_size)))
    return true;
  return static_cast<long long>(micro_batch_size) % replicas == 0;
}

// Who decides how many data-parallel replicas each stage of a partitioner's plan has. The parser
// checks the strategy's keys against it (`replicas`, a per-replica micro-batch size), and the
// strategy's data-parallel degree follows from it (fixed_replicas, core/planner.h).
enum class ReplicaChoice {
  Given,       // the strategy's `replicas`: the same d for every stage
  AllDevices,  // one stage on every device of the cluster: d = the devices
  Chosen,      // the partitioner chooses each stage's replicas
};

struct PartitionStrategy {
  std::string_view name;
  std::string_view description;
  Result<Partition> (*build)(const PartitionRequest&);
  // Optional: the steps build() would take on a request, in the unit of its own limit (a search
  // above kMaxPartitionSearchSteps is refused). A mini-batch sweep sums it over its micro-batch
  // sizes and refuses the whole sweep above the limit before planning any of them.
  double (*search_steps)(const PartitionRequest&) = nullptr;
  ReplicaChoice replicas = ReplicaChoice::Given;
  // `tensor_parallel` (the default planner turns each device it places into a group of t devices).
  bool takes_tensor_parallel = false;
  // PipeDream's options: `straight`, `memory_constraint`, `linearize`, `activation_compression_ratio`,
  // `hierarchy` (refused for partitioners without them, which would ignore them).
  bool takes_pipedream_options = false;
  // Plans with the first device's costs for every device (identical devices assumed): a cluster of
  // unlike devices is said beside the plan.
  bool assumes_identical_devices = false;
  // Cuts ranks x chunks stages in order, stage s for rank s mod ranks as the default planner places
  // them: what the schedules that place stages on ranks themselves (ScheduleStrategy::places_stages)
  // run on.
  bool stages_in_rank_order = false;
  // Searches without a fault's slowdown (Device::slowdown, which the lowering applies; the others cost
  // each device through device_layer_times): where the cluster has slow devices, run and plan say so
  // beside the plan.
  bool blind_to_slow_devices = false;
};
// About a minute of search (graphpipe: 60-90 ns per step measured).
inline constexpr double kMaxPartitionSearchSteps = 1073741824;  // 2^30

struct ScheduleRequest {
  const Partition& partition;
  size_t device_count = 0;
  int micro_batches = 1;
  int chunks = 1;              // model chunks per rank (interleaved-1f1b)
  std::string_view file_text;  // `file`: the schedule as torch-style CSV
  std::string file_name;       // `file`: where the text came from, for messages
  // Megatron-Core's A2A overlap (--overlap-moe-expert-parallel-comm) for interleaved-1f1b: one more
  // forward chunk-step in each rank's warm-up (schedules.py, num_warmup_microbatches += 1), so that the
  // forward and the backward of each steady-state step, which it runs as one overlapped pair
  // (Schedule::paired), belong to independent micro-batches; the warm-up and cool-down passes alone.
  bool a2a_overlap = false;
};

struct ScheduleStrategy {
  std::string_view name;
  std::string_view description;
  Result<Schedule> (*build)(const ScheduleRequest&);
  // What it takes from the strategy (the parser checks keys against it):
  bool takes_chunks = false;  // `chunks` > 1: model chunks per rank
  bool needs_chunks = false;  // at least 2 chunks (with 1 it would be another schedule)
  bool reads_file = false;    // `schedule_file`: the schedule itself
  // Puts stage s on a rank by its own rule (interleaved 1F1B's s mod p, DualPipe's pairs and V): the
  // stages must be a partitioner's in rank order (PartitionStrategy::stages_in_rank_order).
  bool places_stages = false;
};

std::span<const PartitionStrategy> partition_strategies();
std::span<const ScheduleStrategy> schedule_strategies();

// Unknown names are errors that list the valid ones.
Result<const PartitionStrategy*> find_partitioner(std::string_view name);
Result<const ScheduleStrategy*> find_schedule(std::string_view name);

// Implementations (each in its own file under partitioners/ and schedules/).
Result<Partition> partition_uniform(const PartitionRequest& r);
Result<Partition> partition_balanced(const PartitionRequest& r);
Result<Partition> partition_megatron(const PartitionRequest& r);
Result<Partition> partition_graphpipe(const PartitionRequest& r);
double graphpipe_search_steps(const PartitionRequest& r);
Result<Partition> partition_bapipe(const PartitionRequest& r);
Result<Partition> partition_pipedream(const PartitionRequest& r);
Result<Partition> partition_dp(const PartitionRequest& r);
Result<Schedule> schedule_gpipe(const ScheduleRequest& r);
Result<Schedule> schedule_1f1b(const ScheduleRequest& r);
Result<Schedule> schedule_interleaved_1f1b(const ScheduleRequest& r);
Result<Schedule> schedule_zb_h1(const ScheduleRequest& r);
Result<Schedule> schedule_zb_h2(const ScheduleRequest& r);
Result<Schedule> schedule_file(const ScheduleRequest& r);
Result<Schedule> schedule_graph_1f1b(const ScheduleRequest& r);
Result<Schedule> schedule_dualpipe(const ScheduleRequest& r);
Result<Schedule> schedule_dualpipev(const ScheduleRequest& r);

// The ranks of a V-placed partition (dualpipev): 2N stages, stage s and 2N - 1 - s on the same
// devices. Fails otherwise.
Result<int> v_ranks(const Partition& p, std::string_view schedule_name);
// The ranks of DualPipe's two pipelines (dualpipe_pipelines): a V placement of 2N stages whose first
// N run the first half of the micro-batches as a chain and the last N, their mirrors, the second.
Result<int> dualpipe_ranks(const Partition& p, int micro_batches, std::string_view schedule_name);
// DualPipe's and DualPipeV's conditions on N ranks and M micro-batches, as DeepSeek's reference asserts
// them (dualpipe: N and M even, M >= 2N; dualpipev: M >= 2N): nullopt when they hold, else why not.
std::optional<std::string> dual_pipeline_refusal(std::string_view schedule, int ranks, int micro_batches);

// Helpers shared by stage-per-device schedules: copies each stage's action list to every device of
// the stage; fails if a device hosts more than one stage.
Result<Schedule> place_stage_actions(const ScheduleRequest& r,
                                     const std::vector<std::vector<Action>>& stage_actions,
                                     std::string_view schedule_name);

// Ranks of an interleaved partition: stage s runs on the devices of stage s mod ranks. Fails
// unless the stage count is chunks x ranks and the placement follows that rule.
Result<int> interleaved_ranks(const Partition& p, int chunks, std::string_view schedule_name);

}  // namespace pipegrid
