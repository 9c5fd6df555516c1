// Schedule validation, before any simulation. Errors print the offending device's action list with
// the culprit marked, e.g.
//   invalid schedule: on gpu1, 1B0 comes before its forward 1F0
//     gpu1: 1F1 [1B0] 1F0 1B1
#pragma once

#include <string>
#include <vector>

#include "core/partition.h"
#include "core/result.h"
#include "core/schedule.h"
#include "core/task_graph.h"

namespace pipegrid {

// Structural checks: every action names a stage on its device and a micro-batch in range; every
// replica device of every stage runs F, B (and W when split) of every micro-batch exactly once, F
// before B before W.
Status validate_schedule(const Schedule& s, const Partition& p, int micro_batches,
                         const std::vector<std::string>& device_names);

// The tasks in an order the executor could run them in (a device runs its compute tasks in order, each
// once its dependencies are done; a transfer once its dependencies are done), breadth first: roughly
// the order of their start times. Shorter than the task list when some never run (a deadlock).
std::vector<int32_t> execution_order(const TaskGraph& g);

// Dependency check by symbolic execution of the lowered graph (lowered from `s`): fails if some
// device can never run its next action (a deadlock), printing each stuck device's action list
// with the action it waits at marked, and what that action waits for.
Status check_deadlock_free(const TaskGraph& g, const Schedule& s,
                           const std::vector<std::string>& device_names);

// "gpu1: 1F1 [1B0] 1F0 1B1", eliding far-away actions with "...".
std::string mark_action(const std::vector<Action>& actions, size_t index, const std::string& device_name);

}  // namespace pipegrid
