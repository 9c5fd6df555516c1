// Builds the SimGrid platform of a validated cluster: one host per device, one SimGrid link per
// cluster link that some route uses (split-duplex for full-duplex links, shared otherwise), and
// explicit routes for the device pairs that communicate, computed by pipegrid's Router.
// The cluster's sharing rule decides where latency lives. Sharing::Tcp gives SimGrid the real link
// latencies: CM02 then makes each flow's sharing penalty its route latency, so flows on a link get
// shares inversely proportional to their route latencies. Sharing::MaxMin gives SimGrid links of
// latency 0 (every flow has the same penalty: plain max-min fairness) and keeps each pair's route
// latency in Platform::start_delay, which the replay waits before starting the flow. The zone
// stores only those routes (SimGrid's Full zone would allocate a table for every pair of hosts),
// so the platform of a 16k-device cluster is built in a fraction of a second. Every check that
// SimGrid would abort on is done before SimGrid sees anything.
#pragma once

#include <simgrid/s4u.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/cluster.h"
#include "core/result.h"
#include "sim/pair_table.h"

namespace pipegrid::sim {

// Host speed used when a device has no compute rate: compute tasks are given as durations, and
// a large speed keeps SimGrid's work-amount rounding far below a nanosecond.
inline constexpr double kDefaultHostSpeed = 1e12;

struct Platform {
  std::vector<simgrid::s4u::Host*> hosts;  // by device index
  std::vector<double> speeds;              // FLOP/s of each host
  // Seconds a transfer between two devices waits before it enters SimGrid's network: its route's
  // latency under Sharing::MaxMin, 0 under Sharing::Tcp (SimGrid applies the latency itself).
  double start_delay(int from, int to) const {
    const double* d = delays.find(static_cast<uint32_t>(from), static_cast<uint32_t>(to));
    return d != nullptr ? *d : 0.0;
  }
  PairTable<double> delays;          // absent: 0
  const Cluster* cluster = nullptr;  // for its collective engine's rates (Cluster::engine_rate)
};

// Validates the cluster and routes every pair (no SimGrid involved): fails on an invalid cluster
// or a pair that is not connected.
Result<std::vector<std::pair<std::pair<int, int>, Route>>> plan_routes(
    const Cluster& c, const std::vector<std::pair<int, int>>& pairs);

// Call after the engine is created and configured, once. `pairs` are the (source, destination)
// devices that exchange data.
Result<Platform> build_platform(const Cluster& c, const std::vector<std::pair<int, int>>& pairs);

// Names shared by the platform and the SimGrid XML export: link "<a>--<b>" (endpoint names), and
// the host speed of a device (its highest peak, or kDefaultHostSpeed).
std::string link_name(const Cluster& c, int link);
double host_speed(const DeviceSpec& d);
// Fails if two links would get the same SimGrid name (SimGrid aborts on that).
Status check_link_names(const Cluster& c);

}  // namespace pipegrid::sim
