// Replays a TaskGraph in SimGrid: transfers as Comms between hosts over the platform's routes
// (flow-level contention, CM02 with TCP-gamma 0 and crosstraffic 0 so one flow can use a whole
// link); compute tasks on device clocks, which end each task when SimGrid's CPU model would (or, as
// an option, as Execs on the device's host). Under the cluster's default Sharing::MaxMin,
// flows on a link direction get max-min fair shares and each transfer enters the network after its
// route's latency (a SimGrid timer); under Sharing::Tcp, CM02 weighs shares by route latency. Activities are
// created lazily, when their last dependency finishes (never the whole DAG up front: SimGrid 3.32 is
// quadratic on that). A collective's flows between two devices go one at a time in the order they
// become ready (one connection per sender, receiver, collective kind and stage; docs/model.md).
#pragma once

#include "core/cluster.h"
#include "core/result.h"
#include "core/schedule.h"
#include "core/task_graph.h"

namespace pipegrid::sim {

struct ReplayOptions {
  bool log = false;  // let SimGrid print its log (silent by default)
  // Run compute tasks as SimGrid Execs on the devices' hosts (SimGrid's CPU model) instead of the
  // device clocks (the default: the same end dates, computed by the replay; see replay.cc). Same
  // results, slower: kept as the reference the device clocks are tested against.
  bool simgrid_execs = false;
  // The schedule the graph was lowered from: a replay that cannot complete (a deadlock) then fails
  // with check_deadlock_free's message, which marks each device's stuck action in the schedule (and
  // its file position); without it, with the executor's list of what each device waits for.
  const Schedule* schedule = nullptr;
};

struct Replay {
  Timeline timeline;
  double wall_seconds = 0;  // time spent in the simulation loop
};

// Runs in this process. SimGrid allows one simulation per process: call this at most once (any
// number of them, each in a forked child: tools/process/isolated_replay.h).
Result<Replay> replay(const Cluster& c, const TaskGraph& g, const ReplayOptions& o = {});

}  // namespace pipegrid::sim
