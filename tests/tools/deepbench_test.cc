// The catalog's V100 against an external measurement: DeepBench's cuDNN LSTM on a DGX-1 V100
// (baidu-research/DeepBench, results/train/DeepBench_NV_V100.xlsx, LSTM rows of the 2018 run, cuDNN
// 7.3.1; experiments/kernels/deepbench/ holds them). DeepBench runs cudnnRNNForwardTraining and
// cudnnRNNBackwardData on one unidirectional layer with CUDNN_SKIP_INPUT (no input projection: each
// step is the recurrent GEMM and the gates), 25 steps, fp16 with CUDNN_TENSOR_OP_MATH or fp32.
#include <doctest/doctest.h>

#include <cmath>

#include "core/device.h"
#include "core/models/builder.h"
#include "tools/input/device_yaml.h"

using namespace pipegrid;
using pipegrid::input::CatalogDevice;
using pipegrid::input::device_catalog;
using pipegrid::input::find_catalog_device;

namespace {

struct Row {
  int hidden, batch;
  double forward_ms, backward_data_ms;  // for 25 steps
};

// Per step: pipegrid's LSTM layer without its input-projection kernel (DeepBench's skip-input
// layer), minus the layer overhead that every pass pays once.
PassTimes per_step(const DeviceSpec& d, Precision p, int hidden, int batch) {
  ModelBuilder b("m", p);
  int x = b.input("x", {25, hidden});
  int l = *b.lstm("lstm", {x}, hidden, false);
  Workload w = b.finish();
  Layer layer = w.layer(l);
  REQUIRE(layer.kernels.size() == 3);
  layer.kernels.erase(layer.kernels.begin());  // the input projection
  PassTimes t = *layer_times(layer, p, d, batch);
  t.forward = (t.forward - d.layer_overhead_s) / 25;
  t.backward_input = (t.backward_input - d.layer_overhead_s) / 25;
  return t;
}

}  // namespace

TEST_CASE("the V100's LSTM step against DeepBench's cuDNN measurements (fp16 and fp32, hidden 1024)") {
  const DeviceSpec v100 = find_catalog_device("v100")->spec;
  // DeepBench's "Results - FP16 ip, Mixed math" and "Results FP32" sheets, hidden 1024, 25 steps.
  const Row fp16[] = {{1024, 16, 1.235, 1.429},
                      {1024, 32, 1.279, 1.484},
                      {1024, 64, 1.391, 1.567},
                      {1024, 128, 1.627, 1.700}};
  const Row fp32[] = {{1024, 16, 1.923, 1.657},
                      {1024, 32, 1.978, 1.746},
                      {1024, 64, 2.205, 2.044},
                      {1024, 128, 3.249, 3.017}};
  auto check = [&](const Row& r, Precision p, double tolerance) {
    const PassTimes t = per_step(v100, p, r.hidden, r.batch);
    const double fwd = r.forward_ms * 1e-3 / 25, bwd = r.backward_data_ms * 1e-3 / 25;
    INFO("hidden " << r.hidden << ", batch " << r.batch << ", " << to_string(p) << ": forward "
                   << t.forward * 1e6 << " us against " << fwd * 1e6 << ", backward "
                   << t.backward_input * 1e6 << " us against " << bwd * 1e6);
    CHECK(std::abs(t.forward / fwd - 1) <= tolerance);
    CHECK(std::abs(t.backward_input / bwd - 1) <= tolerance);
  };
  // GNMT's shape (batch 128 per GPU in DLE's rows), where the V100's fp16 recurrent_step was taken
  // from (31 us: the mean excess of these two rows over the step's kernels): within 3%.
  check(fp16[3], Precision::AMP, 0.03);
  // The other batch sizes at the same hidden size, not used to set it: within 15%.
  for (int i = 0; i < 3; ++i) check(fp16[i], Precision::AMP, 0.15);
  // fp32 has no recurrent_step: GNMT's shape within 10% with the fitted fp32 GEMM efficiency alone.
  check(fp32[3], Precision::FP32, 0.10);
  // At small batches fp32 steps are latency-bound too, and pipegrid is 40-55% fast there (DeepBench
  // 77-88 us per step at batch 16-64): recurrent_step is not set for fp32 because at GNMT's batch the
  // fitted efficiency already covers it. Held here so a change to either shows.
  for (int i = 0; i < 3; ++i) {
    const PassTimes t = per_step(v100, Precision::FP32, fp32[i].hidden, fp32[i].batch);
    CHECK(t.forward < 0.9 * fp32[i].forward_ms * 1e-3 / 25);
  }
  // Keyed by the math precision: amp and fp16 pay it, fp32 and bf16 do not.
  CHECK(v100.recurrent_step(Precision::AMP) == 31e-6);
  CHECK(v100.recurrent_step(Precision::FP16) == 31e-6);
  CHECK(v100.recurrent_step(Precision::FP32) == 0);
  CHECK(v100.recurrent_step(Precision::TF32) == 0);  // runs as fp32 on the V100
  // No other catalog entry has a measured one.
  for (const CatalogDevice& d : device_catalog()) {
    if (d.name == "v100") continue;
    for (Precision p : kMathPrecisions) CHECK(d.spec.recurrent_step(p) == 0);
  }
}
