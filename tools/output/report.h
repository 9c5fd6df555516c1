// What `pipegrid run` prints and writes: a readable summary, one JSON object, a Chrome trace.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>

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

// Keys: experiment, iteration_time_s, throughput_samples_per_s, bubble_ratio, samples_per_iteration,
// micro_batches, micro_batch_size, feasible, infeasible (list), stages, devices (in device order:
// name, used, busy_s, idle_s, bubble_ratio, peak_memory_bytes, peak_activation_bytes,
// static_memory_bytes, capacity_bytes).
nlohmann::json to_json(const RunReport& r);

// Chrome trace event format (loads in Perfetto and chrome://tracing): one process per device,
// a "compute" track, "send" tracks for outgoing transfers, and a "memory" counter track.
void write_chrome_trace(std::ostream& out, const RunReport& r);

}  // namespace pipegrid::output
