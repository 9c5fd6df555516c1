// The lowered form of (partition, schedule): compute tasks in per-device order and transfers, with
// data dependencies. It is what the simulator replays and what the analytic evaluator runs.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "core/huge_pages.h"
#include "core/memory.h"

namespace pipegrid {

enum class TaskKind : unsigned char { Forward, Backward, Weight, Optimizer, Transfer };
// Which traffic a transfer belongs to (the breakdown and the trace group by it); the collectives
// themselves are core/collectives.h's. Activation / Gradient: between pipeline stages; DataParallel:
// a flow of the replicas' gradient collective (all-reduce, or the distributed optimizer's
// reduce-scatter); TensorParallel: a flow of a tensor-parallel group's collective; ExpertParallel: a
// flow of an MoE block's expert-parallel all-to-all or expert tensor-parallel collective (core/moe.h);
// ContextParallel: a flow of an attention core's K/V (or Q, K, V, O) exchange over its
// context-parallel group (core/context_parallel.h).
enum class TransferKind : unsigned char {
  None,
  Activation,
  Gradient,
  DataParallel,
  TensorParallel,
  ExpertParallel,
  ContextParallel
};
// The outputs' name of a transfer's traffic (timeline CSVs, the trace's categories, messages):
// "activation", "gradient", "allreduce" (data-parallel), "tensor-parallel", "expert-parallel",
// "context-parallel".
std::string_view to_string(TransferKind k);
// A flow of a group's collective (data-, tensor- or expert-parallel), not a stage-to-stage hand-over.
bool is_collective(TransferKind k);
// A flow of a group inside the stage (tensor-, expert- or context-parallel), not of the data-parallel
// gradient collective.
bool is_group_flow(TransferKind k);

struct Task {
  TaskKind kind = TaskKind::Forward;
  TransferKind transfer = TransferKind::None;
  // transfer: the collective's channel (NCCL's double binary trees: channel and tree), each its own
  // connection in the replay (sim/replay.cc); 0 for every other transfer. In the padding before `stage`.
  uint16_t channel = 0;
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

// Tasks and their dependencies. The dependencies are kept in compressed sparse rows: the successors
// of every task in one contiguous array (no heap block per task), in the order depend() was called.
// depend() appends to a list that the first successors() call after it packs into the rows; lower()
// reserves both up front.
struct TaskGraph {
  std::vector<Task> tasks;
  std::vector<int32_t> predecessor_count;
  std::vector<std::vector<int32_t>> device_order;  // per device: compute tasks in execution order
  std::vector<MemoryBytes> static_memory;          // per device, held for the whole iteration
  std::vector<MemoryChange> memory_changes;
  double samples_per_iteration = 0;
  // The expert-parallel all-to-alls were lowered node-aggregated (MoeOptions::all_to_all).
  bool node_aggregated_all_to_all = false;
  // Data-parallel all-reduces lowered under AllReduceAlgorithm::Nccl: {as NCCL's tree, as its ring per
  // NIC, as merged rings per NIC without a pick (above kAutoMergeRingFlows)}.
  std::array<int32_t, 3> nccl_picks{};

  int32_t add(const Task& t) {
    tasks.push_back(t);
    predecessor_count.push_back(0);
    return static_cast<int32_t>(tasks.size() - 1);
  }
  void depend(int32_t before, int32_t after) {
    added_.emplace_back(before, after);
    ++predecessor_count[after];
  }
  // Room for `task_count` tasks and `dependency_count` dependencies.
  void reserve(size_t task_count, size_t dependency_count) {
    reserve_huge(tasks, task_count);
    reserve_huge(predecessor_count, task_count);
    reserve_huge(added_, dependency_count);
  }

  // The tasks that depend on `t` (data dependencies), in the order they were added.
  std::span<const int32_t> successors(int32_t t) const {
    pack_dependencies();
    return {next_.data() + row_[t], next_.data() + row_[t + 1]};
  }
  size_t dependency_count() const { return next_.size() + added_.size(); }
  // For each task from `first` on, whether one of its predecessors is a task from `first` on: the
  // tasks one builder just added that wait on another of them (a collective's flows after its first
  // step). Costs the range's own dependencies, not the graph's; valid until a task after them gets a
  // predecessor among them (every dependency into them added after task `first` was).
  std::vector<char> waits_within(size_t first) const;
  // Packs the dependencies added so far now and frees their list (successors() would do it on
  // first use): lower() calls it so that the list is gone before a replay allocates its arrays.
  void pack_dependencies() const {
    if (!added_.empty() || row_.size() != tasks.size() + 1) pack();
  }

 private:
  void pack() const;  // merges added_ into row_ / next_

  mutable std::vector<std::pair<int32_t, int32_t>> added_;  // (before, after) not packed yet
  mutable std::vector<uint32_t> row_;                       // successors of t: next_[row_[t] .. row_[t + 1])
  mutable std::vector<int32_t> next_;
};

// When each task ran (indexed like TaskGraph::tasks).
struct Timeline {
  std::vector<double> start, end;
  double makespan() const;
};

}  // namespace pipegrid
