// The analytic evaluator: runs a TaskGraph with the executor's semantics and uncontended
// transfers (route latency + bytes / slowest link bandwidth). No flow contention: it is the
// planners' fast estimate and a cross-check of the SimGrid replay, which models contention.
#pragma once

#include "core/cluster.h"
#include "core/result.h"
#include "core/task_graph.h"

namespace pipegrid {

Result<Timeline> evaluate(const TaskGraph& g, const Cluster& c);

}  // namespace pipegrid
