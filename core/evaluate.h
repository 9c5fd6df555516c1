// The analytic evaluator: runs a TaskGraph with the executor's semantics; a transfer takes route
// latency + bytes / slowest link bandwidth once every link of its route is free: links are FIFO
// channels (one per direction when full duplex) that transfers hold in launch order, instead of
// SimGrid's fair sharing between concurrent flows. Alone on its links, a transfer takes exactly
// what SimGrid gives it; flows that share a link finish in turn here and together there (the
// last one at the same time when they start together). It is the planners' fast estimate and a
// cross-check of the SimGrid replay.
#pragma once

#include "core/cluster.h"
#include "core/result.h"
#include "core/task_graph.h"

namespace pipegrid {

Result<Timeline> evaluate(const TaskGraph& g, const Cluster& c);
// The same with a router the caller keeps (its route cache then serves many evaluations).
Result<Timeline> evaluate(const TaskGraph& g, const Cluster& c, const Router& router);

}  // namespace pipegrid
