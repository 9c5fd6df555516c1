// Runs a TaskGraph with a pluggable notion of time. The executor owns the semantics shared by
// every backend: a device runs its compute tasks one at a time, in its order, each once all its
// data dependencies are done; a transfer starts as soon as its dependencies are done (transfers
// overlap compute). Zero-length compute tasks and transfers between a device and itself finish
// at once without the backend. Backends (the analytic evaluator, the SimGrid replay) only say how
// long a launched task takes, by calling finished().
#pragma once

#include <string>
#include <vector>

#include "core/result.h"
#include "core/task_graph.h"

namespace pipegrid {

class TaskLauncher {
 public:
  virtual ~TaskLauncher() = default;
  // Start `task` at time `now`; call Executor::finished(task, end) when it ends.
  virtual void launch(int32_t task, double now) = 0;
};

class Executor {
 public:
  Executor(const TaskGraph& graph, TaskLauncher& launcher);

  void start();  // launches what is ready at time 0
  void finished(int32_t task, double end);
  // A hint from a backend that knows which task ends next: its state is fetched into the cache
  // while the backend does the rest of its step. No effect on results.
  void expect(int32_t task) const {
    __builtin_prefetch(&node_[task], 1, 3);
    __builtin_prefetch(&timeline_.end[task], 1, 3);
  }

  bool complete() const { return done_ == graph_.tasks.size(); }
  // Explains an incomplete run: what each stuck device waits for (a deadlock).
  Error stuck_error(const std::vector<std::string>& device_names) const;
  // Devices that did not finish, with the position in their order they are stuck at.
  std::vector<std::pair<int, size_t>> stuck() const;
  // Unfinished tasks that `task` depends on, followed through unfinished transfers to the compute
  // tasks that produce them.
  std::vector<int32_t> blockers(int32_t task) const;
  Timeline take_timeline() { return std::move(timeline_); }

 private:
  void launch(int32_t task, double now);
  void try_device(int device, double now);
  void drain();

  // What the loop reads of a task, in one place (one cache line instead of a task's 40 bytes, a
  // separate count and the successor rows): its unfinished predecessors, for a compute task its
  // device, and its successor when it has exactly one (a transfer's consumer, an F's or a B's lone
  // transfer: nearly every task of a pipeline), which spares the loop two reads in the rows.
  struct Node {
    int32_t pending;
    int32_t device;  // -1: a transfer
    int32_t single;  // the lone successor, or -1: none or several (read graph_.successors())
  };
  struct DeviceState {
    const int32_t* order;  // graph_.device_order[d]
    uint32_t size;
    uint32_t cursor;  // next position in order
    int32_t next;     // order[cursor], or -1 past the end: read once per task, not at every try
    int32_t after;    // order[cursor + 1], or -1
    bool busy;
  };
  void advance(DeviceState& dev);  // moves the cursor one task on

  const TaskGraph& graph_;
  TaskLauncher& launcher_;
  Timeline timeline_;
  std::vector<Node> node_;
  std::vector<DeviceState> devices_;
  std::vector<std::pair<int32_t, double>> instant_;  // finished without the backend, to process
  size_t done_ = 0;
};

// A short human description of a task: "1B0 on gpu1", "activation 0->1 of micro-batch 3, gpu0->gpu1".
std::string describe_task(const Task& t, const std::vector<std::string>& device_names);

}  // namespace pipegrid
