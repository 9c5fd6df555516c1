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
// A collective engine (Cluster::engine) is a resource of its own: each FPGA on it gets a port per
// kind of flow (a collective's flows, stage-to-stage sends) whose rate is finite, a host of its own
// joined to the board by a split-duplex link at that rate, and a flow between two engine devices
// runs port to port: the source's engine link up, the route's links, the destination's engine link
// down. A flow alone then runs at the engine's rate, flows through one board's engine share it, and
// the network's links are charged what the flows move, so other traffic beside them gets the rest.
#pragma once

#include <array>
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
  PairTable<double> delays;  // absent: 0
  // The hosts a flow from device `from` to device `to` leaves from and arrives at: the devices' own,
  // or their engine ports where both are on the cluster's collective engine and its rate for the
  // kind of flow is finite (Cluster::engine_rate).
  std::pair<simgrid::s4u::Host*, simgrid::s4u::Host*> endpoints(int from, int to, bool collective) const {
    const size_t kind = collective ? 0 : 1;
    if (static_cast<size_t>(from) < engine_ports.size() && static_cast<size_t>(to) < engine_ports.size()) {
      simgrid::s4u::Host* a = engine_ports[static_cast<size_t>(from)][kind];
      simgrid::s4u::Host* b = engine_ports[static_cast<size_t>(to)][kind];
      if (a != nullptr && b != nullptr) return {a, b};
    }
    return {hosts[static_cast<size_t>(from)], hosts[static_cast<size_t>(to)]};
  }
  // By device: its collective engine's ports for a collective's flows [0] and sends [1]; null where
  // the device is not on the engine or the kind's rate is unbounded. Empty without an engine.
  std::vector<std::array<simgrid::s4u::Host*, 2>> engine_ports;
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
