#include "core/device.h"

#include <fmt/format.h>

#include <algorithm>

namespace pipegrid {

void DeviceSpec::derive_peaks() {
  if (!fpga) return;
  for (int p = 0; p < kPrecisionCount; ++p) peak_flops[p] = fpga->peak(static_cast<Precision>(p));
}

Result<PassTimes> layer_times(const Layer& layer, Precision precision, const DeviceSpec& device,
                              double batch) {
  PassTimes t;
  if (layer.measured && (layer.measured->device_kind.empty() || layer.measured->device_kind == device.kind)) {
    const MeasuredCost& m = *layer.measured;
    const double scale = batch / m.batch;
    t.forward = m.forward_s * scale;
    t.backward_weight = m.backward_weight_s * scale;
    t.backward_input = (m.backward_s - m.backward_weight_s) * scale;
    return t;
  }
  const double peak = device.peak(precision) * device.efficiency;
  const bool has_flops =
      layer.forward_flops > 0 || layer.backward_input_flops > 0 || layer.backward_weight_flops > 0;
  const bool has_bytes = layer.forward_bytes > 0 || layer.backward_bytes > 0 || layer.weight_bytes > 0;
  // A measured layer with no work description cannot be costed elsewhere: never call it free.
  if (layer.measured && !has_flops && !has_bytes &&
      (layer.measured->forward_s > 0 || layer.measured->backward_s > 0))
    return Error{fmt::format(
        "layer \"{}\" was measured on device kind \"{}\" and has no FLOP or byte counts to cost it on \"{}\"",
        layer.name, layer.measured->device_kind, device.kind)};
  if (has_flops && peak <= 0) {
    if (layer.measured)
      return Error{
          fmt::format("layer \"{}\" was measured on \"{}\" and the device kind \"{}\" has no {} compute rate",
                      layer.name, layer.measured->device_kind, device.kind, to_string(precision))};
    return Error{fmt::format("device kind \"{}\" has no {} compute rate for layer \"{}\"", device.kind,
                             to_string(precision), layer.name)};
  }
  const double bw = device.memory_bandwidth;
  // A pass that computes touches the weights (or writes their gradient) once, whatever the batch.
  auto pass_time = [&](double flops, double bytes) {
    const double fixed = flops > 0 ? layer.weight_bytes : 0.0;
    if (flops <= 0 && bytes <= 0) return 0.0;
    double compute = flops > 0 ? flops * batch / peak : 0.0;
    double memory = (bytes > 0 || fixed > 0) && bw > 0 ? (bytes * batch + fixed) / bw : 0.0;
    return std::max(compute, memory) + device.layer_overhead_s;
  };
  // The backward's memory traffic is split between its two parts in proportion to their FLOPs.
  const double bflops = layer.backward_input_flops + layer.backward_weight_flops;
  const double in_share = bflops > 0 ? layer.backward_input_flops / bflops : 1.0;
  t.forward = pass_time(layer.forward_flops, layer.forward_bytes);
  t.backward_input = pass_time(layer.backward_input_flops, layer.backward_bytes * in_share);
  t.backward_weight = pass_time(layer.backward_weight_flops, layer.backward_bytes * (1 - in_share));
  return t;
}

}  // namespace pipegrid
