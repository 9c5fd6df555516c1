// SimGrid replays in forked children (tools/process/process.h): SimGrid allows one simulation per
// process, so tests, benchmarks and the command line replay any number of graphs this way.
#pragma once

#include "core/cluster.h"
#include "core/planner.h"
#include "core/result.h"
#include "core/task_graph.h"
#include "sim/replay.h"

namespace pipegrid::process {

// sim::replay() in a forked child; its timeline and wall time come back whole. A child that dies
// fails with "the simulation process died (SIGNAL)".
Result<sim::Replay> replay_isolated(const Cluster& c, const TaskGraph& g, const sim::ReplayOptions& o = {});

// A PlanJudge that replays each candidate in SimGrid (each in a forked child), so explorations
// (bapipe, mini-batch sweeps) confirm their choice in the event simulation.
class SimGridJudge : public PlanJudge {
 public:
  Result<double> iteration_time(const Cluster& c, const TaskGraph& g) const override;
  std::string_view name() const override { return "SimGrid"; }
};

}  // namespace pipegrid::process
