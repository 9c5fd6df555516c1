// Devices and the per-layer cost model.
#pragma once

#include <array>
#include <optional>
#include <string>

#include "core/result.h"
#include "core/workload.h"

namespace pipegrid {

// An FPGA as a hardware designer describes it; pipegrid derives its peak compute from it:
// peak(precision) = DSPs x clock x MACs per DSP per cycle (precision) x 2 FLOP.
struct FpgaSpec {
  double dsps = 0;
  double clock_hz = 0;
  std::array<double, kPrecisionCount> macs_per_dsp{};  // per cycle, per Precision
  double onchip_bytes = 0;                             // BRAM + URAM (M20K), informational
  int ports = 0;                                       // network ports (QSFP28)
  double port_bandwidth = 0;                           // bytes/s per port and direction

  double peak(Precision p) const { return dsps * clock_hz * macs_per_dsp[static_cast<int>(p)] * 2; }
};

// What a device can do. Every figure can be overridden by the user; catalog entries cite sources.
struct DeviceSpec {
  std::string kind = "custom";                       // catalog name, or "custom"
  std::string family;                                // "gpu", "fpga", or empty for custom devices
  double memory_bytes = 0;                           // capacity
  double memory_bandwidth = 0;                       // bytes/s; 0 = never the limit
  std::array<double, kPrecisionCount> peak_flops{};  // FLOP/s per Precision; 0 = unknown
  double efficiency = 1.0;      // sustained fraction of peak for compute-bound layers, in (0, 1]
  double layer_overhead_s = 0;  // fixed cost per layer and pass (kernel launches, pipeline fill)

  std::optional<FpgaSpec> fpga;  // set for FPGAs: peak_flops is derived from it

  double peak(Precision p) const { return peak_flops[static_cast<int>(p)]; }
  // For FPGAs: peak_flops = fpga->peak(precision) for every precision.
  void derive_peaks();
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
//   time(pass) = max(flops(pass) * batch / (peak * efficiency),
//                    (bytes(pass) * batch + weight_bytes) / memory_bandwidth) + layer_overhead
// for every pass that has work, weight_bytes counted for passes with FLOPs (the roofline: small
// batches of dense layers are bound by reading the weights once per micro-batch).
// Fails if neither applies (no measured time for this device and no compute rate for the precision).
Result<PassTimes> layer_times(const Layer& layer, Precision precision, const DeviceSpec& device,
                              double batch);

}  // namespace pipegrid
