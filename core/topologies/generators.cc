#include "core/topologies/generators.h"

namespace pipegrid {

Cluster make_switch_cluster(int count, const std::string& prefix, const DeviceSpec& device, double bandwidth,
                            double latency) {
  Cluster c;
  c.name = "switch";
  for (int i = 0; i < count; ++i) c.devices.push_back({prefix + std::to_string(i), device, ""});
  c.switches.push_back("switch");
  for (int i = 0; i < count; ++i) c.links.push_back({i, count, bandwidth, latency, Duplex::Full});
  return c;
}

}  // namespace pipegrid
