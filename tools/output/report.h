// What `pipegrid run` prints and writes: a readable summary, one JSON object, a Chrome trace.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "core/experiment.h"
#include "core/lower.h"
#include "core/metrics.h"
#include "tools/output/cost_model_checks.h"

namespace pipegrid::output {

// Which tasks the timeline CSVs hold (run --plot, --tasks, --memory): a subset of the devices and a
// window of micro-batches, so that a large run's timeline stays drawable.
struct TimelineView {
  std::vector<char> devices;  // per cluster device, 1: kept; empty: every device
  // Micro-batches first..last (inclusive) kept; -1: from the first, to the last. Per-iteration tasks
  // (micro-batch -1: all-reduces, optimizer steps) are kept when the window reaches the last one.
  int first_micro_batch = -1, last_micro_batch = -1;
  bool keeps(const Task& t, int micro_batches) const;
  bool keeps_device(int d) const { return devices.empty() || devices[static_cast<size_t>(d)]; }
};

// One device per pipeline rank (the first device of each stage: tensor rank 0 of replica 0), for a
// timeline of one row per rank.
std::vector<char> rank_representatives(const Cluster& c, const Partition& p);

struct RunReport {
  const Experiment& experiment;
  const PreparedRun& run;
  const Timeline& timeline;
  const Metrics& metrics;
  bool all_devices = false;  // the summary lists every device (--devices all), not groups
  double tokens = 0;         // a token budget to time (--tokens; 0: none)
  TimelineView view;         // what the CSVs hold
  std::string replay;        // how the replay ran when it says so (process::describe); empty: the whole graph
};

// The summary. From kFoldThresholdTasks tasks (large_layout) the answer comes first (iteration time,
// throughput, MFU, breakdown, peak memory per device group) and stages alike share a row, so that a
// run on 16,384 devices reads in its first 20 lines; smaller runs print as they always have.
void print_summary(std::ostream& out, const RunReport& r);
bool large_layout(const RunReport& r);

// "1 stage", "2 stages"; `count` may be fractional ("1.5 samples").
std::string plural(double count, std::string_view one, std::string_view many);

// A breakdown's seconds by part; `experts` adds the exposed expert-parallel communication (MoE runs).
nlohmann::json breakdown_json(const TimeBreakdown& b, bool experts = false, bool context = false);
// "cp = 2 (context, p2p)": the context-parallel size and algorithm ("contiguous split" when not
// load-balanced); empty without context parallelism.
std::string context_note(const Experiment& e, const Partition& p);

// One line on a MoE run's experts: per device, ep, etp, dispatcher, routing, drops, load imbalance.
std::string moe_note(const Experiment& e, const Partition& p, bool node_aggregated);
// "2 of 8 devices hold no stage (gpu6, gpu7)", or "" when the plan uses every device of `c`.
std::string idle_devices_note(const Cluster& c, const Partition& p);

// Whether the expert groups send flows of their own (ep or etp > 1): the breakdown's expert_parallel_s.
bool expert_traffic(const Parallelism& par);
// What the breakdown's expert_parallel_s holds, for its label: the EP dispatcher's exchanges at ep > 1,
// the expert tensor-parallel collectives at ep 1.
std::string expert_comm_label(const Experiment& e, const Parallelism& par);
// Whether the experts line and JSON appear: expert groups, or a workload with MoE blocks.
bool reports_experts(const Experiment& e, const Parallelism& par);

// A stage's layers, exactly: names and ranges of consecutive layers (in the workload's order),
// e.g. "node9..node12, node20, node31..node33 (8 layers)"; a single layer is its name.
std::string layer_list(const Workload& w, const std::vector<int>& layers);

// The stage graph's edges, "0->1, 0->2, 1->3, 2->3" ("none" for a single stage).
std::string stage_edges(const Partition& p);

// Warnings about a prepared run, one line each: devices the default stage count leaves idle (fewer
// layers per chunk than devices), stages whose replicas split a micro-batch into fractional samples
// (micro_batch_size not divisible by the stage's replica count).
std::vector<std::string> plan_warnings(const Experiment& e, const PreparedRun& run);
// A profile's layers whose parameter_size is not a whole number of fp32 parameters (a multiple of 4
// bytes), so their counts are fractional: "" when there are none. Printed by run, plan and
// `workload show`; DAPPLE's vgg-19 profile is such a file (workloads/profiles/dapple/SOURCE.md).
std::string fractional_parameters_warning(const Workload& w);

// The JSON vocabulary shared by `run --json`, `plan --json` and the sweep database's rows (README
// "JSON outputs"). Version 1. Counts and byte sizes are integers when they are whole.
inline constexpr int kJsonSchemaVersion = 1;

// A number as JSON: an integer when it is whole (and exact as a double), else a float.
nlohmann::json json_number(double x);

// A device's resolved figures: family, model, memory_bytes, memory_bandwidth_Bps, peak_flops (per
// precision), efficiencies, kernel_startup_s (kernel_startup_class_s: per kernel class),
// kernel_dispatch_s, layer_overhead_s, recurrent_step_s
// (per precision), winograd (the precisions whose 3x3 stride-1 convolutions run as Winograd), and
// `fpga` for FPGAs.
nlohmann::json device_spec_json(const DeviceSpec& spec);

// The hardware simulated: `cluster` (name), `sharing`, `device_models` (each distinct device
// spec with its `count` and the first and last device names), `links` (each distinct
// {bandwidth_Bps, latency_s, duplex} with its count), `switches` (a count).
nlohmann::json hardware_json(const Cluster& c);

// What run and plan share: schema_version, pipegrid_version, command, experiment, hardware,
// planner, partitioner, schedule, micro_batch_size, micro_batches, batch, samples_per_iteration, depth,
// stages, iteration_time_s, throughput_samples_per_s, bubble_ratio, peak_memory_bytes, feasible,
// infeasible, planner_summary, predicted_time_per_stage_s, predicted_stage_time_s, exploration,
// added_dependencies, planning_seconds, devices (the simulated metrics of `metrics`, each with its
// memory_reserve_bytes), device_groups (output::group_devices), assumptions and model_flops
// (tools/output/run_figures.h).
nlohmann::json common_json(std::string_view command, const Experiment& e, const PreparedRun& run,
                           const Metrics& metrics);

// The chosen plan, structured (common_json's `plan`; the sweep CSV's plan columns): planner,
// partitioner (the one that made the stages; the planner's name when it made them itself),
// schedule, chunks, shape ("one device", "data-parallel", "pipeline", "stage DAG", "... of
// replicated stages"), stages, depth, devices_per_stage, replicas_per_stage, devices_used,
// devices_total, micro_batch_size, micro_batches, samples_per_replica (per stage), and `tried`
// (each {what, micro_batch_size, micro_batches, stages, fits, outcome, analytic_iteration_time_s,
// judged_iteration_time_s}; planners that explore fill it).
nlohmann::json plan_json(const Experiment& e, const PreparedRun& run);

// The batch as Megatron-LM states it (docs/experiment-files.md, "Batch"), for the `batch` line of
// run and plan: the global batch = micro-batches x replicas x samples per replica where every stage
// has the same d (else the micro-batch its stages' replicas split), then t, p, d ("1 to 4 by stage"
// where stages differ).
std::string batch_note(const PreparedRun& run);

// The same as JSON (common_json's `batch`): global_batch, micro_batch_size_per_replica (null where
// the stages' d differ), micro_batches, tensor_parallel (null where the stages' t differ),
// pipeline_parallel, data_parallel (null where the stages' d differ).
nlohmann::json batch_json(const PreparedRun& run);

// "one device", "data-parallel", "pipeline", "stage DAG", "pipeline of replicated stages", ...
std::string plan_shape(const Partition& p);

// How the data-parallel gradients are reduced (strategy dp_overlap, gradient_reduce), for the
// `gradients` line of run and plan; empty when neither is set.
std::string gradients_note(const Experiment& e, const Partition& p,
                           const std::vector<std::vector<StageCost>>& costs);

// The copies of tied weights the plan's devices keep (partition.h TiedCopy), for the `tied` line of
// run and plan: "stage 3 keeps a copy of the weight lm_head takes from embedding.words (12.9 M
// parameters per device) and all-reduces its gradient with stage 0's (Megatron-Core's output-layer
// copy)"; empty when there is none.
std::string tied_note(const Experiment& e, const Partition& p);
// The same as JSON: a list of {stage, layer, source_layer, source_stage, parameters_per_device}.
nlohmann::json tied_json(const Experiment& e, const Partition& p);

// Keys: experiment, iteration_time_s, throughput_samples_per_s, bubble_ratio, samples_per_iteration,
// micro_batches, micro_batch_size, feasible, infeasible (list), stages, devices (in device order:
// name, used, busy_s, idle_s, bubble_ratio, peak_memory_bytes, peak_activation_bytes,
// static_memory_bytes, capacity_bytes).
nlohmann::json to_json(const RunReport& r);

// Chrome trace event format (loads in Perfetto and chrome://tracing): one process per device,
// a "compute" track, "send" tracks for outgoing transfers, flow arrows from each activation or
// gradient transfer to the task that consumes it, and a "memory (bytes)" counter track.
void write_chrome_trace(std::ostream& out, const RunReport& r);

// One row per task r.view keeps: device,stage,kind,micro_batch,start_s,end_s,peer,bytes (kind: forward,
// backward, weight, optimizer, activation, gradient, allreduce; transfers: device = source,
// peer = destination; micro_batch -1 for per-iteration tasks).
// One CSV field as RFC 4180 writes it: quoted, its quotes doubled, where it holds a comma, a quote or
// a line break (a device named "g,pu" would shift the columns otherwise); as it is elsewhere.
std::string csv_field(std::string_view s);
void write_tasks_csv(std::ostream& out, const RunReport& r);

// One row per change of the memory of a device r.view keeps, within the window's times:
// device,time_s,weights,gradients,optimizer,activations, workspace,total (bytes held from time_s until the
// device's next row).
void write_memory_csv(std::ostream& out, const RunReport& r);

}  // namespace pipegrid::output
