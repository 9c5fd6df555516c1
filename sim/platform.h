// Builds the SimGrid platform of a validated cluster: one host per device, one link per cluster link
// (split-duplex for full-duplex links, shared otherwise), and explicit routes for the device pairs
// that communicate, computed by pipegrid's Router (shortest latency, then fewest hops). Every check
// that SimGrid would abort on is done before SimGrid sees anything.
#pragma once

#include <simgrid/s4u.hpp>
#include <utility>
#include <vector>

#include "core/cluster.h"
#include "core/result.h"

namespace pipegrid::sim {

// Host speed used when a device has no compute rate: compute tasks are given as durations, and
// a large speed keeps SimGrid's work-amount rounding far below a nanosecond.
inline constexpr double kDefaultHostSpeed = 1e12;

struct Platform {
  std::vector<simgrid::s4u::Host*> hosts;  // by device index
  std::vector<double> speeds;              // FLOP/s of each host
};

// Call after the engine is created and configured, once. `pairs` are the (source, destination)
// devices that exchange data.
Result<Platform> build_platform(const Cluster& c, const std::vector<std::pair<int, int>>& pairs);

}  // namespace pipegrid::sim
