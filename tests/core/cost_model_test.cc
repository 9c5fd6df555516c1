// The cost model by precision and kernel class (core/device.h), against hand computations.
#include <doctest/doctest.h>

#include "core/block_kernels.h"
#include "core/device.h"
#include "core/memory.h"
#include "core/models/builder.h"
#include "core/tensor_parallel.h"
#include "tests/support/approx.h"

using namespace pipegrid;

namespace {

// A GPU with round figures: 100 TFLOP/s fp16, 10 fp32, 50 tf32; 1 TB/s.
DeviceSpec gpu() {
  DeviceSpec d;
  d.kind = "round";
  d.memory_bytes = 80e9;
  d.memory_bandwidth = 1e12;
  d.peak_flops[static_cast<int>(Precision::FP32)] = 10e12;
  d.peak_flops[static_cast<int>(Precision::TF32)] = 50e12;
  d.peak_flops[static_cast<int>(Precision::FP16)] = 100e12;
  d.peak_flops[static_cast<int>(Precision::BF16)] = 100e12;
  return d;
}

DeviceSpec gpu_with_startup(double s) {
  DeviceSpec d = gpu();
  d.kernel_startup_s = s;
  return d;
}

// gpu() at half efficiency, memory traffic free, with a kernel start-up and a host that takes 20 us
// per launch (HostStream).
DeviceSpec launching_gpu(double startup) {
  DeviceSpec d = gpu();
  d.memory_bandwidth = 0;
  d.efficiency = 0.5;
  d.kernel_startup_s = startup;
  d.kernel_dispatch_s = 20e-6;
  return d;
}

double& eff(DeviceSpec& d, Precision p, KernelClass k) {
  return d.compute_efficiency[static_cast<int>(p)][static_cast<int>(k)];
}

}  // namespace

TEST_CASE("precisions: names, element sizes, the math they run in") {
  for (Precision p : kPrecisions) CHECK(parse_precision(to_string(p)) == p);
  CHECK(parse_precision("amp") == Precision::AMP);
  CHECK(parse_precision("amp-bf16") == Precision::AMP_BF16);
  CHECK(parse_precision("fp8") == Precision::AMP_FP8);  // the training, not the math format
  CHECK(!parse_precision("fp4"));
  CHECK(precision_choices() == "fp32, tf32, fp16, bf16, int8, amp, amp-bf16, fp8, fp8-blockwise or mxfp8");
  for (Precision p : {Precision::AMP_FP8, Precision::AMP_FP8_BLOCKWISE, Precision::AMP_MXFP8}) {
    CHECK(math_precision(p) == Precision::BF16);  // all but the linear layers' GEMMs
    CHECK(mixed_precision(p));                    // fp32 master weights and optimizer state
    CHECK(element_bytes(p) == 2);                 // bf16 activations and working weights
    CHECK(fp8_training(p));
  }
  CHECK(fp8_cast_bytes(Precision::AMP_FP8) == 5);  // amax read + read + 1-byte write
  CHECK(fp8_cast_bytes(Precision::AMP_FP8_BLOCKWISE) == 3);
  CHECK(fp8_cast_bytes(Precision::AMP_BF16) == 0);
  CHECK(element_bytes(Precision::TF32) == 4);  // stored as fp32
  CHECK(element_bytes(Precision::AMP) == 2);   // activations and working weights in fp16
  CHECK(math_precision(Precision::AMP) == Precision::FP16);
  CHECK(math_precision(Precision::AMP_BF16) == Precision::BF16);
  CHECK(mixed_precision(Precision::AMP));
  CHECK(!mixed_precision(Precision::FP16));
  DeviceSpec d = gpu();
  CHECK(d.peak(Precision::AMP) == 100e12);
  CHECK(d.peak(Precision::TF32) == 50e12);
  d.peak_flops[static_cast<int>(Precision::TF32)] = 0;  // a V100: no TF32, runs it as fp32
  CHECK(d.peak(Precision::TF32) == 10e12);
}

TEST_CASE("a GEMM's time: efficiency by precision and class, Hockney's startup, the roofline") {
  // fc 4096 -> 4096 without bias at batch 256, fp16 math: forward 2 x 256 x 4096^2 = 8.59 GFLOP;
  // weights 32 MiB; streamed 256 x (4096 + 4096) x 2 bytes = 4 MiB.
  ModelBuilder b("m", Precision::AMP);
  int x = b.input("x", {4096});
  int fc = *b.linear("fc", x, 4096, 4096, false);
  Workload w = b.finish();
  DeviceSpec d = gpu();
  d.efficiency = 0.9;                                // every other class
  eff(d, Precision::FP16, KernelClass::Gemm) = 0.6;  // amp's GEMMs
  d.kernel_startup_s = 4e-6;
  d.layer_overhead_s = 1e-6;
  const double flops = 2.0 * 256 * 4096 * 4096;
  PassTimes t = *layer_times(w.layer(fc), Precision::AMP, d, 256);
  // 4 us + max(compute 8.59e9 / (100e12 x 0.6) = 143.2 us, memory 37.7 MB / 1 TB/s = 37.7 us).
  CHECK(t.forward == pipegrid::testing::approx(4e-6 + flops / 60e12 + 1e-6));
  CHECK(t.backward_input == pipegrid::testing::approx(4e-6 + flops / 60e12 + 1e-6));
  CHECK(t.backward_weight == pipegrid::testing::approx(4e-6 + flops / 60e12 + 1e-6));
  // fp32 uses fp32's rate and, with no entry, `efficiency`: 8.59e9 / 9e12.
  PassTimes f32 = *layer_times(w.layer(fc), Precision::FP32, d, 256);
  CHECK(f32.forward == pipegrid::testing::approx(4e-6 + flops / 9e12 + 1e-6));
  // At batch 1 the weights dominate: 4 us + max((32 MiB + 16 KiB) / 1 TB/s, 0.56 us).
  PassTimes one = *layer_times(w.layer(fc), Precision::AMP, d, 1);
  const double weights = 4096.0 * 4096 * 2, streamed = (4096.0 + 4096) * 2;
  CHECK(one.forward == pipegrid::testing::approx(4e-6 + (weights + streamed) / 1e12 + 1e-6));
  // Memory efficiency scales the memory side only.
  d.memory_efficiency_default = 0.5;
  PassTimes half = *layer_times(w.layer(fc), Precision::AMP, d, 1);
  CHECK(half.forward == pipegrid::testing::approx(4e-6 + (weights + streamed) / 0.5e12 + 1e-6));
}

TEST_CASE("Hockney's n_1/2: a kernel of n_1/2 FLOPs runs at half of r_inf") {
  // r_inf = 100 TFLOP/s x 0.5 = 50 TFLOP/s, t0 = 10 us: n_1/2 = 500 MFLOP. A linear layer of
  // 2 x rows x 1000 x 1000 FLOP = 500 MFLOP needs rows = 250.
  ModelBuilder b("m", Precision::FP16);
  int x = b.input("x", {1000});
  int fc = *b.linear("fc", x, 1000, 1000, false);
  Workload w = b.finish();
  DeviceSpec d = gpu();
  d.memory_bandwidth = 0;  // never the limit
  d.efficiency = 0.5;
  d.kernel_startup_s = 10e-6;
  PassTimes t = *layer_times(w.layer(fc), Precision::FP16, d, 250);
  CHECK(t.forward == pipegrid::testing::approx(20e-6));  // 500 MFLOP at 25 TFLOP/s
  // Ten times the work reaches 10/11 of r_inf.
  PassTimes big = *layer_times(w.layer(fc), Precision::FP16, d, 2500);
  CHECK(5e9 / big.forward == pipegrid::testing::approx(50e12 * 10 / 11));
}

TEST_CASE("kernel start-up per class: a GEMM and an element-wise kernel each pay their class's") {
  // fc 1000 -> 1000 at 250 rows (500 MFLOP at r_inf 50 TFLOP/s: 10 us) and a ReLU on its 250 x 1000
  // fp16 output (read + write 2 x 500 KB = 1 MB at 1 TB/s: 1 us). One start-up of 10 us: 20 us and
  // 11 us. GEMMs at 4 us, element-wise kernels at 30 us: 14 us and 31 us; a scalar start-up given
  // afterwards (set_startup) is every class's again.
  ModelBuilder b("m", Precision::FP16);
  int x = b.input("x", {1000});
  int fc = *b.linear("fc", x, 1000, 1000, false);
  int relu = *b.elementwise("relu", "relu", fc);
  Workload w = b.finish();
  DeviceSpec d = gpu();
  d.efficiency = 0.5;
  d.set_startup(10e-6);
  const double gemm_memory = (1000.0 * 1000 + 250.0 * 2000) * 2 / 1e12;  // 3 us: under the compute's 10 us
  CHECK(gemm_memory < 10e-6);
  CHECK(layer_times(w.layer(fc), Precision::FP16, d, 250)->forward == pipegrid::testing::approx(20e-6));
  CHECK(layer_times(w.layer(relu), Precision::FP16, d, 250)->forward == pipegrid::testing::approx(11e-6));
  d.kernel_startup_class[static_cast<int>(KernelClass::Gemm)] = 4e-6;
  d.kernel_startup_class[static_cast<int>(KernelClass::Elementwise)] = 30e-6;
  CHECK(layer_times(w.layer(fc), Precision::FP16, d, 250)->forward == pipegrid::testing::approx(14e-6));
  CHECK(layer_times(w.layer(fc), Precision::FP16, d, 250)->backward_weight ==
        pipegrid::testing::approx(14e-6));
  CHECK(layer_times(w.layer(relu), Precision::FP16, d, 250)->forward == pipegrid::testing::approx(31e-6));
  CHECK(d.startup(KernelClass::GroupedGemm) == 4e-6);  // grouped GEMMs follow GEMMs unless set
  CHECK(d.startup(KernelClass::Norm) == 10e-6);        // unset classes: the device's figure
  d.set_startup(2e-6);
  CHECK(layer_times(w.layer(relu), Precision::FP16, d, 250)->forward == pipegrid::testing::approx(3e-6));
}

TEST_CASE("host dispatch overlaps the GPU: the host issues launches in order, ahead of the device") {
  // The same layer: r_inf 50 TFLOP/s, start-up 2 us, dispatch 20 us. At 25 rows the work is
  // 50 MFLOP = 1 us: 3 us on the GPU, its one launch issued before the pass starts (the host
  // issued it while the task before ran): 3 us. At 2,500 rows it is 100 us: 102 us. Never their sum.
  ModelBuilder b("m", Precision::FP16);
  int x = b.input("x", {1000});
  int fc = *b.linear("fc", x, 1000, 1000, false);
  Workload w = b.finish();
  DeviceSpec d = launching_gpu(2e-6);
  CHECK(layer_times(w.layer(fc), Precision::FP16, d, 25)->forward == pipegrid::testing::approx(3e-6));
  CHECK(layer_times(w.layer(fc), Precision::FP16, d, 2500)->forward == pipegrid::testing::approx(102e-6));
  // A stream of tiny calls runs at the host's rate: an LSTM of 10 steps makes 1 + 10 + 10 kernel
  // calls per forward (input GEMM, a GEMM and a gates kernel per step), each 2 us and a hair: the
  // last is issued 20 x 20 us after the first, then runs: 402 us (the measured stream of
  // experiments/kernels/dispatch.md: max(dispatch, GPU time) per call).
  ModelBuilder r("r", Precision::FP16);
  int in = r.input("x", {10, 8});
  int l = *r.lstm("lstm", {in}, 8, false);
  Workload rw = r.finish();
  const double lstm = layer_times(rw.layer(l), Precision::FP16, d, 1)->forward;
  CHECK(lstm >= 20 * 20e-6 + 2e-6);
  CHECK(lstm < 20 * 20e-6 + 2.01e-6);
  // Without dispatch (0, the default) the start-up + work form is unchanged: 21 x (2 us + tiny).
  d.kernel_dispatch_s = 0;
  const double no_dispatch = layer_times(rw.layer(l), Precision::FP16, d, 1)->forward;
  CHECK(no_dispatch > 21 * 2e-6);
  CHECK(no_dispatch < 21 * 2.01e-6);
}

TEST_CASE("host dispatch: a long kernel's lead hides the launches of the short ones after it") {
  // One GEMM of 100 us on the device (3 us start-up + 4.85 GFLOP at 50 TFLOP/s) and five
  // element-wise kernels of 3 us (start-up only: memory never the limit), dispatch 20 us.
  // Forward (layer order): launches issued at 0, 20, .., 100 us; the GEMM runs 0-100, then the
  // five back to back: 115 us (one at a time at the host's rate would be 100 + 5 x 20 = 200).
  // Backward (reverse order): the five short ones first, each waiting for its launch (at 0, 20,
  // .., 80 us), then the GEMM, issued at 100 us: 200 us; its two parts in proportion to their device
  // time (input gradient 100 + 15 us, weight gradient 100 us).
  Layer layer;
  layer.name = "l";
  layer.kind = "custom";
  Kernel gemm;
  gemm.forward_flops = gemm.backward_input_flops = gemm.backward_weight_flops = 4.85e9;
  Kernel ew;
  ew.cls = KernelClass::Elementwise;
  ew.forward_bytes = ew.backward_bytes = 1;
  layer.kernels = {gemm, ew, ew, ew, ew, ew};
  layer.forward_flops = layer.backward_input_flops = layer.backward_weight_flops = 4.85e9;
  DeviceSpec d = launching_gpu(3e-6);
  PassTimes t = *layer_times(layer, Precision::FP16, d, 1);
  CHECK(t.forward == pipegrid::testing::approx(115e-6));
  // Backward: 5 x 3 us (input gradient) + the GEMM's 100 us input and 100 us weight gradients
  // on the device; the stream: the five at 0-3, 20-23, .., 80-83, the GEMM's input-gradient launch
  // at 100 us (100-200), its weight-gradient launch at 120 us (200-300): 300 us, split 115 : 100.
  CHECK(t.backward() == pipegrid::testing::approx(300e-6));
  CHECK(t.backward_input == pipegrid::testing::approx(300e-6 * 115 / 215));
  // Dispatch 0: the sums, 115 us and 215 us.
  d.kernel_dispatch_s = 0;
  PassTimes z = *layer_times(layer, Precision::FP16, d, 1);
  CHECK(z.forward == pipegrid::testing::approx(115e-6));
  CHECK(z.backward() == pipegrid::testing::approx(215e-6));
  // The stream's closed form, by hand: 4 launches of 5 us each once the device is busy until 30 us
  // and the host has issued until 20 us, dispatch 20 us: max(max(30, 20) + 20, 20 + 3 x 20 + 5) = 85 us.
  HostStream s;
  s.issue(1, 30e-6, 20e-6);  // issued at 0, runs 0-30; the host is at 20 us
  s.issue(4, 20e-6, 20e-6);  // issued at 20, 40, 60, 80 us: the last runs 80-85
  CHECK(s.end() == pipegrid::testing::approx(85e-6));
}

TEST_CASE("host dispatch carried across layers: a long layer's lead hides the next layer's launches") {
  // Layer A: one GEMM of 100 us on the device (3 us start-up + 4.85 GFLOP at 50 TFLOP/s); layer B:
  // five element-wise kernels of 3 us (start-up only); dispatch 20 us, no layer overhead.
  // Each started afresh: A 100 us, B's launches at 0, 20, .., 80 us, the last running 80-83: 83 us.
  // Carried (the forward in the layers' order): the host issues A at 0 and B's five at 20, .., 100
  // us while A runs 0-100; B's five run back to back after it, 100-115: B adds 15 us, the pass
  // 115 us, not 183. After a synchronisation before B (the host waits for A: 100 us) B's launches
  // are issued at 100, 120, .., 180 us: the last runs 180-183, B adds 83 us as afresh.
  auto gemm_layer = [] {
    Layer l;
    l.name = "a";
    l.kind = "custom";
    Kernel gemm;
    gemm.forward_flops = gemm.backward_input_flops = gemm.backward_weight_flops = 4.85e9;
    l.kernels = {gemm};
    l.forward_flops = l.backward_input_flops = l.backward_weight_flops = 4.85e9;
    return l;
  };
  Layer a = gemm_layer();
  Layer b;
  b.name = "b";
  b.kind = "custom";
  Kernel ew;
  ew.cls = KernelClass::Elementwise;
  ew.forward_bytes = ew.backward_bytes = 1;
  b.kernels = {ew, ew, ew, ew, ew};
  DeviceSpec d = launching_gpu(3e-6);
  d.layer_overhead_s = 0;
  CHECK(layer_times(a, Precision::FP16, d, 1)->forward == pipegrid::testing::approx(100e-6));
  CHECK(layer_times(b, Precision::FP16, d, 1)->forward == pipegrid::testing::approx(83e-6));
  HostCarry carry;
  CHECK(layer_times(a, Precision::FP16, d, 1, carry)->forward == pipegrid::testing::approx(100e-6));
  CHECK(layer_times(b, Precision::FP16, d, 1, carry)->forward == pipegrid::testing::approx(15e-6));
  HostCarry synced;
  (void)layer_times(a, Precision::FP16, d, 1, synced);
  synced.forward.sync();
  CHECK(layer_times(b, Precision::FP16, d, 1, synced)->forward == pipegrid::testing::approx(83e-6));
  // The backward in reverse (B, then A), carried: B's five issued at 0, .., 80 us run as issued
  // (80-83), A's input-gradient launch at 100 us (100-200), its weight-gradient one at 120 us
  // (200-300): A adds 300 - 83 = 217 us, split 100 : 100 by device time. Each afresh: B 83, A 200.
  HostCarry back;
  CHECK(layer_times(b, Precision::FP16, d, 1, back)->backward() == pipegrid::testing::approx(83e-6));
  PassTimes ta = *layer_times(a, Precision::FP16, d, 1, back);
  CHECK(ta.backward() == pipegrid::testing::approx(217e-6));
  CHECK(ta.backward_input == pipegrid::testing::approx(108.5e-6));
  CHECK(layer_times(a, Precision::FP16, d, 1)->backward() == pipegrid::testing::approx(200e-6));
  // A host never the limit: the carried times are the device's sums (100 and 15 us).
  d.kernel_dispatch_s = 0;
  HostCarry free;
  CHECK(layer_times(a, Precision::FP16, d, 1, free)->forward == pipegrid::testing::approx(100e-6));
  CHECK(layer_times(b, Precision::FP16, d, 1, free)->forward == pipegrid::testing::approx(15e-6));
}

TEST_CASE("launches on parallel streams: the host pays each, the device a start-up per call") {
  // A grouped GEMM of 8 expert GEMMs over 4 streams: 2 calls (waves) of 4 launches. r_inf 50 TFLOP/s,
  // start-up 2 us, dispatch 20 us, memory free. 50 MFLOP of work (1 us): the device's 2 x (2 + 0.5) us
  // against the host's 8 launches 20 us apart; 100 GFLOP (2 ms): 2 x (2 + 1000) us, the launches hidden.
  ModelBuilder b("m", Precision::FP16);
  int x = b.input("x", {1000});
  int fc = *b.linear("fc", x, 1000, 1000, false);
  Workload w = b.finish();
  Layer grouped = w.layer(fc);
  Kernel k;
  k.cls = KernelClass::GroupedGemm;
  k.forward_flops = 2e6;  // per sample
  k.calls = 2;
  k.launches = 8;
  grouped.kernels = {k};
  DeviceSpec d = launching_gpu(2e-6);
  d.layer_overhead_s = 0;
  // The eight launches issued 20 us apart, the last wave's share (5 us / 8) after the last: 140.6 us.
  CHECK(layer_times(grouped, Precision::FP16, d, 25)->forward ==
        pipegrid::testing::approx(7 * 20e-6 + 5e-6 / 8));
  CHECK(layer_times(grouped, Precision::FP16, d, 50000)->forward == pipegrid::testing::approx(2004e-6));
  // The grouped GEMM's class at its own host time (kernel_dispatch_class), 50 us a launch: the eight
  // launches 50 us apart, the last wave's share after the last, 7 x 50 + 5 / 8 us; the other classes keep
  // 20 us. At 0 for the class alone, the host never bounds it: the device's 5 us.
  d.kernel_dispatch_class[static_cast<int>(KernelClass::GroupedGemm)] = 50e-6;
  CHECK(layer_times(grouped, Precision::FP16, d, 25)->forward ==
        pipegrid::testing::approx(7 * 50e-6 + 5e-6 / 8));
  CHECK(d.dispatch(KernelClass::Gemm) == pipegrid::testing::approx(20e-6));
  d.kernel_dispatch_class[static_cast<int>(KernelClass::GroupedGemm)] = 0;
  CHECK(layer_times(grouped, Precision::FP16, d, 25)->forward == pipegrid::testing::approx(5e-6));
  d.kernel_dispatch_class = DeviceSpec::unset_per_class();
  // No dispatch: two start-ups, not eight.
  d.kernel_dispatch_s = 0;
  CHECK(layer_times(grouped, Precision::FP16, d, 25)->forward == pipegrid::testing::approx(5e-6));
  // An MoE block's expert GEMMs as Transformer Engine runs them: 16 local experts (128 / ep 8), 4
  // waves of 4 launches, each wave reading its experts' weights; the activation between them is one.
  TensorSplit sp;
  sp.kind = TensorSplitKind::MoeBlock;
  sp.sequence = 1024;
  sp.hidden = 512;
  sp.heads = sp.kv_heads = 8;
  sp.gated = true;
  sp.moe = {128, 8, 256, 0, false};
  const blocks::Moe m = blocks::moe(sp, 1, false, ExpertSizes{8, 1}, Precision::BF16);
  CHECK(m.expert[0].calls == 4);
  CHECK(m.expert[0].launches == 16);
  CHECK(m.expert[2].calls == 4);
  CHECK(m.expert[1].calls == 1);
  CHECK(m.expert[1].launches == 0);
  CHECK(m.expert[0].weight_bytes ==
        pipegrid::testing::approx(16 * 512 * 256 * 2 * 2.0 / 4));  // w1 (gated) / 4
}

TEST_CASE("an LSTM re-reads its recurrent weights at every time step") {
  // One LSTM layer, 4 inputs... features 512, hidden 1024, 10 steps, fp16, batch 1.
  ModelBuilder b("m", Precision::FP16);
  int x = b.input("x", {10, 512});
  int l = *b.lstm("lstm", {x}, 1024, false);
  Workload w = b.finish();
  const Layer& layer = w.layer(l);
  // Totals: the forward 8 h (i + h) per step, 3 x that for forward + backward.
  CHECK(layer.forward_flops == pipegrid::testing::approx(8.0 * 1024 * (512 + 1024) * 10));
  CHECK(layer.backward_input_flops == pipegrid::testing::approx(layer.forward_flops));
  CHECK(layer.backward_weight_flops == pipegrid::testing::approx(layer.forward_flops));
  DeviceSpec d = gpu();
  d.peak_flops.fill(1e18);  // compute free: only memory traffic counts
  // Forward by hand: input projection (one GEMM): weights 4 h i x 2 B = 4 MiB, streamed
  // 10 x (512 + 4096) x 2 B; then per step a GEMM reading 4 h^2 x 2 B = 8 MiB of weights and
  // streaming h in and 4 h out (5 h x 2 B), and the gates' kernel streaming 7 h x 2 B.
  const double input_gemm = (4.0 * 1024 * 512 * 2 + 10 * (512 + 4096) * 2) / 1e12;
  const double step = (4.0 * 1024 * 1024 * 2 + 5 * 1024 * 2) / 1e12 + 7.0 * 1024 * 2 / 1e12;
  PassTimes t = *layer_times(layer, Precision::FP16, d, 1);
  CHECK(t.forward == pipegrid::testing::approx(input_gemm + 10 * step));
  // The weights' share does not depend on the batch: 10 x 8 MiB per pass at any batch size, so the
  // time per sample falls with the batch.
  PassTimes t8 = *layer_times(layer, Precision::FP16, d, 8);
  const double input_gemm8 = (4.0 * 1024 * 512 * 2 + 8 * 10 * (512 + 4096) * 2) / 1e12;
  const double step8 = (4.0 * 1024 * 1024 * 2 + 8 * 5 * 1024 * 2) / 1e12 + 8 * 7.0 * 1024 * 2 / 1e12;
  CHECK(t8.forward == pipegrid::testing::approx(input_gemm8 + 10 * step8));
}

TEST_CASE("a recurrent step pays the device's recurrent_step once per step, direction and pass") {
  // Bidirectional LSTM, 10 steps, fp16, on the round-figure GPU. By hand: the step
  // GEMM's 2 x 10 calls per pass each pay the per-step time on top of start-up + work; the input
  // projection (one call), the gates' kernel and the weight-gradient pass do not.
  ModelBuilder b("m", Precision::AMP);
  int x = b.input("x", {10, 256});
  int l = *b.lstm("lstm", {x}, 256, true);
  Workload w = b.finish();
  DeviceSpec d = gpu();
  d.kernel_startup_s = 2e-6;
  const PassTimes base = *layer_times(w.layer(l), Precision::AMP, d, 4);
  d.recurrent_step_s[static_cast<int>(Precision::FP16)] = 30e-6;  // amp runs at fp16's figures
  const PassTimes with = *layer_times(w.layer(l), Precision::AMP, d, 4);
  CHECK(with.forward - base.forward == pipegrid::testing::approx(2 * 10 * 30e-6));
  CHECK(with.backward_input - base.backward_input == pipegrid::testing::approx(2 * 10 * 30e-6));
  CHECK(with.backward_weight == pipegrid::testing::approx(base.backward_weight));
  // Keyed by the math precision: fp32's entry is 0, so fp32 runs are unchanged.
  CHECK(layer_times(w.layer(l), Precision::FP32, d, 4)->forward ==
        pipegrid::testing::approx(
            layer_times(w.layer(l), Precision::FP32, gpu_with_startup(2e-6), 4)->forward));
  // A layer without recurrence never pays it.
  ModelBuilder b2("m", Precision::AMP);
  int y = b2.input("y", {256});
  int fc = *b2.linear("fc", y, 256, 256);
  Workload w2 = b2.finish();
  CHECK(layer_times(w2.layer(fc), Precision::AMP, d, 4)->forward ==
        pipegrid::testing::approx(
            layer_times(w2.layer(fc), Precision::AMP, gpu_with_startup(2e-6), 4)->forward));
}

TEST_CASE("a convolution with BatchNorm and ReLU adds the element-wise kernels' memory time") {
  // 64 -> 64 channels, 3x3, 56x56, fp16: the conv, then BatchNorm (3 passes of the output forward)
  // and ReLU (2), each at the memory bandwidth.
  ModelBuilder b("m", Precision::FP16);
  int x = b.input("x", {64, 56, 56});
  ModelBuilder::Conv c{64, 64, 3, 1, 1, 1, false, true, true};
  int conv = *b.conv2d("conv", x, c);
  Workload w = b.finish();
  DeviceSpec d = gpu();
  d.efficiency = 1;
  eff(d, Precision::FP16, KernelClass::Conv) = 0.5;
  const double out = 64.0 * 56 * 56 * 2, flops = 2.0 * 64 * 64 * 9 * 56 * 56;
  const double weights = 64.0 * 64 * 9 * 2 + 2 * 64 * 2;
  PassTimes t = *layer_times(w.layer(conv), Precision::FP16, d, 32);
  const double conv_t = std::max(flops * 32 / 50e12, (2 * out * 32 + weights) / 1e12);
  CHECK(t.forward == pipegrid::testing::approx(conv_t + 3 * out * 32 / 1e12 + 2 * out * 32 / 1e12));
}

TEST_CASE("Winograd F(2x2, 3x3): a 3x3 stride-1 convolution does 16 multiplies per 2x2 tile, not 36") {
  // Lavin and Gray (CVPR 2016): F(m x m, r x r) takes (m + r - 1)^2 multiplies for m^2 outputs, so
  // F(2x2, 3x3) 16 where direct convolution takes 4 x 9 = 36: 2.25x fewer in each pass, on a device
  // that runs it in the math precision. 64 -> 64 channels on 56 x 56, no BatchNorm or ReLU, a
  // compute-bound batch of 32 (memory free), startup 0.
  DeviceSpec d = gpu();
  d.memory_bandwidth = 0;
  d.efficiency = 0.5;
  d.winograd[static_cast<int>(Precision::FP32)] = true;
  CHECK(kWinogradSpeedup == 2.25);
  ModelBuilder b("m", Precision::FP32);
  int x = b.input("x", {64, 56, 56});
  int s1 = *b.conv2d("s1", x, {64, 64, 3, 1, 1, 1, false, false, false});
  int s2 = *b.conv2d("s2", x, {64, 64, 3, 2, 1, 1, false, false, false});  // stride 2: direct
  int k1 = *b.conv2d("k1", x, {64, 64, 1, 1, 0, 1, false, false, false});  // 1x1: direct
  int g2 = *b.conv2d("g2", x, {64, 64, 3, 1, 1, 2, false, false, false});  // grouped: direct
  Workload w = b.finish();
  const double direct = 2.0 * 64 * 64 * 9 * 56 * 56 * 32;  // FLOPs per pass of s1, batch 32
  PassTimes t = *layer_times(w.layer(s1), Precision::FP32, d, 32);
  CHECK(t.forward == pipegrid::testing::approx(direct / 2.25 / 5e12));
  CHECK(t.backward_input == pipegrid::testing::approx(direct / 2.25 / 5e12));
  CHECK(t.backward_weight == pipegrid::testing::approx(direct / 2.25 / 5e12));
  CHECK(w.layer(s1).forward_flops == 2.0 * 64 * 64 * 9 * 56 * 56);  // the model's FLOPs stay direct
  CHECK(layer_times(w.layer(s2), Precision::FP32, d, 32)->forward ==
        pipegrid::testing::approx(2.0 * 64 * 64 * 9 * 28 * 28 * 32 / 5e12));
  CHECK(layer_times(w.layer(k1), Precision::FP32, d, 32)->forward ==
        pipegrid::testing::approx(2.0 * 64 * 64 * 56 * 56 * 32 / 5e12));
  CHECK(layer_times(w.layer(g2), Precision::FP32, d, 32)->forward ==
        pipegrid::testing::approx(2.0 * 64 * 32 * 9 * 56 * 56 * 32 / 5e12));
  // Not in the precisions it lists: tf32 and fp16 run direct (implicit GEMM on tensor cores).
  CHECK(layer_times(w.layer(s1), Precision::TF32, d, 32)->forward ==
        pipegrid::testing::approx(direct / 25e12));
  CHECK(layer_times(w.layer(s1), Precision::AMP, d, 32)->forward ==
        pipegrid::testing::approx(direct / 50e12));
  // A device without a tf32 rate runs tf32 as fp32: Winograd too.
  d.peak_flops[static_cast<int>(Precision::TF32)] = 0;
  CHECK(layer_times(w.layer(s1), Precision::TF32, d, 32)->forward ==
        pipegrid::testing::approx(direct / 2.25 / 5e12));
  // And a device that lists none runs every convolution direct.
  d.winograd.fill(false);
  CHECK(layer_times(w.layer(s1), Precision::FP32, d, 32)->forward ==
        pipegrid::testing::approx(direct / 5e12));
}

TEST_CASE("mixed precision keeps fp32 master weights and state: 16 bytes per parameter with Adam") {
  MemoryOptions o;
  o.mixed_precision = true;
  const double n = 1e9;
  for (auto [opt, state] :
       {std::pair{Optimizer::SGD, 4.0}, {Optimizer::Momentum, 8.0}, {Optimizer::Adam, 12.0}}) {
    o.optimizer = opt;
    MemoryBytes m = static_memory(n, 2 * n, o);  // fp16 working weights
    CHECK(m[static_cast<int>(MemoryCategory::Weights)] == 2 * n);
    CHECK(m[static_cast<int>(MemoryCategory::Gradients)] == 2 * n);
    CHECK(m[static_cast<int>(MemoryCategory::OptimizerState)] == state * n);
  }
  o.optimizer = Optimizer::Adam;
  CHECK(total(static_memory(n, 2 * n, o)) == 16 * n);  // Micikevicius et al.; ZeRO's 16 bytes
  o.mixed_precision = false;
  CHECK(total(static_memory(n, 4 * n, o)) == 16 * n);  // fp32 Adam: 4 + 4 + 8
  CHECK(total(static_memory(n, 2 * n, o)) == 8 * n);   // pure fp16 Adam: everything in 2 bytes
}

TEST_CASE("the optimizer step reads and writes the state once, at the memory bandwidth") {
  DeviceSpec d = gpu();
  d.memory_efficiency_default = 0.8;
  // fp32 Adam: read w, g, m, v and write w, m, v = 7 x 4 bytes; amp: gradient 2 + master 4 x 2 +
  // m, v 4 x 4 + working weights 2 = 28; SGD fp32: 3 x 4.
  CHECK(optimizer_step_bytes_per_parameter(Optimizer::Adam, Precision::FP32) == 28);
  CHECK(optimizer_step_bytes_per_parameter(Optimizer::Adam, Precision::AMP) == 28);
  CHECK(optimizer_step_bytes_per_parameter(Optimizer::SGD, Precision::FP32) == 12);
  CHECK(optimizer_step_bytes_per_parameter(Optimizer::Momentum, Precision::AMP) == 20);
  CHECK(optimizer_step_bytes_per_parameter(Optimizer::SGD, Precision::FP16) == 6);
  CHECK(optimizer_step_time(1e9, Optimizer::Adam, Precision::AMP, d) ==
        pipegrid::testing::approx(28e9 / 0.8e12));
}

TEST_CASE("an unfused optimizer step (torch.optim's loop): one pass per operation and tensor") {
  // Hand count of torch.optim.Adam's step (PyTorch 1.6, no weight decay), passes over fp32 tensors:
  // exp_avg.mul_ (r, w) .add_(g) (r, r, w) = 5; exp_avg_sq.mul_ (2) .addcmul_(g, g) (r, r, r, w) = 6;
  // denom = sqrt (2), / c (2), + eps (2) = 6; p.addcdiv_(m, denom) (r, r, r, w) = 4: 21 x 4 bytes.
  // SGD with momentum: buf.mul_ (2) .add_(g) (3), p.add_(buf) (3) = 8; plain SGD p.add_(g) = 3 (as
  // fused). Mixed precision: + the fp16 gradients copied to fp32 (2 + 4) and the master weights back
  // to fp16 (4 + 2).
  const auto u = OptimizerKernels::Unfused;
  CHECK(optimizer_step_bytes_per_parameter(Optimizer::Adam, Precision::FP32, u) == 84);
  CHECK(optimizer_step_bytes_per_parameter(Optimizer::Adam, Precision::TF32, u) == 84);
  CHECK(optimizer_step_bytes_per_parameter(Optimizer::Adam, Precision::AMP, u) == 96);
  CHECK(optimizer_step_bytes_per_parameter(Optimizer::Momentum, Precision::FP32, u) == 32);
  CHECK(optimizer_step_bytes_per_parameter(Optimizer::SGD, Precision::FP32, u) ==
        optimizer_step_bytes_per_parameter(Optimizer::SGD, Precision::FP32));
  DeviceSpec d = gpu();
  d.memory_efficiency_default = 0.8;
  // 160 M parameters (GNMT), fp32: 160e6 x 84 / 0.8 TB/s = 16.8 ms, three times the fused 5.6 ms.
  CHECK(optimizer_step_time(160e6, Optimizer::Adam, Precision::FP32, d, u) ==
        pipegrid::testing::approx(160e6 * 84 / 0.8e12));
  CHECK(optimizer_step_time(160e6, Optimizer::Adam, Precision::FP32, d) ==
        pipegrid::testing::approx(160e6 * 28 / 0.8e12));
  // A script's own loop, counted the same way, replaces the count: BertAdam in PyTorch 21.11
  // (DLE's run_squad.py; experiments/validation/measurements.yaml) 34 passes of 4 bytes; with
  // mixed precision the copies around it still add 12.
  CHECK(optimizer_step_bytes_per_parameter(Optimizer::Adam, Precision::FP32, u, 34) == 136);
  CHECK(optimizer_step_bytes_per_parameter(Optimizer::Adam, Precision::AMP, u, 34) == 4 * 34 + 12);
  MemoryOptions m;
  m.optimizer_kernels = u;
  m.optimizer_passes = 34;
  CHECK(optimizer_step_time(335e6, m, Precision::TF32, d) == pipegrid::testing::approx(335e6 * 136 / 0.8e12));
  m.optimizer_passes = 0;  // torch.optim's Adam
  CHECK(optimizer_step_time(335e6, m, Precision::TF32, d) == pipegrid::testing::approx(335e6 * 84 / 0.8e12));
}

TEST_CASE("gradient accumulation: one kernel per parameter tensor, reading two tensors and writing one") {
  DeviceSpec d = gpu();
  d.memory_efficiency_default = 0.8;
  d.kernel_startup_s = 5e-6;
  // 1e9 parameters in 12 tensors, amp (fp16 gradients, 2 bytes): accumulator and gradient read,
  // accumulator written = 6 bytes per parameter at 0.8 TB/s = 7.5 ms, and 12 start-ups of 5 us.
  const auto mg = GradAccumulation::MainGrad, un = GradAccumulation::Unfused;
  CHECK(grad_accumulation_time(1e9, 12, mg, Precision::AMP, 0, d) ==
        pipegrid::testing::approx(60e-6 + 6e9 / 0.8e12));
  CHECK(grad_accumulation_time(1e9, 12, un, Precision::AMP, 0, d) ==
        pipegrid::testing::approx(60e-6 + 6e9 / 0.8e12));
  // An fp32 accumulator beside bf16 gradients (Megatron-LM's --accumulate-allreduce-grads-in-fp32):
  // 4 + 2 + 4 bytes.
  CHECK(grad_accumulation_time(1e9, 12, mg, Precision::AMP_BF16, 4, d) ==
        pipegrid::testing::approx(60e-6 + 10e9 / 0.8e12));
  CHECK(grad_accumulation_time(1e9, 12, mg, Precision::FP32, 0, d) ==
        pipegrid::testing::approx(60e-6 + 12e9 / 0.8e12));
  CHECK(grad_accumulation_time(1e9, 12, GradAccumulation::Fused, Precision::AMP, 0, d) == 0);
  CHECK(grad_accumulation_time(0, 0, mg, Precision::AMP, 0, d) == 0);
  // Which micro-batches pay: unfused from the second (AccumulateGrad stores the first), main-grad all.
  CHECK(!pays_grad_accumulation(un, 0));
  CHECK(pays_grad_accumulation(un, 1));
  CHECK(pays_grad_accumulation(mg, 0));
  CHECK(!pays_grad_accumulation(GradAccumulation::Fused, 3));
  CHECK(parse_grad_accumulation("main-grad") == mg);
  CHECK(!parse_grad_accumulation("hook").has_value());
}

TEST_CASE("parameter tensors of a block, counted by hand as Megatron builds it") {
  Layer l;
  l.parameters = 1;
  l.split.kind = TensorSplitKind::Transformer;
  // GPT (biases, LayerNorm): QKV w + b, projection w + b, LN1 w + b; FC1 w + b, FC2 w + b, LN2 w + b.
  l.split.biases = true;
  CHECK(parameter_tensors(l) == 12);
  // Llama (no biases, RMSNorm; gate and up in one linear_fc1): QKV, projection, norm; FC1, FC2, norm.
  l.split.biases = false;
  l.split.gated = true;
  CHECK(parameter_tensors(l) == 6);
  // DeepSeek-V3's MLA: q down, q norm, q up, kv down, kv norm, kv up, projection, norm = 8; MoE part:
  // norm, router, 256 / 64 = 4 local experts x 2 GEMMs, the shared expert's 2 = 12.
  l.split.kind = TensorSplitKind::MoeBlock;
  l.split.mla.kv_rank = 512;
  l.split.mla.q_rank = 1536;
  l.split.moe.experts = 256;
  l.split.moe.shared_ffn = 2048;
  CHECK(parameter_tensors(l, 64) == 8 + 12);
  CHECK(parameter_tensors(l, 1) == 8 + 2 + 2 * 256 + 2);
  Layer conv;
  conv.parameters = 1000;
  CHECK(parameter_tensors(conv) == 1);  // a layer other than a block: one tensor
  conv.parameters = 0;
  CHECK(parameter_tensors(conv) == 0);
}

TEST_CASE("every kernel call pays the startup: a Transformer block's 17 launches per forward") {
  // With compute and memory free, a forward is 4 GEMMs + 2 attention GEMMs + 4 passes over the
  // scores (scale, mask, softmax, dropout) + 5 other element-wise + 2 LayerNorm launches = 17.
  ModelBuilder b("m", Precision::FP16);
  int x = b.input("x", {128, 256});
  int blk = *b.transformer_block("blk", x, 4, 1024);
  Workload w = b.finish();
  DeviceSpec d = gpu();
  d.peak_flops.fill(1e30);
  d.memory_bandwidth = 1e30;
  d.kernel_startup_s = 1e-6;
  PassTimes t = *layer_times(w.layer(blk), Precision::FP16, d, 8);
  CHECK(t.forward == pipegrid::testing::approx(17e-6));
  // Backward: input gradients of the same 17 kernels (each has streamed bytes), weight gradients of
  // the 4 GEMMs only (the attention core and element-wise kernels have no weights).
  CHECK(t.backward_input == pipegrid::testing::approx(17e-6));
  CHECK(t.backward_weight == pipegrid::testing::approx(4e-6));
}
