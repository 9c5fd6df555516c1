#include "core/device.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace pipegrid {

void DeviceSpec::derive_peaks() {
  if (!fpga) return;
  for (int p = 0; p < kPrecisionCount; ++p) peak_flops[p] = fpga->peak(static_cast<Precision>(p));
}

Precision DeviceSpec::runs_as(Precision p) const {
  const Precision m = math_precision(p);
  // A device without a TF32 rate runs TF32 as FP32: at FP32's rate, efficiency and algorithms.
  if (m == Precision::TF32 && peak_flops[static_cast<int>(Precision::TF32)] <= 0) return Precision::FP32;
  // A device without an FP8 rate runs an fp8 training's GEMMs in BF16.
  if (m == Precision::FP8 && peak_flops[static_cast<int>(Precision::FP8)] <= 0) return Precision::BF16;
  return m;
}

double DeviceSpec::peak(Precision p) const {
  return peak_flops[static_cast<int>(runs_as(p))];
}

namespace {
// The element-wise kernels that take the device's element-wise figures where it has none of theirs.
bool follows_elementwise(KernelClass k) {
  return k == KernelClass::Strided || k == KernelClass::Compiled;
}
}  // namespace

double DeviceSpec::compute_eff(Precision p, KernelClass k) const {
  const double e = compute_efficiency[static_cast<int>(runs_as(p))][static_cast<int>(k)];
  if (e <= 0 && k == KernelClass::GroupedGemm) return compute_eff(p, KernelClass::Gemm);
  return e > 0 ? e : efficiency;
}

bool DeviceSpec::runs_winograd(Precision p) const {
  return winograd[static_cast<int>(runs_as(p))];
}

double DeviceSpec::recurrent_step(Precision p) const {
  return recurrent_step_s[static_cast<int>(runs_as(p))];
}

double default_memory_reserve(const DeviceSpec& spec) {
  return spec.family == "gpu" ? kGpuReserveFixedBytes + kGpuReserveFraction * spec.memory_bytes : 0;
}

double DeviceSpec::memory_eff(KernelClass k) const {
  const double e = memory_efficiency[static_cast<int>(k)];
  if (e <= 0 && k == KernelClass::GroupedGemm) return memory_eff(KernelClass::Gemm);
  if (e <= 0 && follows_elementwise(k)) return memory_eff(KernelClass::Elementwise);
  return e > 0 ? e : memory_efficiency_default;
}

double DeviceSpec::startup(KernelClass k) const {
  const double s = kernel_startup_class[static_cast<int>(k)];
  if (s < 0 && k == KernelClass::GroupedGemm) return startup(KernelClass::Gemm);
  if (s < 0 && follows_elementwise(k)) return startup(KernelClass::Elementwise);
  return s >= 0 ? s : kernel_startup_s;
}

double DeviceSpec::dispatch(KernelClass k) const {
  const double s = kernel_dispatch_class[static_cast<int>(k)];
  if (s < 0 && follows_elementwise(k)) return dispatch(KernelClass::Elementwise);
  return s >= 0 ? s : kernel_dispatch_s;
}

bool DeviceSpec::host_bound() const {
  if (kernel_dispatch_s > 0) return true;
  for (double s : kernel_dispatch_class)
    if (s > 0) return true;
  return false;
}

void HostStream::issue(double launches, double device_time, double dispatch) {
  if (launches <= 0) return;
  const double first = std::max(gpu_, host_) + device_time;
  const double last = host_ + (launches - 1) * dispatch + device_time / launches;
  gpu_ = std::max(first, last);
  host_ += launches * dispatch;
}

namespace {

// A bound host's pass ends: the forward's, and the backward's split between its two parts in
// proportion to their device times.
void stretch(PassTimes& t, double forward, double backward) {
  t.forward = forward;
  if (const double device_backward = t.backward(); device_backward > 0) {
    t.backward_input = backward * (t.backward_input / device_backward);
    t.backward_weight = backward - t.backward_input;
  }
}

// One call of kernel k for the whole batch's share `flops`, `bytes`, its math in `math` (the
// workload's precision, or FP8 for an fp8 training's GEMMs) at `rate` of the device's figure for it
// (fp8_gemm_rate); its weights are read (or their gradient written) by every call of a pass that
// computes. Every launch pays the startup on the GPU. A recurrent layer's step also pays the
// library's per-step time, serially, on the GPU side. The host's dispatch is HostStream's.
double call_time(const DeviceSpec& device, const Kernel& k, double flops, double bytes, Precision math,
                 double rate) {
  const double weights = flops > 0 ? k.weight_bytes : 0.0;
  if (flops <= 0 && bytes <= 0) return 0.0;
  const double work = k.winograd && device.runs_winograd(math) ? flops / kWinogradSpeedup : flops;
  const double compute =
      flops > 0 ? work / (device.peak(math) * device.compute_eff(math, k.cls) * rate) : 0.0;
  const double bw = device.memory_bandwidth;
  const double memory =
      (bytes > 0 || weights > 0) && bw > 0 ? (bytes + weights) / (bw * device.memory_eff(k.cls)) : 0.0;
  const double step = k.recurrent_step && flops > 0 ? device.recurrent_step(math) : 0.0;
  return device.startup(k.cls) + step + std::max(compute, memory);
}

// layer_times, with the host's streams carried in `carry` (nullptr: each pass starts afresh). A host
// never the limit leaves the streams alone: every time is then the device's sum, carried or not.
Result<PassTimes> layer_times_on(const Layer& layer, Precision precision, const DeviceSpec& device,
                                 double batch, HostCarry* carry) {
  PassTimes t;
  if (layer.measured && (layer.measured->device_kind.empty() || layer.measured->device_kind == device.kind)) {
    const MeasuredCost& m = *layer.measured;
    const double scale = batch / m.batch;
    t.forward = m.forward_s * scale;
    t.backward_weight = m.backward_weight_s * scale;
    t.backward_input = (m.backward_s - m.backward_weight_s) * scale;
    if (carry) {  // device time with no launches: the host's lead grows by it
      carry->forward.issue(1, t.forward, 0);
      carry->backward.issue(1, t.backward(), 0);
    }
    return t;
  }
  const double peak = device.peak(precision);
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
                             to_string(math_precision(precision)), layer.name)};
  }
  const double bw = device.memory_bandwidth;
  // An fp8 training runs a linear layer's GEMMs at the FP8 rate (where the device has one; MXFP8's at
  // fp8_gemm_rate of it), each after one memory-bound pass that quantizes its input (forward) or its
  // output gradient (backward, before the input-gradient GEMM; the weight-gradient GEMM reuses both),
  // fp8_cast_bytes per element.
  const bool fp8 = fp8_training(precision) && device.runs_as(Precision::FP8) == Precision::FP8;
  // A pass of kernel k: its device time and its host launches (a call is one launch, or
  // Kernel::launches on parallel streams), with an fp8 GEMM's quantization of its input (or output
  // gradient): fp8_quantize_kernels each, per call, or per launch where the call is several (a
  // grouped GEMM's input is quantized per expert: Transformer Engine's split_quantize, one
  // quantization per split, v2.9 to v2.16; once where Kernel::grouped_quantize).
  struct Launches {
    double device = 0, launches = 0, dispatch = 0;  // dispatch: host time per launch
    double quantize = 0, quantize_launches = 0;     // of which the fp8 quantization's (element-wise)
  };
  // The host issues a pass's quantization kernels (at the element-wise class's dispatch), then the rest.
  auto issue = [&](HostStream& s, const Launches& l) {
    s.issue(l.quantize_launches, l.quantize, device.dispatch(KernelClass::Elementwise));
    s.issue(l.launches - l.quantize_launches, l.device - l.quantize, l.dispatch);
  };
  auto pass_time = [&](const Kernel& k, double flops, double bytes, double cast) -> Launches {
    if (flops <= 0 && bytes <= 0) return {};
    const double calls = std::max(1.0, k.calls);
    const bool fp8_math = fp8 && k.fp8;
    const Precision math = fp8_math ? Precision::FP8 : precision;
    const double gemm_launches = k.launches > 0 ? k.launches : calls;
    const double quantizations = k.launches > 0 && k.grouped_quantize ? 1 : gemm_launches;
    const double quantize_kernels =
        fp8_math && cast > 0 && bw > 0 ? quantizations * fp8_quantize_kernels(precision) : 0.0;
    const double quantize = quantize_kernels > 0
                                ? quantize_kernels * device.startup(KernelClass::Elementwise) +
                                      cast * batch * fp8_cast_bytes(precision) /
                                          (bw * device.memory_eff(KernelClass::Elementwise))
                                : 0.0;
    const double rate = fp8_math ? fp8_gemm_rate(precision) : 1.0;
    return {calls * call_time(device, k, flops * batch / calls, bytes * batch / calls, math, rate) + quantize,
            gemm_launches + quantize_kernels, device.dispatch(k.cls), quantize, quantize_kernels};
  };
  // The device sums in the layer's order (what a host that is never the limit gives, to the last
  // bit); a bound host issues the forward's launches in that order, the backward's in reverse, each
  // part of a kernel's backward (input gradient, then weight gradient) its own launches.
  const bool host = device.host_bound();
  HostStream fresh_forward, fresh_backward;
  HostStream& forward = carry ? carry->forward : fresh_forward;
  HostStream& backward = carry ? carry->backward : fresh_backward;
  const double forward_start = forward.end(), backward_start = backward.end();
  std::vector<std::pair<Launches, Launches>> backward_parts;
  for (const Kernel& k : layer_kernels(layer)) {
    const Launches f = pass_time(k, k.forward_flops, k.forward_bytes, k.fp8_in);
    t.forward += f.device;
    // The backward's memory traffic is split between its two parts in proportion to their FLOPs.
    const double bflops = k.backward_input_flops + k.backward_weight_flops;
    const double in_share = bflops > 0 ? k.backward_input_flops / bflops : 1.0;
    const Launches i = pass_time(k, k.backward_input_flops, k.backward_bytes * in_share, k.fp8_out);
    const Launches w = pass_time(k, k.backward_weight_flops, k.backward_bytes * (1 - in_share), 0);
    t.backward_input += i.device;
    t.backward_weight += w.device;
    if (host) {
      issue(forward, f);
      backward_parts.emplace_back(i, w);
    }
  }
  if (host) {  // a bound host stretches each pass (stretch)
    for (auto p = backward_parts.rbegin(); p != backward_parts.rend(); ++p) {
      issue(backward, p->first);
      issue(backward, p->second);
    }
    const double device_forward = t.forward, device_backward = t.backward();
    stretch(t, forward.end() - forward_start, backward.end() - backward_start);
    t.host_forward_s = std::max(0.0, t.forward - device_forward);
    t.host_backward_s = std::max(0.0, t.backward() - device_backward);
  }
  if (t.forward > 0) t.forward += device.layer_overhead_s;
  if (t.backward_input > 0) t.backward_input += device.layer_overhead_s;
  if (t.backward_weight > 0) t.backward_weight += device.layer_overhead_s;
  return t;
}

}  // namespace

Result<PassTimes> layer_times(const Layer& layer, Precision precision, const DeviceSpec& device,
                              double batch) {
  return layer_times_on(layer, precision, device, batch, nullptr);
}

Result<PassTimes> layer_times(const Layer& layer, Precision precision, const DeviceSpec& device, double batch,
                              HostCarry& carry) {
  return layer_times_on(layer, precision, device, batch, &carry);
}

double optimizer_step_bytes_per_parameter(Optimizer o, Precision p, OptimizerKernels k, int passes) {
  const bool mixed = mixed_precision(p) || o == Optimizer::MixedAdam;
  if (k == OptimizerKernels::Unfused) {
    if (passes <= 0) passes = o == Optimizer::SGD ? 3 : o == Optimizer::Momentum ? 8 : 21;
    if (mixed) return 4.0 * passes + (2 + 4) + (4 + 2);
    return element_bytes(p) * passes;
  }
  // Besides the gradient (read) and the weights (read and written), each state tensor is read and
  // written.
  const int state = optimizer_state_tensors(o);
  if (mixed) return 2 /* gradient */ + 2 * 4 /* master */ + 2 * 4 * state + 2 /* working weights */;
  return element_bytes(p) * (3 + 2 * state);
}

namespace {

// A memory-bound step moving `bytes` per parameter over `parameters`.
double step_seconds(double parameters, double bytes, const DeviceSpec& device) {
  if (parameters <= 0 || device.memory_bandwidth <= 0) return 0;
  return parameters * bytes / (device.memory_bandwidth * device.memory_eff(KernelClass::Elementwise));
}

}  // namespace

double optimizer_step_time(double parameters, Optimizer o, Precision p, const DeviceSpec& device,
                           OptimizerKernels k, int passes) {
  return step_seconds(parameters, optimizer_step_bytes_per_parameter(o, p, k, passes), device);
}

double optimizer_step_bytes_per_parameter(const MemoryOptions& m, Precision p) {
  double bytes = optimizer_step_bytes_per_parameter(m.optimizer, p, m.optimizer_kernels, m.optimizer_passes);
  if (m.optimizer_kernels == OptimizerKernels::Unfused) return bytes;
  // A fused step reads the gradient once and reads and writes each state tensor once: at the
  // moments' and the gradient buffer's own precisions where they differ from the defaults above.
  const bool mixed = mixed_precision(p) || m.optimizer == Optimizer::MixedAdam;
  const double state = 2.0 * optimizer_state_tensors(m.optimizer);  // each read and written
  const double default_state = mixed ? 4 : element_bytes(p), default_gradient = mixed ? 2 : element_bytes(p);
  if (m.moment_bytes > 0) bytes += state * (m.moment_bytes - default_state);
  if (mixed && m.master_bytes > 0) bytes += 2 * (m.master_bytes - 4);  // read and written
  if (m.gradient_bytes > default_gradient) bytes += m.gradient_bytes - default_gradient;
  return bytes;
}

double optimizer_step_time(double parameters, const MemoryOptions& m, Precision p, const DeviceSpec& device) {
  return step_seconds(parameters, optimizer_step_bytes_per_parameter(m, p), device);
}

Result<PassTimes> device_layer_times(const Layer& layer, Precision precision, const Device& device,
                                     double batch) {
  Result<PassTimes> t = layer_times(layer, precision, device.spec, batch);
  if (t && device.slowdown != 1)
    for (double* x :
         {&t->forward, &t->backward_input, &t->backward_weight, &t->host_forward_s, &t->host_backward_s})
      *x *= device.slowdown;
  return t;
}

double device_step_time(const Workload& w, double parameters, const MemoryOptions& m, const Device& device) {
  const double step = w.optimizer_step_s >= 0 ? w.optimizer_step_s
                                              : optimizer_step_time(parameters, m, w.precision, device.spec);
  return step * device.slowdown;
}

double grad_accumulation_time(double parameters, double tensors, GradAccumulation g, Precision p,
                              double accumulator_bytes, const DeviceSpec& device) {
  if (g == GradAccumulation::Fused || parameters <= 0) return 0;
  const double eb = element_bytes(p);
  const double acc = accumulator_bytes > 0 ? accumulator_bytes : eb;
  const double bw = device.memory_bandwidth * device.memory_eff(KernelClass::Elementwise);
  const double memory = bw > 0 ? parameters * (2 * acc + eb) / bw : 0.0;
  return std::max(1.0, tensors) * device.startup(KernelClass::Elementwise) + memory;
}

bool pays_grad_accumulation(GradAccumulation g, int index) {
  return g == GradAccumulation::MainGrad || (g == GradAccumulation::Unfused && index > 0);
}

}  // namespace pipegrid
