// Devices and the per-layer cost model.
#pragma once

#include <algorithm>
#include <array>
#include <optional>
#include <string>

#include "core/memory.h"
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
//
// The compute model per kernel call (Hockney's two-parameter model, r_inf and n_1/2: R. W. Hockney,
// "The n_1/2 method of algorithm analysis", 1983; Hockney & Jesshope, "Parallel Computers 2", 1988):
// a call doing W FLOPs runs at r(W) = r_inf W / (W + n_1/2) with r_inf = peak x efficiency and
// n_1/2 = r_inf x kernel_startup, i.e. it takes kernel_startup + W / r_inf: small GEMMs and
// convolutions reach a smaller fraction of peak than large ones. Memory traffic runs at the
// memory bandwidth times a memory efficiency; a call takes the startup plus the larger of the two
// (roofline), memory-bound calls included (every launch pays it).
//
// The host issues kernels asynchronously: a framework spends kernel_dispatch on the CPU per launch
// (its op dispatch and the CUDA launch call), which overlaps the GPU's work on earlier launches, in
// order (HostStream): short kernels after long ones run on the lead the host gained, a stream of
// short kernels at the host's rate (0, the default, is a host that is never the limit).
// Winograd F(2x2, 3x3): (2 + 3 - 1)^2 = 16 multiplies per 2x2 output tile against 2^2 x 3^2 = 36.
inline constexpr double kWinogradSpeedup = 36.0 / 16.0;

struct DeviceSpec {
  std::string kind = "custom";  // catalog name, or "custom"
  std::string family;           // "gpu", "fpga", or empty for custom devices
  double memory_bytes = 0;      // capacity
  // What the framework's own state takes before the model's first byte (CUDA context, NCCL buffers,
  // allocator fragmentation): not available to weights, activations or workspace. Set by the CLI's
  // loader (default_memory_reserve, or memory.reserve / --memory-margin); 0 where a cluster is built
  // in code.
  double memory_reserve_bytes = 0;
  double memory_bandwidth = 0;                       // bytes/s; 0 = never the limit
  std::array<double, kPrecisionCount> peak_flops{};  // FLOP/s per arithmetic Precision; 0 = unknown
  // Sustained fraction of peak for compute-bound kernels, in (0, 1]: the default for every
  // precision and kernel class without an entry in `compute_efficiency`.
  double efficiency = 1.0;
  // r_inf / peak per arithmetic precision (kMathPrecisions) and kernel class; 0 = `efficiency`.
  std::array<std::array<double, kKernelClassCount>, kPrecisionCount> compute_efficiency{};
  // Achieved fraction of memory_bandwidth per kernel class; 0 = `memory_efficiency_default`.
  double memory_efficiency_default = 1.0;
  std::array<double, kKernelClassCount> memory_efficiency{};
  double kernel_startup_s = 0;  // Hockney's t0 = n_1/2 / r_inf, paid by every kernel call
  // The start-up of one kernel class where it differs from kernel_startup_s; < 0 = kernel_startup_s.
  std::array<double, kKernelClassCount> kernel_startup_class = unset_per_class();
  double kernel_dispatch_s = 0;  // host time per kernel launch, ahead of the GPU (HostStream)
  // The host's time per launch of one kernel class where it differs from kernel_dispatch_s (< 0:
  // kernel_dispatch_s), e.g. Transformer Engine's grouped linear, whose every per-expert GEMM costs the
  // host its module's work besides the launch.
  std::array<double, kKernelClassCount> kernel_dispatch_class = unset_per_class();
  double layer_overhead_s = 0;  // fixed cost per layer and pass (framework, pipeline fill)
  // Time per time step of a recurrent layer, per direction and pass, on top of the step's kernels
  // (Kernel::recurrent_step), per math precision (kMathPrecisions; 0 = none): what the RNN library
  // spends per step beyond the roofline of its per-step GEMM and gate kernels. Measured, never
  // fitted: the V100's is DeepBench's cuDNN LSTM against those kernels (topologies/devices.yaml).
  std::array<double, kPrecisionCount> recurrent_step_s{};
  // Math precisions (kMathPrecisions) in which the device's convolution library runs 3x3 stride-1
  // convolutions (Kernel::winograd) as Winograd F(2x2, 3x3): such a call does 1/kWinogradSpeedup of
  // its direct FLOPs. cuDNN has Winograd algorithms for all three passes (forward, backward data,
  // backward filter); on tensor cores it runs implicit GEMM instead.
  std::array<bool, kPrecisionCount> winograd{};
  // Tensor cores with microscaling (MXFP8's one E8M0 scale per 32 values in the GEMM itself): what
  // Transformer Engine's MXFP8BlockScaling recipe needs (Blackwell data-centre parts, compute
  // capability 10.x; its support matrix). An mxfp8 training elsewhere is refused.
  bool microscaling = false;

  std::optional<FpgaSpec> fpga;  // set for FPGAs: peak_flops is derived from it

  // The arithmetic format the precision's math runs in here (amp: fp16; tf32 without a tf32 rate:
  // fp32), which keys the figures below.
  Precision runs_as(Precision p) const;
  // The peak rate the precision's math runs at.
  double peak(Precision p) const;
  double compute_eff(Precision p, KernelClass k) const;
  bool runs_winograd(Precision p) const;  // in p's math precision (tf32 without a rate: fp32's)
  double memory_eff(KernelClass k) const;
  double startup(KernelClass k) const;   // kernel_startup_class's entry, or kernel_startup_s
  double dispatch(KernelClass k) const;  // kernel_dispatch_class's entry, or kernel_dispatch_s
  bool host_bound() const;               // any launch costs the host time (HostStream applies)
  void set_startup(double s) {           // one start-up for every class
    kernel_startup_s = s;
    kernel_startup_class = unset_per_class();
  }
  static constexpr std::array<double, kKernelClassCount> unset_per_class() {
    std::array<double, kKernelClassCount> a{};
    for (double& v : a) v = -1;
    return a;
  }
  double recurrent_step(Precision p) const;  // recurrent_step_s in p's math precision
  // For FPGAs: peak_flops = fpga->peak(precision) for every precision.
  void derive_peaks();
  // The bytes a plan may use: memory_bytes - memory_reserve_bytes. Every feasibility check uses it.
  double usable_memory() const { return memory_bytes - memory_reserve_bytes; }
};

// The default reserve of a device (docs/memory.md, "Memory reserve"). GPUs: kGpuReserveFixedBytes
// (the CUDA context, 287 MB measured with lazy loading in pytorch/pytorch#86509; NCCL's buffers,
// NCCL_BUFFSIZE's default 4 MiB per channel and peer for each communicator, NCCL docs "Environment
// Variables") plus kGpuReserveFraction of memory_bytes for the caching allocator's fragmentation (an
// assumption: PyTorch documents fragmentation, not its size). Other devices: 0.
inline constexpr double kGpuReserveFixedBytes = 1024.0 * 1024 * 1024;
inline constexpr double kGpuReserveFraction = 0.05;
double default_memory_reserve(const DeviceSpec& spec);

struct Device {
  std::string name;
  DeviceSpec spec;
  std::string node;  // machine the device sits in (for hierarchical collectives); may be empty
  // A straggler (an experiment's faults.slow_devices): every compute task on the device takes this
  // many times as long, whatever its kernels (compute and memory alike); 1 healthy.
  double slowdown = 1;
};

// Seconds one layer takes for `batch` samples, per pass.
struct PassTimes {
  double forward = 0;
  double backward_input = 0;   // input-gradient part of the backward
  double backward_weight = 0;  // weight-gradient part of the backward
  // Of forward and of backward, what a bound host added beyond the device's own sum of its kernels (0
  // when the host is never the limit): how much of the answer the host's per-launch figure carries.
  double host_forward_s = 0, host_backward_s = 0;
  double backward() const { return backward_input + backward_weight; }
};

// One pass's kernel launches, issued by the host one after another at `dispatch` each (a framework's
// op dispatch and the CUDA launch, overlapping the GPU's work) and run by the GPU in order, each once
// it is issued and the one before it has finished (one stream). A pass starts with its first launch
// issued (the host issued it while the task before ran) and nothing queued: launch j (0-based) is
// issued at j x dispatch. A group of c launches of equal device time tau ends at
//   max(max(gpu, host) + c tau, host + (c - 1) dispatch + tau)
// (the device-bound and the host-bound ends; `host` is when the group's first launch is issued,
// `gpu` when the device is free). So a pass whose every launch takes at least `dispatch` on the
// device costs the sum of its device times, a stream of tiny calls (c - 1) dispatch + tau, and long
// kernels give the host the lead it spends on short ones after them. Dispatch 0 is the sum.
class HostStream {
 public:
  // A group of `launches` of `dispatch` host time each.
  void issue(double launches, double device_time, double dispatch);
  double end() const { return gpu_; }
  // The host waits for the device (a device-to-host copy it needs: torch's `.cpu()`, an event's
  // synchronize): it issues nothing more before everything issued has run.
  void sync() { host_ = std::max(host_, gpu_); }

 private:
  double host_ = 0, gpu_ = 0;
};

// The cost model. If the layer has measured times that apply to this device (same kind, or no
// kind given), they are used, scaled linearly from the measured batch to `batch`. Otherwise each
// pass adds up its kernels (layer.kernels, or one kernel of the layer kind's class built from the
// layer's totals), each call of a kernel taking on the device
//   kernel_startup + max(flops / (peak(math precision) x compute_eff(precision, class)),
//                        (bytes + weight_bytes) / (memory_bandwidth x memory_eff(class)))
// (a recurrent layer's per-step kernel adding recurrent_step(precision)), with flops and bytes for
// the batch split over the kernel's calls (a Winograd-eligible convolution's flops divided by
// kWinogradSpeedup where the device runs Winograd in the precision), plus layer_overhead once per
// pass that has work. The host issues each call (or Kernel::launches on parallel streams, and an fp8
// GEMM's quantization kernels first: fp8_quantize_kernels per call, per expert of a grouped GEMM, or
// once where Kernel::grouped_quantize, at the element-wise class's dispatch, each kernel a start-up on
// the device) at kernel_dispatch per launch, in order, ahead of the device: HostStream
// (the forward in the layer's kernel order, the backward in reverse). The backward's streamed bytes
// are split between its input-gradient and weight-gradient parts in proportion to their FLOPs, and a
// host-bound backward between them in proportion to their device times. Fails if neither applies (no
// measured time for this device and no compute rate for the precision).
Result<PassTimes> layer_times(const Layer& layer, Precision precision, const DeviceSpec& device,
                              double batch);

// The host's two streams carried from one layer (or piece of a layer) to the next in a pass: the host
// runs ahead of the device across layers until it synchronises (HostStream::sync), so the lead a
// device-bound layer gives it is spent on the host-bound layers after it. What runs between two
// carried calls on the device and not on the host (a collective, a wait for another stage) is not
// in the streams: it would only lengthen the lead, so a carried pass is never shorter than the
// device's sum and never longer than the same layers each started afresh plus their host lag.
struct HostCarry {
  HostStream forward, backward;  // the forward in the layers' order, the backward in reverse
};
// As above, with the host's state carried in from the layers before (and out to those after): the
// times returned are what this layer adds to each pass's end. A measured layer takes its time on the
// device with no launches.
Result<PassTimes> layer_times(const Layer& layer, Precision precision, const DeviceSpec& device, double batch,
                              HostCarry& carry);

// Bytes one optimizer step reads and writes per parameter. Fused (one element-wise pass): SGD reads
// the weights and gradients and writes the weights; momentum and Adam also read and write one and
// two state tensors; mixed precision keeps the state and fp32 master weights at 4 bytes and writes
// the half-precision working weights too. Unfused (torch.optim's loop, PyTorch 1.x, no weight
// decay), in passes over a tensor of the state's element size: SGD `p.add_(g)` 3; momentum
// `buf.mul_().add_(g)`, `p.add_(buf)` 2 + 3 + 3 = 8; Adam `m.mul_().add_(g)` 2 + 3,
// `v.mul_().addcmul_(g, g)` 2 + 4, `denom = v.sqrt() / c + eps` 2 + 2 + 2, `p.addcdiv_(m, denom)` 4:
// 21. Mixed precision adds the copies around it: fp16 gradients to fp32 (2 + 4 bytes) and the
// fp32 master weights back to fp16 (4 + 2).
// `passes` > 0 replaces the unfused count (a script's own loop, counted the same way).
double optimizer_step_bytes_per_parameter(Optimizer o, Precision p,
                                          OptimizerKernels k = OptimizerKernels::Fused, int passes = 0);
// Seconds one optimizer step takes for `parameters` on the device (memory-bound).
double optimizer_step_time(double parameters, Optimizer o, Precision p, const DeviceSpec& device,
                           OptimizerKernels k = OptimizerKernels::Fused, int passes = 0);
// The same, as the memory options say the step runs (optimizer, kernels, passes), a fused step's
// state tensors at MemoryOptions::moment_bytes, its master weights at master_bytes and its gradient
// at gradient_bytes where set.
double optimizer_step_bytes_per_parameter(const MemoryOptions& m, Precision p);
double optimizer_step_time(double parameters, const MemoryOptions& m, Precision p, const DeviceSpec& device);

// On one of a cluster's devices, as the lowering runs it: a layer's times, and an optimizer step of
// `parameters` (the workload's optimizer_step_s where given), each Device::slowdown times as long (a
// fault's straggler). The planners and partitioners that cost each device search with these, so a
// straggler is in their estimate as it is in the replay.
Result<PassTimes> device_layer_times(const Layer& layer, Precision precision, const Device& device,
                                     double batch);
double device_step_time(const Workload& w, double parameters, const MemoryOptions& m, const Device& device);

// One micro-batch's gradient accumulation on a device holding `parameters` parameters in `tensors`
// tensors, under GradAccumulation g (core/memory.h): one element-wise kernel per tensor, each paying
// the element-wise start-up, reading the accumulator (`accumulator_bytes` per element; 0: the
// gradient's size, element_bytes(p)) and the new gradient (element_bytes(p)) and writing the
// accumulator, at the device's element-wise memory rate. 0 when fused.
double grad_accumulation_time(double parameters, double tensors, GradAccumulation g, Precision p,
                              double accumulator_bytes, const DeviceSpec& device);
// Whether the step's micro-batch `index` (0-based, per stage replica and model chunk) pays it:
// unfused from the second on, main-grad every one, fused none.
bool pays_grad_accumulation(GradAccumulation g, int index);

// Whether two devices cost alike for the planners that assume identical devices: the same catalog
// kind, memory and peak rates.
inline bool same_device(const DeviceSpec& a, const DeviceSpec& b) {
  return a.kind == b.kind && a.memory_bytes == b.memory_bytes && a.peak_flops == b.peak_flops;
}

}  // namespace pipegrid
