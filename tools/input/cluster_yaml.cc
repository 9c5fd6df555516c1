#include "tools/input/cluster_yaml.h"

#include "core/topologies/generators.h"
#include "tools/input/device_yaml.h"

namespace pipegrid::input {
namespace {

// `count` identical devices behind one switch; devices named <device.name><index>.
Cluster parse_switch(const Node& n) {
  n.check_keys({"kind", "count", "device", "bandwidth", "latency"});
  int count = static_cast<int>(n.need("count", "a positive integer").integer(1, kMaxCount, "a positive integer"));
  Node dev = n.need("device", "a mapping with the device's name and memory");
  dev.require_map("a mapping with the device's name and memory");
  std::string name = dev.need("name", "a device name").string("a device name");
  DeviceSpec spec = parse_device_spec(dev, {"name"});
  double bw = n.need("bandwidth", describe(Dimension::Bandwidth, "positive")).quantity(Dimension::Bandwidth, Sign::Positive);
  double lat = n.need("latency", describe(Dimension::Time, "non-negative")).quantity(Dimension::Time, Sign::NonNegative);
  return make_switch_cluster(count, name, spec, bw, lat);
}

}  // namespace

Cluster parse_cluster(const Node& n) {
  n.require_map("a mapping describing the cluster");
  n.need("kind", "a cluster kind (switch)").choice({"switch"}, "a cluster kind");
  return parse_switch(n);
}

}  // namespace pipegrid::input
