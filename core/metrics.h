// Metrics of one simulated iteration, computed from the task graph and its timeline.
#pragma once

#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/lower.h"
#include "core/memory.h"
#include "core/task_graph.h"

namespace pipegrid {

// Where a device's iteration goes (seconds; the parts add up to the iteration time). Busy time is
// compute (F, B, W) and the optimizer step. Each idle gap before a task is followed back along the
// chain of what the task waited for (its last-finishing dependency, and that one's, while they are
// transfers): the time a transfer ran, or its latency and wait for its start, counts as exposed
// communication of its kind (tensor-parallel collective, MoE expert-parallel all-to-all or expert
// tensor-parallel collective, pipeline activation or gradient, data-parallel gradient collective,
// context-parallel K/V exchange); the rest of the gap (waiting for another device's compute, or
// nothing) is bubble. Communication that overlaps compute is not exposed and does not appear.
struct TimeBreakdown {
  double compute_s = 0, optimizer_s = 0;
  double tensor_parallel_s = 0, pipeline_s = 0, data_parallel_s = 0;
  double bubble_s = 0;
  double expert_parallel_s = 0;
  double context_parallel_s = 0;
  double total() const {
    return compute_s + optimizer_s + tensor_parallel_s + pipeline_s + data_parallel_s + bubble_s +
           expert_parallel_s + context_parallel_s;
  }
};

struct DeviceMetrics {
  std::string name;
  bool used = false;        // hosts at least one stage
  double busy_s = 0;        // compute (F, B, W, optimizer step); transfers overlap and do not count
  double idle_s = 0;        // iteration time - busy
  double bubble_ratio = 0;  // idle / (idle + busy)
  double static_bytes = 0;  // weights + gradients + optimizer state
  double peak_memory_bytes = 0;
  double peak_activation_bytes = 0;  // the activation part alone (its own peak)
  double capacity_bytes = 0;
  TimeBreakdown breakdown;
};

struct Metrics {
  double iteration_time_s = 0;
  double samples_per_iteration = 0;
  double throughput_samples_per_s = 0;
  double bubble_ratio = 0;             // idle / (idle + busy) summed over the used devices
  std::vector<DeviceMetrics> devices;  // in cluster device order
  std::vector<int> over_capacity;      // devices whose peak memory exceeds their capacity
  TimeBreakdown breakdown;             // the mean over the used devices
  bool feasible() const { return over_capacity.empty(); }
};

// A device's memory as a step function: bytes by category from `time` until the next point.
struct MemoryPoint {
  double time = 0;
  MemoryBytes bytes{};
};
using MemoryTrace = std::vector<MemoryPoint>;

// Per device. At equal times, frees apply before allocations (a backward ending when a forward
// starts does not count twice).
std::vector<MemoryTrace> memory_traces(const TaskGraph& g, const Timeline& t);

// With `fold` (g lowered by lower_folded), a copied device's metrics are its image's, its own optimizer
// step in place of the image's.
Metrics compute_metrics(const Cluster& c, const TaskGraph& g, const Timeline& t,
                        const FoldLayout* fold = nullptr);

}  // namespace pipegrid
