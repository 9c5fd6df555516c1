// Devices in input files, and the built-in device catalog (topologies/devices.yaml, compiled in).
//
// A device is written either as a catalog name (`device: a100`) or as a mapping whose keys
// override a catalog entry named by `model` (or describe a custom device without `model`):
//   device: {model: a100, memory: 40GB}
//   device: {memory: 16GiB, flops: 100TFLOPS}
// Spec keys: model, memory, memory_bandwidth, flops (every precision), peak ({fp32: ..., fp16: ...}),
// efficiency (every precision and kernel class), compute_efficiency ({amp: {gemm: 0.6, ...}, ...}:
// per arithmetic precision and compute kernel class), memory_efficiency (a fraction, or per kernel
// class), kernel_startup (Hockney's t0 per kernel call), kernel_dispatch (host time per kernel call,
// overlapped with the GPU: a call takes at least this), layer_overhead, winograd (math precisions
// whose 3x3 stride-1 convolutions run as Winograd F(2x2, 3x3): [fp32]), and for FPGAs dsps, clock,
// macs_per_dsp ({fp32: 0.2, ...}), onchip_memory, ports, port_bandwidth: the peak is then derived (DSPs x
// clock x MACs x 2) unless `peak`/`flops` is given too. "A U280 with twice the DSPs": {model: u280, dsps:
// 18048}.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"
#include "tools/input/yaml_node.h"

namespace pipegrid::input {

struct CatalogDevice {
  std::string name;    // catalog key, e.g. "a100"
  std::string family;  // "gpu" or "fpga"
  std::string description;
  std::string source;
  DeviceSpec spec;       // spec.kind == name
  std::string alias_of;  // the earlier entry this one is a YAML alias of (`a100`: "a100-80gb"), or ""
};

// Parsed once, on first use. Precondition: the compiled-in catalog is valid (tested).
const std::vector<CatalogDevice>& device_catalog();
const CatalogDevice* find_catalog_device(std::string_view name);
// The catalog's names of one device: `name` and its aliases (`a100` and `a100-80gb`), or {name}
// when the catalog has no such entry.
std::vector<std::string> device_names_alike(std::string_view name);
// Why `kind` cannot be the device kind a profile was measured on ("" when it can: a catalog name,
// "custom" or "any"), with a did-you-mean: shared by the experiment's `device:` key and
// `workload show --profile-device`.
std::string profile_device_kind_problem(std::string_view kind);

// A key of a catalog entry as written in topologies/devices.yaml (`dsps` of `u280`: 9024), or an
// undefined node.
YAML::Node catalog_value(std::string_view device, std::string_view key);

// The spec keys above plus `extra_keys`, which the caller reads itself (e.g. "name").
DeviceSpec parse_device_spec(const Node& n, const std::vector<std::string_view>& extra_keys = {});

}  // namespace pipegrid::input
