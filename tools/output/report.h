// What `pipegrid run` prints and writes: a readable summary, one JSON object, a Chrome trace.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "core/experiment.h"
#include "core/metrics.h"

namespace pipegrid::output {

struct RunReport {
  const Experiment& experiment;
  const PreparedRun& run;
  const Timeline& timeline;
  const Metrics& metrics;
};

void print_summary(std::ostream& out, const RunReport& r);

// "1 stage", "2 stages"; `count` may be fractional ("1.5 samples").
std::string plural(double count, std::string_view one, std::string_view many);

// A stage's layers, exactly: names and ranges of consecutive layers (in the workload's order),
// e.g. "node9..node12, node20, node31..node33 (8 layers)"; a single layer is its name.
std::string layer_list(const Workload& w, const std::vector<int>& layers);

// The stage graph's edges, "0->1, 0->2, 1->3, 2->3" ("none" for a single stage).
std::string stage_edges(const Partition& p);

// Warnings about a prepared run, one line each: stages whose replicas split a micro-batch into
// fractional samples (micro_batch_size not divisible by the stage's replica count).
std::vector<std::string> plan_warnings(const PreparedRun& run);

// Keys: experiment, iteration_time_s, throughput_samples_per_s, bubble_ratio, samples_per_iteration,
// micro_batches, micro_batch_size, feasible, infeasible (list), stages, devices (in device order:
// name, used, busy_s, idle_s, bubble_ratio, peak_memory_bytes, peak_activation_bytes,
// static_memory_bytes, capacity_bytes).
nlohmann::json to_json(const RunReport& r);

// Chrome trace event format (loads in Perfetto and chrome://tracing): one process per device,
// a "compute" track, "send" tracks for outgoing transfers, flow arrows from each activation or
// gradient transfer to the task that consumes it, and a "memory (bytes)" counter track.
void write_chrome_trace(std::ostream& out, const RunReport& r);

// One row per task: device,stage,kind,micro_batch,start_s,end_s,peer,bytes (kind: forward,
// backward, weight, optimizer, activation, gradient, allreduce; transfers: device = source,
// peer = destination; micro_batch -1 for per-iteration tasks).
void write_tasks_csv(std::ostream& out, const RunReport& r);

// One row per change of a device's memory: device,time_s,weights,gradients,optimizer,activations,
// workspace,total (bytes held from time_s until the device's next row).
void write_memory_csv(std::ostream& out, const RunReport& r);

}  // namespace pipegrid::output
