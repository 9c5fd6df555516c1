// Context parallelism replayed in SimGrid against iteration times computed by hand: one causal
// Transformer block of s tokens on cp = 2 devices joined by one full-duplex link, under each of
// Megatron-Core's p2p, all_gather and a2a (core/context_parallel.h), and the per-rank work of the
// load-balanced and the contiguous split.
#include <doctest/doctest.h>

#include <algorithm>

#include "core/experiment.h"
#include "core/metrics.h"
#include "core/models/builder.h"
#include "core/planners/search3d.h"
#include "core/topologies/generators.h"
#include "sim/replay.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

constexpr double kPeak = 100e12;  // FLOP/s, fp16; efficiency 1, no startup, memory traffic free
constexpr double kS = 512, kH = 1024, kHeads = 16, kF = 4096, kEb = 2;
constexpr double kL = kS / 2;  // tokens per device

Workload one_block() {
  return causal_block(kS, kH, kHeads, kF);
}

Experiment experiment(CpAlgorithm a, bool balanced) {
  Experiment e;
  e.name = "cp";
  e.workload = one_block();
  e.cluster = line_cluster(2, 50e9, 5e-6);
  for (Device& d : e.cluster.devices) {
    d.spec = test_device();
    d.spec.peak_flops[static_cast<int>(Precision::FP16)] = kPeak;
  }
  e.micro_batch_size = 1;
  e.strategy.partitioner = "uniform";
  e.strategy.schedule = "1f1b";
  e.strategy.micro_batches = 1;
  e.strategy.stages = 1;
  e.strategy.context_parallel = 2;
  e.strategy.context = {a, balanced};
  return e;
}

struct Replayed {
  double time = 0;
  std::vector<double> busy;  // per device
  size_t cp_flows = 0;
  double cp_bytes = 0;
};

Replayed replayed(CpAlgorithm a, bool balanced = true) {
  Experiment e = experiment(a, balanced);
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), run.error().message);
  Result<sim::Replay> r = process::replay_isolated(e.cluster, run->graph);
  REQUIRE(r.ok());
  Replayed out;
  out.time = r->timeline.makespan();
  const Metrics m = compute_metrics(e.cluster, run->graph, r->timeline);
  for (const DeviceMetrics& d : m.devices) out.busy.push_back(d.busy_s);
  for (const Task& t : run->graph.tasks)
    if (t.transfer == TransferKind::ContextParallel) {
      ++out.cp_flows;
      out.cp_bytes += t.bytes;
    }
  return out;
}

// The same run as the 3D search estimates it (core/planners/search3d.h: one representative, each
// exchange folded into its pass): its one candidate t 1, cp 2, p 1, d 1, b 1.
double estimated(CpAlgorithm a) {
  Experiment e = experiment(a, true);
  e.strategy.context_parallel = 1;  // the search sets it
  Search3dOptions o;
  o.global_batch = 1;
  o.tensor_parallel = {1};
  o.pipeline = {1};
  o.context_parallel = {2};
  o.cp_algorithms = {a};
  o.schedules = {"1f1b"};
  o.recompute = {Recompute::None};
  o.sequence_parallel = {false};
  o.distributed_optimizer = {false};
  Result<Search3dResult> r = search3d(e, o);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  REQUIRE(r->ranked.size() == 1);
  CHECK(r->ranked[0].cp == 2);
  return r->ranked[0].iteration_time_s;
}

// By hand, per device (FLOP = 2 MAC; every backward twice its forward; memory-bound kernels free).
// A block of scores: the device's s/2 queries against s/2 keys, 4 (s/2)^2 h FLOPs unmasked.
const double kBlock = 4 * kL * kL * kH / kPeak;
const double kQkv = 6 * kL * kH * kH / kPeak;                        // QKV projection
const double kRest = (2 * kL * kH * kH + 4 * kL * kH * kF) / kPeak;  // output projection, MLP
double link(double bytes) {
  return 5e-6 + bytes / 50e9;
}
// The gradients (attention 4 h^2, two norms 2 h, MLP 2 h f) all-reduced by a ring of two over the
// data x context-parallel group: two steps of half the bytes each way.
const double kAllReduce = 2 * 5e-6 + (4 * kH * kH + 2 * kH + 2 * kH * kF) * kEb / 50e9;
const double kKv = 2 * kL * kH * kEb;  // K and V of a device's tokens

}  // namespace

TEST_CASE(
    "context parallelism p2p, cp = 2 on one link: ring steps overlapped with the core's steps, by hand") {
  // Balanced causal split: each device's two steps are half a block each. Forward: [QKV] ring step
  // (K/V to the other device) beside [step 0], then [step 1, rest]. Backward: [rest] K/V step beside
  // [step 0], [step 1], then the dK/dV back to their owner (exposed), [QKV].
  const double step = kBlock / 2;
  const double forward = kQkv + std::max(step, link(kKv)) + step + kRest;
  const double backward = 2 * kRest + std::max(2 * step, link(kKv)) + 2 * step + link(kKv) + 2 * kQkv;
  const Replayed r = replayed(CpAlgorithm::P2P);
  CHECK(close_rel(r.time, forward + backward + kAllReduce, 1e-9));
  CHECK(close_rel(estimated(CpAlgorithm::P2P), forward + backward + kAllReduce, 1e-9));
  // One ring step forward, two backward, each a flow per device.
  CHECK(r.cp_flows == 6);
  CHECK(close_rel(r.cp_bytes, 6 * kKv, 1e-12));
}

TEST_CASE(
    "context parallelism all_gather, cp = 2 on one link: the K/V all-gather and dK/dV reduce-scatter "
    "exposed, by hand") {
  // Forward: [QKV] all-gather K, V [core on all keys: one block, rest]; backward: [rest] all-gather
  // again [core] reduce-scatter dK, dV [QKV]. On two devices each moves one device's K/V each way.
  const double forward = kQkv + link(kKv) + kBlock + kRest;
  const double backward = 2 * kRest + link(kKv) + 2 * kBlock + link(kKv) + 2 * kQkv;
  const Replayed r = replayed(CpAlgorithm::AllGather);
  CHECK(close_rel(r.time, forward + backward + kAllReduce, 1e-9));
  CHECK(close_rel(estimated(CpAlgorithm::AllGather), forward + backward + kAllReduce, 1e-9));
  CHECK(r.cp_flows == 6);
  CHECK(close_rel(r.cp_bytes, 6 * kKv, 1e-12));
}

TEST_CASE("context parallelism a2a (Ulysses), cp = 2 on one link: Q, K, V and O all-to-alls, by hand") {
  // Each device sends the other half of its Q, K, V (the other device's heads) before the core and
  // half of its output after; the core runs the whole causal sequence on half the heads (one block).
  const double qkv = 3 * kL * kH * kEb, out = kL * kH * kEb;
  const double forward = kQkv + link(qkv / 2) + kBlock + link(out / 2) + kRest;
  const double backward = 2 * kRest + link(out / 2) + 2 * kBlock + link(qkv / 2) + 2 * kQkv;
  const Replayed r = replayed(CpAlgorithm::AllToAll);
  CHECK(close_rel(r.time, forward + backward + kAllReduce, 1e-9));
  CHECK(close_rel(estimated(CpAlgorithm::AllToAll), forward + backward + kAllReduce, 1e-9));
  CHECK(r.cp_flows == 8);
  CHECK(close_rel(r.cp_bytes, 2 * 2 * (qkv + out) / 2, 1e-12));
}

TEST_CASE("context parallelism p2p: the load-balanced ranks do equal work, the contiguous split's do not") {
  const Replayed balanced = replayed(CpAlgorithm::P2P, true);
  REQUIRE(balanced.busy.size() == 2);
  CHECK(close_rel(balanced.busy[0], balanced.busy[1], 1e-12));
  // Contiguous: rank 0 attends only to its own triangle (half a block); rank 1 to its triangle and
  // all of rank 0's keys (1.5 blocks). Forward and backward: 3 x the difference of one block.
  const Replayed naive = replayed(CpAlgorithm::P2P, false);
  CHECK(close_rel(naive.busy[1] - naive.busy[0], 3 * kBlock, 1e-9));
  // The same work overall: half of the s^2 scores.
  CHECK(close_rel(naive.busy[0] + naive.busy[1], balanced.busy[0] + balanced.busy[1], 1e-9));
  CHECK(naive.time > balanced.time);
}
