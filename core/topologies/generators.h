// Cluster generators: standard interconnects from a few parameters.
#pragma once

#include <string>

#include "core/cluster.h"

namespace pipegrid {

// `count` identical devices named <prefix>0, <prefix>1, ..., each with one link (bandwidth,
// latency, full duplex) to one switch named "switch". A transfer between two devices crosses two
// links: 2 x latency + bytes / bandwidth.
Cluster make_switch_cluster(int count, const std::string& prefix, const DeviceSpec& device, double bandwidth,
                            double latency);

}  // namespace pipegrid
