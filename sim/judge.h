// A PlanJudge that replays each candidate in SimGrid (each in a forked child), so explorations
// (bapipe, mini-batch sweeps) confirm their choice in the event simulation.
#pragma once

#include "core/experiment.h"
#include "sim/replay.h"

namespace pipegrid::sim {

class SimGridJudge : public PlanJudge {
 public:
  Result<double> iteration_time(const Cluster& c, const TaskGraph& g) const override {
    Result<Replay> r = replay_isolated(c, g);
    if (!r) return r.error();
    return r->timeline.makespan();
  }
  std::string_view name() const override { return "SimGrid"; }
};

}  // namespace pipegrid::sim
