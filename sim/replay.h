// Replays a TaskGraph in SimGrid: compute tasks as Exec on the device's host, transfers as Comm
// between hosts over the platform's routes (flow-level contention, CM02 with TCP-gamma 0 and
// crosstraffic 0 so one flow can use a whole link). Under the cluster's default Sharing::MaxMin,
// flows on a link direction get max-min fair shares and each transfer enters the network after its
// route's latency (a SimGrid timer); under Sharing::Tcp, CM02 weighs shares by route latency. Activities are
// created lazily, when their last dependency finishes (never the whole DAG up front: SimGrid 3.32 is
// quadratic on that).
#pragma once

#include "core/cluster.h"
#include "core/result.h"
#include "core/task_graph.h"

namespace pipegrid::sim {

struct ReplayOptions {
  bool log = false;  // let SimGrid print its log (silent by default)
  // Run each device's compute tasks from a SimGrid actor of its own instead of maestro (same results;
  // avoids SimGrid 3.32's scan of maestro's in-flight activities at every compute task's end, but
  // costs more in context switches than it saves up to 1,024 devices: see replay.cc).
  bool device_actors = false;
};

struct Replay {
  Timeline timeline;
  double wall_seconds = 0;  // time spent in the simulation loop
};

// Runs in this process. SimGrid allows one simulation per process: call this at most once.
Result<Replay> replay(const Cluster& c, const TaskGraph& g, const ReplayOptions& o = {});

// Runs replay() in a forked child process: any number per process (tests, sweeps, benchmarks).
Result<Replay> replay_isolated(const Cluster& c, const TaskGraph& g, const ReplayOptions& o = {});

}  // namespace pipegrid::sim
