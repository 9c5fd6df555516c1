// Devices summarised by role, so that what run and plan print stays readable from 1 to 100k devices
// (issue 52, item 3): ranges of names instead of lists, one row per group of devices that do the
// same work, the outliers named.
#pragma once

#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/metrics.h"
#include "core/partition.h"

namespace pipegrid::output {

// Names compressed into ranges, in the given order: consecutive names with the same prefix and
// consecutive trailing numbers become one range ("gpu0-7"; "v100-0..3" where the prefix ends in '-'
// or '.'), ranges joined by ", ". With max_parts > 0 and more ranges than that, the first
// max_parts - 1 and the last are shown: "gpu0-7, gpu64-71, ..., gpu960-967 (128 ranges)".
std::string name_ranges(const std::vector<std::string>& names, size_t max_parts = 0);

// name_ranges of the cluster's devices at these indices.
std::string device_ranges(const Cluster& c, const std::vector<int>& devices, size_t max_parts = 0);

// Devices that do the same work: the same stages hosted, the same device model and capacity.
struct DeviceGroup {
  std::vector<int> devices;  // cluster indices, ascending
  std::vector<int> stages;   // the stages its devices host, ascending (empty: unused)
  int busiest = -1;          // its device with the most busy time (the first of equals)
  int most_memory = -1;      // its device with the highest peak memory (the first of equals)
};

// The groups, in the order of their first stage (the unused last). `m` holds one DeviceMetrics per cluster device.
std::vector<DeviceGroup> group_devices(const Cluster& c, const Partition& p, const Metrics& m);

// "stage 3", "stages 0, 8", "unused".
std::string group_role(const DeviceGroup& g);

// True when some group has more than one device (a grouped table says less than a per-device one).
bool any_grouped(const std::vector<DeviceGroup>& groups);

}  // namespace pipegrid::output
