// The device cost model: time = max(FLOPs / (peak x efficiency), bytes / bandwidth) + overhead.
#include "core/device.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <tuple>

#include "core/models/builder.h"
#include "core/models/zoo.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;

using pipegrid::testing::u280_like;  // a U280 on its HBM2: 9,024 DSPs at 300 MHz, 460 GB/s

TEST_CASE("an FPGA's peak is DSPs x clock x MACs per DSP x 2") {
  DeviceSpec d = u280_like(9024);
  CHECK(d.peak(Precision::FP32) == pipegrid::testing::approx(9024 * 300e6 * 0.2 * 2));  // 1.08 TFLOP/s
  CHECK(d.peak(Precision::FP16) == pipegrid::testing::approx(5.4144e12));
  CHECK(d.peak(Precision::INT8) == pipegrid::testing::approx(10.8288e12));
}

TEST_CASE("twice the DSPs halves compute-bound layer times and leaves memory-bound ones unchanged") {
  ModelBuilder b("m", Precision::FP16);
  int x = b.input("x", {4096});
  int fc = *b.linear("fc", x, 4096, 4096);  // 2 x 4096^2 FLOP, 16 KiB moved per sample
  int ids = b.input("ids", {100});
  int bag = *b.embedding_bag("bag", ids, 1000000, 64, 100, true);  // no FLOP, 12.9 KB moved per sample
  Workload w = b.finish();
  const DeviceSpec one = u280_like(9024), two = u280_like(18048);
  // The fc layer's weights (4096^2 + 4096 fp16 values) are read once per micro-batch: 33.6 MB at
  // 460 GB/s = 73 us, against 8.9 us of compute per sample at 5.41 TFLOP/s x 0.7. So batches 1 and
  // 8 are memory-bound (the DSPs do not help), batch 64 is compute-bound (they halve it).
  const double weights = (4096.0 * 4096 + 4096) * 2, per_sample = (4096.0 + 4096) * 2;
  for (double batch : {1.0, 8.0, 64.0}) {
    PassTimes a = *layer_times(w.layer(fc), w.precision, one, batch);
    PassTimes c = *layer_times(w.layer(fc), w.precision, two, batch);
    const double o = one.layer_overhead_s;
    INFO("batch " << batch);
    const double compute = 2.0 * 4096 * 4096 * batch / (5.4144e12 * 0.7);
    const double memory = (per_sample * batch + weights) / 460e9;
    CHECK(a.forward - o == pipegrid::testing::approx(std::max(compute, memory)));
    if (batch == 64) {
      REQUIRE(compute > memory);
      CHECK(c.forward - o == pipegrid::testing::approx((a.forward - o) / 2));
      CHECK(c.backward_input - o == pipegrid::testing::approx((a.backward_input - o) / 2));
      CHECK(c.backward_weight - o == pipegrid::testing::approx((a.backward_weight - o) / 2));
    } else {
      REQUIRE(compute < memory);
      CHECK(c.forward == a.forward);
    }
    PassTimes m1 = *layer_times(w.layer(bag), w.precision, one, batch);
    PassTimes m2 = *layer_times(w.layer(bag), w.precision, two, batch);
    CHECK(m1.forward == m2.forward);
    CHECK(m1.backward() == m2.backward());
    // A gather: only the looked-up rows move, per sample (no batch-independent weight traffic).
    CHECK(m1.forward - o == pipegrid::testing::approx(w.layer(bag).forward_bytes * batch / 460e9));
  }
}

TEST_CASE("an FPGA's efficiency and DSP count enter only as their product (what-if sensitivity)") {
  // experiments/fpga-whatif/sensitivity.md reads an error in the assumed efficiency as a shift along
  // the DSP axis: rate = DSPs x clock x MACs x 2 x efficiency, so (2N DSPs, e / 2) is (N, e) for every
  // layer, compute-bound or memory-bound; a different DSP-efficiency product is not.
  for (const char* name : {"vgg16", "resnet50", "gnmt8"}) {
    Workload w = *build_model(**find_model(name), {}, Precision::FP16);
    DeviceSpec a = u280_like(9024), b = u280_like(18048), c = u280_like(18048);
    b.efficiency = a.efficiency / 2;
    int differ = 0;
    for (size_t i = 0; i < w.layer_count(); ++i) {
      const Layer& l = w.layer(i);
      for (double batch : {1.0, 8.0}) {
        INFO(name << " " << l.name << " batch " << batch);
        PassTimes ta = *layer_times(l, w.precision, a, batch), tb = *layer_times(l, w.precision, b, batch);
        CHECK(tb.forward == pipegrid::testing::approx(ta.forward).epsilon(1e-12));
        CHECK(tb.backward() == pipegrid::testing::approx(ta.backward()).epsilon(1e-12));
        differ += layer_times(l, w.precision, c, batch)->forward != ta.forward;
      }
    }
    CHECK(differ > 0);  // twice the DSPs at the same efficiency is another board
  }
}

TEST_CASE("a layer's time per sample falls as the micro-batch grows (the fixed overhead amortises)") {
  ModelBuilder b("m", Precision::FP32);
  int x = b.input("x", {1024});
  int fc = *b.linear("fc", x, 1024, 1024);
  Workload w = b.finish();
  DeviceSpec gpu;
  gpu.memory_bytes = 16e9;
  gpu.memory_bandwidth = 900e9;
  gpu.peak_flops = {15.7e12, 0, 125e12, 125e12, 125e12};  // fp32, tf32 (none), fp16, bf16, int8
  gpu.efficiency = 0.5;
  gpu.layer_overhead_s = 10e-6;
  double previous = 1e300;
  for (double batch : {1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0}) {
    PassTimes t = *layer_times(w.layer(fc), w.precision, gpu, batch);
    const double per_sample = (t.forward + t.backward()) / batch;
    CHECK(per_sample < previous);
    previous = per_sample;
  }
  // A device without a rate for the layer's precision cannot run it (no measured time either).
  DeviceSpec none;
  none.kind = "bare";
  none.memory_bytes = 1e9;
  CHECK(layer_times(w.layer(fc), w.precision, none, 1).error().message ==
        "device kind \"bare\" has no fp32 compute rate for layer \"fc\"");
}

// fp8 training (Transformer Engine's recipe): a linear layer's GEMMs run at the FP8 rate, each after
// one memory-bound quantization pass over its input (forward) or its output gradient (backward,
// before the input-gradient GEMM): 5 bytes per element with per-tensor current scaling (read for the
// amax, read again and write one byte), 3 with blockwise or MX scales (one fused read and write).
TEST_CASE("an fp8 training's linear GEMM: FP8 rate plus the quantization passes, by hand") {
  DeviceSpec d;
  d.memory_bandwidth = 2e12;
  d.peak_flops[static_cast<int>(Precision::BF16)] = 1e15;
  d.peak_flops[static_cast<int>(Precision::FP8)] = 2e15;
  d.compute_efficiency[static_cast<int>(Precision::BF16)][static_cast<int>(KernelClass::Gemm)] = 0.8;
  d.compute_efficiency[static_cast<int>(Precision::FP8)][static_cast<int>(KernelClass::Gemm)] = 0.6;
  d.kernel_startup_s = 5e-6;
  const int in = 8192, out = 8192, rows = 4096;  // 4,096 tokens per sample
  const double batch = 2;
  auto model = [&](Precision p) {
    ModelBuilder b("m", p);
    int x = b.input("x", {rows, in});
    REQUIRE(*b.linear("fc", x, in, out, false) == 1);
    return b.finish();
  };
  const double flops = 2.0 * rows * in * out * batch;  // per pass part (forward, input grad, weight grad)
  const double bf16_gemm = 5e-6 + flops / (1e15 * 0.8);
  const double fp8_gemm = 5e-6 + flops / (2e15 * 0.6);
  REQUIRE(fp8_gemm > 5e-6 + (2.0 * rows * (in + out) * batch * 2 + in * out * 2.0) / 2e12);  // compute-bound
  Workload bf = model(Precision::AMP_BF16);
  PassTimes b16 = *layer_times(bf.layer(1), bf.precision, d, batch);
  CHECK(b16.forward == pipegrid::testing::approx(bf16_gemm));
  CHECK(b16.backward_input == pipegrid::testing::approx(bf16_gemm));
  // Transformer Engine's quantization: per-tensor current scaling is three kernels (amax, scale,
  // cast: quantizer.cpp), the block-scaled formats one, each paying the start-up. MXFP8's GEMMs run
  // at 6.812 / 7.161 of the fp8 rate: Transformer Engine's measured per-layer GEMM times on a B300,
  // inputs pre-quantized (docs/examples/gemm_profiling/gemm_profiling.rst), typed in here.
  const double mxfp8_gemm = 5e-6 + flops / (2e15 * 0.6 * (6.812 / 7.161));
  for (auto [p, cast, kernels, gemm] : {std::tuple{Precision::AMP_FP8, 5.0, 3.0, fp8_gemm},
                                        std::tuple{Precision::AMP_FP8_BLOCKWISE, 3.0, 1.0, fp8_gemm},
                                        std::tuple{Precision::AMP_MXFP8, 3.0, 1.0, mxfp8_gemm}}) {
    INFO(to_string(p));
    Workload w = model(p);
    PassTimes t = *layer_times(w.layer(1), w.precision, d, batch);
    const double quantize_in = kernels * 5e-6 + rows * in * batch * cast / 2e12;
    const double quantize_grad = kernels * 5e-6 + rows * out * batch * cast / 2e12;
    CHECK(t.forward == pipegrid::testing::approx(gemm + quantize_in));
    CHECK(t.backward_input == pipegrid::testing::approx(gemm + quantize_grad));
    CHECK(t.backward_weight == pipegrid::testing::approx(gemm));
  }
  // A device without an FP8 rate runs the fp8 training as amp-bf16: no quantization either.
  d.peak_flops[static_cast<int>(Precision::FP8)] = 0;
  Workload w = model(Precision::AMP_FP8);
  PassTimes t = *layer_times(w.layer(1), w.precision, d, batch);
  CHECK(t.forward == pipegrid::testing::approx(bf16_gemm));
  CHECK(t.backward_weight == pipegrid::testing::approx(bf16_gemm));
}

TEST_CASE(
    "an fp8 grouped GEMM quantizes its input per expert (Transformer Engine's split_quantize), by hand") {
  // 8 experts' GEMMs as 2 waves of 4 streams (Kernel::calls 2, launches 8): the device pays a start-up
  // per wave for the GEMMs and one per quantization kernel, 8 quantizations of fp8_quantize_kernels
  // each (3 for per-tensor current scaling, 1 for MXFP8); the host launches all of them.
  DeviceSpec d;
  d.memory_bandwidth = 2e12;
  d.peak_flops[static_cast<int>(Precision::BF16)] = 1e15;
  d.peak_flops[static_cast<int>(Precision::FP8)] = 2e15;
  d.compute_efficiency[static_cast<int>(Precision::FP8)][static_cast<int>(KernelClass::GroupedGemm)] = 0.5;
  d.kernel_startup_s = 5e-6;
  const double flops = 8e12, elements = 1e8;  // the forward's FLOPs and quantized input elements
  Kernel k;
  k.cls = KernelClass::GroupedGemm;
  k.forward_flops = flops;
  k.fp8 = true;
  k.fp8_in = elements;
  k.calls = 2;
  k.launches = 8;
  Layer l;
  l.name = "experts";
  l.kind = "linear";
  l.forward_flops = flops;
  l.kernels = {k};
  for (auto [p, cast, kernels] :
       {std::tuple{Precision::AMP_FP8, 5.0, 3.0}, std::tuple{Precision::AMP_MXFP8, 3.0, 1.0}}) {
    INFO(to_string(p));
    d.kernel_dispatch_s = 0;
    const double rate = p == Precision::AMP_MXFP8 ? 6.812 / 7.161 : 1.0;  // measured: the test above
    const double gemms = 2 * (5e-6 + flops / 2 / (2e15 * 0.5 * rate));
    const double device = gemms + 8 * kernels * 5e-6 + elements * cast / 2e12;
    CHECK(layer_times(l, p, d, 1)->forward == pipegrid::testing::approx(device));
    CHECK(layer_times(l, p, d, 1)->host_forward_s == 0);  // a host that never bounds a launch adds nothing
    // A host at 1 ms per launch issues the 8 x kernels quantization kernels, then the 8 GEMM launches
    // (HostStream's closed form per group: max(max(gpu, host) + c tau, host + (c - 1) dispatch + tau)):
    // the quantizations end at 8 kernels - 1 ms plus a sliver, before the host has issued the first
    // GEMM at q = 8 kernels ms; the GEMMs end at max(q + G, q + 7 ms + G / 8), G their device time.
    d.kernel_dispatch_s = 1e-3;
    const double q = 8 * kernels * 1e-3;
    const double bound = std::max(q + gemms, q + 7e-3 + gemms / 8);
    CHECK(layer_times(l, p, d, 1)->forward == pipegrid::testing::approx(bound));
    // What the host added: the bound pass less the device's own sum (no backward FLOPs here).
    CHECK(layer_times(l, p, d, 1)->host_forward_s == pipegrid::testing::approx(bound - device));
  }
  // One grouped quantization for all 8 experts (Transformer Engine's group_quantize): one kernel in
  // MXFP8, its bytes unchanged.
  l.kernels[0].grouped_quantize = true;
  d.kernel_dispatch_s = 0;
  const double grouped =
      2 * (5e-6 + flops / 2 / (2e15 * 0.5 * (6.812 / 7.161))) + 5e-6 + elements * 3.0 / 2e12;
  CHECK(layer_times(l, Precision::AMP_MXFP8, d, 1)->forward == pipegrid::testing::approx(grouped));
}

TEST_CASE("what a bound host adds to each pass, by HostStream's closed form") {
  // One GEMM kernel of 4 calls per pass (no bytes: compute only), bf16 at 1 PFLOP/s, start-up 2 us.
  // Each call of a group of c equal launches ends at max(max(gpu, host) + c tau, host + (c - 1) D + tau).
  DeviceSpec d;
  d.peak_flops[static_cast<int>(Precision::BF16)] = 1e15;
  d.kernel_startup_s = 2e-6;
  Kernel k;
  k.cls = KernelClass::Gemm;
  k.forward_flops = 4e9;
  k.backward_input_flops = 8e9;
  k.backward_weight_flops = 12e9;
  k.calls = 4;
  Layer l;
  l.name = "linear";
  l.kind = "linear";
  l.forward_flops = k.forward_flops;
  l.backward_input_flops = k.backward_input_flops;
  l.backward_weight_flops = k.backward_weight_flops;
  l.kernels = {k};
  const double tf = 2e-6 + 1e-6, ti = 2e-6 + 2e-6, tw = 2e-6 + 3e-6;  // one call's device time
  d.kernel_dispatch_s = 0;
  const PassTimes free = *layer_times(l, Precision::AMP_BF16, d, 1);
  CHECK(free.forward == pipegrid::testing::approx(4 * tf));
  CHECK(free.host_forward_s == 0);
  CHECK(free.host_backward_s == 0);
  // At 1 ms per launch the host bounds every group: the forward ends at 3 D + tf, the backward's
  // input-gradient group at 3 D + ti with the host at 4 D, its weight-gradient group at 7 D + tw.
  const double D = 1e-3;
  d.kernel_dispatch_s = D;
  const PassTimes bound = *layer_times(l, Precision::AMP_BF16, d, 1);
  CHECK(bound.forward == pipegrid::testing::approx(3 * D + tf));
  CHECK(bound.backward() == pipegrid::testing::approx(7 * D + tw));
  CHECK(bound.host_forward_s == pipegrid::testing::approx(3 * D + tf - 4 * tf));
  CHECK(bound.host_backward_s == pipegrid::testing::approx(7 * D + tw - 4 * ti - 4 * tw));
}

TEST_CASE("an fp8 training keeps the router and the output layer in bf16, bf16's weights, fp8 GEMM inputs") {
  const ModelInfo* info = *find_model("mixtral-8x7b");
  Workload bf = *build_model(*info, {}, Precision::AMP_BF16);
  Workload f8 = *build_model(*info, {}, Precision::AMP_FP8);
  REQUIRE(bf.layer_count() == f8.layer_count());
  int moe_blocks = 0;
  for (size_t i = 0; i < bf.layer_count(); ++i) {
    const Layer &a = bf.layer(i), &b = f8.layer(i);
    INFO(b.name);
    CHECK(a.parameter_bytes == b.parameter_bytes);  // fp32 master weights, bf16 working copy, as amp-bf16
    // Transformer Engine keeps an fp8 GEMM's input at 1 byte (its column-wise copy): per token QKV's and
    // the projection's (h 4096, q 32 x 128) and the top-2 copies' two expert inputs (h, FFN 14336).
    const double fp8_inputs =
        b.kind == "moe_block" ? (4096 + 4096 + 2 * (4096 + 14336.0)) * b.split.sequence : 0;
    CHECK(a.stash_bytes - b.stash_bytes == fp8_inputs);
    int bf16_gemms = 0, fp8_gemms = 0;
    for (const Kernel& k : b.kernels)
      if (k.cls == KernelClass::Gemm || k.cls == KernelClass::GroupedGemm) (k.fp8 ? fp8_gemms : bf16_gemms)++;
    if (b.kind == "moe_block") {
      ++moe_blocks;
      CHECK(bf16_gemms == 1);  // the router (Megatron's router is not a Transformer Engine layer)
      CHECK(fp8_gemms == 4);   // QKV, the projection, the experts' two grouped GEMMs (gate and up fused)
    }
    if (b.name == "lm_head") CHECK(fp8_gemms == 0);
  }
  CHECK(moe_blocks == 32);
}
