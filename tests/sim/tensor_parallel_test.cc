// Tensor parallelism replayed in SimGrid, against iteration times computed by hand.
#include <doctest/doctest.h>

#include "core/experiment.h"
#include "core/metrics.h"
#include "core/models/builder.h"
#include "core/topologies/generators.h"
#include "sim/replay.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

constexpr double kPeak = 100e12;  // FLOP/s, fp16; efficiency 1, no startup, no memory limit
constexpr double kS = 512, kH = 1024, kHeads = 16, kB = 2;

// Two transformer blocks (FFN 4h) over an input of [s, h], fp16, no optimizer time.
Workload two_blocks() {
  ModelBuilder b("two-blocks", Precision::FP16);
  int x = b.input("x", {static_cast<int64_t>(kS), static_cast<int64_t>(kH)});
  x = *b.transformer_block("block0", x, static_cast<int64_t>(kHeads), static_cast<int64_t>(4 * kH));
  x = *b.transformer_block("block1", x, static_cast<int64_t>(kHeads), static_cast<int64_t>(4 * kH));
  Workload w = b.finish();
  w.optimizer_step_s = 0;
  return w;
}

DeviceSpec flop_device() {
  DeviceSpec d = test_device();
  d.peak_flops[static_cast<int>(Precision::FP16)] = kPeak;
  return d;
}

// The hand cases below are Megatron-LM before 2021-08-30, each collective after both GEMMs of its
// linear's backward (tp_wgrad_overlap: false); the last case runs them beside the weight gradients.
Metrics replayed_metrics(Cluster c, int micro_batches = 1, bool sequence_parallel = false,
                         bool wgrad_overlap = false) {
  Experiment e;
  e.name = "tp";
  e.workload = two_blocks();
  e.cluster = std::move(c);
  e.micro_batch_size = kB;
  e.strategy.partitioner = "megatron";
  e.strategy.schedule = "1f1b";
  e.strategy.micro_batches = micro_batches;
  e.strategy.stages = 1;
  e.strategy.tensor_parallel = 2;
  e.strategy.sequence_parallel = sequence_parallel;
  e.strategy.tp_wgrad_overlap = wgrad_overlap;
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), run.error().message);
  Result<sim::Replay> r = process::replay_isolated(e.cluster, run->graph);
  REQUIRE(r.ok());
  return compute_metrics(e.cluster, run->graph, r->timeline);
}

double replayed(Cluster c, int micro_batches = 1, bool sequence_parallel = false,
                bool wgrad_overlap = false) {
  return replayed_metrics(std::move(c), micro_batches, sequence_parallel, wgrad_overlap).iteration_time_s;
}

Cluster two_devices_one_link(double bandwidth, double latency) {
  Cluster c = line_cluster(2, bandwidth, latency);
  for (Device& d : c.devices) d.spec = flop_device();
  return c;
}

// By hand (Megatron's FLOP counts per layer and sample: QKV 6 s h^2, projection 2 s h^2, scores and
// their product with V 4 s^2 h, MLP 16 s h^2; each split between the t = 2 devices; the backward twice
// the forward; memory-bound kernels free on this device). Per micro-batch of b samples, each device
// runs the forward of both blocks (attention piece, all-reduce, MLP piece, all-reduce), then the
// backward (MLP piece, all-reduce, attention piece, all-reduce, for each block): 8 all-reduces of
// b s h fp16 elements. Each is one flow per device of 2 (t - 1) / t x S = S bytes on the link (full
// duplex: the two flows go opposite ways), S / B, plus the link latency once.
double forward_compute() {
  const double attn = (8 * kS * kH * kH + 4 * kS * kS * kH) / 2 * kB / kPeak;
  const double mlp = 16 * kS * kH * kH / 2 * kB / kPeak;
  return 2 * (attn + mlp);
}
double allreduce_bytes() {
  return kB * kS * kH * 2;
}

}  // namespace

TEST_CASE("tensor parallelism: a two-block stage at t = 2 on two devices joined by one link, by hand") {
  const double B = 50e9;
  const double expected = 3 * forward_compute() + 8 * allreduce_bytes() / B;
  CHECK(close_rel(replayed(two_devices_one_link(B, 0)), expected, 1e-6));
  // With a latency a, each merged flow pays it once (the ring's two steps would pay it twice).
  const double a = 3e-6;
  CHECK(close_rel(replayed(two_devices_one_link(B, a)), expected + 8 * a, 1e-6));
}

TEST_CASE("tensor parallelism: the same group split across two nodes is slower by 8 S (1/B' - 1/B)") {
  const double B = 50e9, B2 = 12.5e9;
  Cluster split = make_switch_cluster(2, "gpu", flop_device(), B2, 0);  // through a switch, two links at B'
  const double one_link = replayed(two_devices_one_link(B, 0));
  const double across = replayed(split);
  CHECK(close_rel(across - one_link, 8 * allreduce_bytes() * (1 / B2 - 1 / B), 1e-6));
}

TEST_CASE(
    "tensor parallelism: sequence parallelism moves the same bytes as all-gather/reduce-scatter pairs") {
  // 16 collectives of (t - 1)/t S = S/2 each instead of 8 all-reduces of S: the same time on one link
  // with no latency; the norms, dropouts and residuals are free on this device either way.
  const double B = 50e9;
  CHECK(close_rel(replayed(two_devices_one_link(B, 0), 1, true),
                  3 * forward_compute() + 8 * allreduce_bytes() / B, 1e-6));
}

TEST_CASE("tensor parallelism: 1F1B over micro-batches runs them back to back on one stage") {
  const double B = 50e9;
  const double one = 3 * forward_compute() + 8 * allreduce_bytes() / B;
  CHECK(close_rel(replayed(two_devices_one_link(B, 0), 3), 3 * one, 1e-6));
}

TEST_CASE("tensor parallelism: the time breakdown of the hand case: compute, exposed TP, nothing else") {
  const double B = 50e9;
  const Metrics m = replayed_metrics(two_devices_one_link(B, 0));
  for (const DeviceMetrics& d : m.devices) {
    CHECK(close_rel(d.breakdown.compute_s, 3 * forward_compute(), 1e-6));
    CHECK(close_rel(d.breakdown.tensor_parallel_s, 8 * allreduce_bytes() / B, 1e-6));
    CHECK(d.breakdown.pipeline_s == 0);
    CHECK(d.breakdown.data_parallel_s == 0);
    CHECK(d.breakdown.bubble_s < 1e-9 * m.iteration_time_s);
    CHECK(close_rel(d.breakdown.total(), m.iteration_time_s, 1e-9));
  }
}

TEST_CASE(
    "tensor parallelism: each backward collective beside its column-parallel linear's weight gradient, by "
    "hand") {
  // Megatron-LM's backward of QKV and of the MLP's first GEMM (tp_wgrad_overlap): the input gradient,
  // then the all-reduce beside the weight gradient (6 s h^2 / t and 8 s h^2 / t FLOPs per sample);
  // the block goes on once both are done. At B = 50 GB/s an all-reduce (S / B = 41.9 us) outlasts
  // QKV's weight gradient (32.2 us) and is outlasted by the MLP's (42.9 us): each block saves
  // QKV's weight gradient and one all-reduce.
  const double B = 50e9, S = allreduce_bytes();
  const double qkv_wgrad = 6 * kS * kH * kH / 2 * kB / kPeak, up_wgrad = 8 * kS * kH * kH / 2 * kB / kPeak;
  REQUIRE(qkv_wgrad < S / B);
  REQUIRE(up_wgrad > S / B);
  const double off = replayed(two_devices_one_link(B, 0));
  CHECK(close_rel(off - replayed(two_devices_one_link(B, 0), 1, false, true), 2 * (qkv_wgrad + S / B), 1e-6));
  // With SP the input is re-gathered (S / 2 on the link) beside the input gradient, which outlasts it,
  // and the reduce-scatter (S / 2) runs beside the weight gradient, which outlasts it too: each of the
  // four linears' reduce-scatters is hidden.
  const double sp_off = replayed(two_devices_one_link(B, 0), 1, true);
  CHECK(close_rel(sp_off - replayed(two_devices_one_link(B, 0), 1, true, true), 4 * S / 2 / B, 1e-6));
}
