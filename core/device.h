// Devices and the per-layer cost model.
#pragma once

#include <array>
#include <string>

#include "core/result.h"
#include "core/workload.h"

namespace pipegrid {

// What a device can do. Every figure can be overridden by the user; catalog entries cite sources.
struct DeviceSpec {
  std::string kind = "custom";  // catalog name, or "custom"
  double memory_bytes = 0;      // capacity
  double memory_bandwidth = 0;  // bytes/s; 0 = never the limit
  std::array<double, kPrecisionCount> peak_flops{};  // FLOP/s per Precision; 0 = unknown
  double efficiency = 1.0;      // sustained fraction of peak for compute-bound layers, in (0, 1]
  double layer_overhead_s = 0;  // fixed cost per layer and pass (kernel launches, pipeline fill)

  double peak(Precision p) const { return peak_flops[static_cast<int>(p)]; }
};

struct Device {
  std::string name;
  DeviceSpec spec;
  std::string node;  // machine the device sits in (for hierarchical collectives); may be empty
};

// Seconds one layer takes for `batch` samples, per pass.
struct PassTimes {
  double forward = 0;
  double backward_input = 0;   // input-gradient part of the backward
  double backward_weight = 0;  // weight-gradient part of the backward
  double backward() const { return backward_input + backward_weight; }
};

// The cost model. If the layer has measured times that apply to this device (same kind, or no
// kind given), they are used, scaled linearly from the measured batch to `batch`. Otherwise
//   time(pass) = max(flops(pass) * batch / (peak * efficiency), bytes(pass) * batch / memory_bandwidth)
//                + layer_overhead   (for every pass that has work)
// Fails if neither applies (no measured time for this device and no compute rate for the precision).
Result<PassTimes> layer_times(const Layer& layer, Precision precision, const DeviceSpec& device, double batch);

}  // namespace pipegrid
