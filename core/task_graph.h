// The lowered form of (partition, schedule): compute tasks in per-device order and transfers, with
// data dependencies. It is what the simulator replays and what the analytic evaluator runs.
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory.h"

namespace pipegrid {

enum class TaskKind : unsigned char { Forward, Backward, Weight, Optimizer, Transfer };
enum class TransferKind : unsigned char { None, Activation, Gradient, AllReduce };

struct Task {
  TaskKind kind = TaskKind::Forward;
  TransferKind transfer = TransferKind::None;
  int32_t stage = -1;        // compute: its stage; transfer: the producing stage
  int32_t peer_stage = -1;   // transfer: the consuming stage
  int32_t micro_batch = -1;  // -1 for per-iteration tasks (optimizer step, all-reduce)
  int32_t device = -1;       // compute: the device; transfer: the source device
  int32_t peer = -1;         // transfer: the destination device
  double duration = 0;       // compute: seconds
  double bytes = 0;          // transfer: bytes

  bool is_compute() const { return kind != TaskKind::Transfer; }
};

// A change of a device's memory when a task starts (at_end = false) or ends.
struct MemoryChange {
  int32_t task = -1;
  MemoryCategory category = MemoryCategory::Activations;
  bool at_end = false;
  double bytes = 0;
};

struct TaskGraph {
  std::vector<Task> tasks;
  std::vector<std::vector<int32_t>> successors;  // data dependencies
  std::vector<int32_t> predecessor_count;
  std::vector<std::vector<int32_t>> device_order;  // per device: compute tasks in execution order
  std::vector<MemoryBytes> static_memory;          // per device, held for the whole iteration
  std::vector<MemoryChange> memory_changes;
  double samples_per_iteration = 0;

  int32_t add(const Task& t) {
    tasks.push_back(t);
    successors.emplace_back();
    predecessor_count.push_back(0);
    return static_cast<int32_t>(tasks.size() - 1);
  }
  void depend(int32_t before, int32_t after) {
    successors[before].push_back(after);
    ++predecessor_count[after];
  }
};

// When each task ran (indexed like TaskGraph::tasks).
struct Timeline {
  std::vector<double> start, end;
  double makespan() const;
};

}  // namespace pipegrid
