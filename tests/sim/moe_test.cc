// Mixture-of-experts with expert parallelism replayed in SimGrid, against iteration times computed by
// hand: one MoE block of two experts (top-1) on two devices, each holding one expert.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "core/experiment.h"
#include "core/metrics.h"
#include "core/models/builder.h"
#include "core/planner.h"
#include "core/planners/search3d.h"
#include "core/stage_costs.h"
#include "core/tensor_parallel.h"
#include "core/topologies/generators.h"
#include "sim/replay.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

constexpr double kPeak = 100e12;  // FLOP/s, fp16; efficiency 1, no startup, memory traffic free
constexpr double kS = 512, kH = 1024, kHeads = 16, kF = 4096, kEb = 2;

// One MoE block (`experts` experts of an ungated FFN kF, top-1; attention with 16 heads, no biases,
// RMSNorm, unfused non-causal core) over an input of [s, h], fp16, no optimizer time; `blocks` of them
// in a row.
Workload one_moe_block(int experts = 2, int top_k = 1, int groups = 0, int top_groups = 0, int blocks = 1) {
  ModelBuilder b("moe", Precision::FP16);
  int x = b.input("x", {static_cast<int64_t>(kS), static_cast<int64_t>(kH)});
  TensorSplit s;
  s.kind = TensorSplitKind::MoeBlock;
  s.heads = s.kv_heads = kHeads;
  s.ffn = kF;
  s.gated = false;
  s.biases = false;
  s.moe = {static_cast<double>(experts), static_cast<double>(top_k),     kF, 0, false,
           static_cast<double>(groups),  static_cast<double>(top_groups)};
  for (int i = 0; i < blocks; ++i)
    x = *b.decoder_block(blocks == 1 ? "block" : fmt::format("block{}", i), x, s);
  Workload w = b.finish();
  w.optimizer_step_s = 0;
  return w;
}

DeviceSpec flop_device() {
  DeviceSpec d = test_device();
  d.peak_flops[static_cast<int>(Precision::FP16)] = kPeak;
  return d;
}

// One iteration, one micro-batch of one sample per device, every device a replica of the one stage and
// the block's expert-parallel group of all of them. Returns {makespan, transfers in the graph}.
std::pair<double, size_t> replayed_graph(Cluster c, const std::vector<double>& shares,
                                         MoeOptions::AllToAllFlows flows = MoeOptions::AllToAllFlows::Auto,
                                         int experts = 2, int top_k = 1,
                                         MoeDispatcher dispatcher = MoeDispatcher::AllToAll,
                                         std::pair<int, int> groups = {0, 0}) {
  const int n = static_cast<int>(c.devices.size());
  for (Device& d : c.devices) d.spec = flop_device();
  Experiment e;
  e.name = "moe";
  e.workload = one_moe_block(experts, top_k, groups.first, groups.second);
  e.cluster = std::move(c);
  e.micro_batch_size = n;
  e.strategy.moe.dispatcher = dispatcher;
  e.strategy.partitioner = "uniform";
  e.strategy.schedule = "1f1b";
  e.strategy.micro_batches = 1;
  e.strategy.stages = 1;
  e.strategy.replicas = n;
  e.strategy.expert_parallel = n;
  e.strategy.moe.expert_shares = shares;
  e.strategy.moe.all_to_all = flows;
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), run.error().message);
  size_t transfers = 0;
  for (const Task& t : run->graph.tasks) transfers += t.kind == TaskKind::Transfer;
  Result<sim::Replay> r = process::replay_isolated(e.cluster, run->graph);
  REQUIRE(r.ok());
  return {r->timeline.makespan(), transfers};
}
// One stage whose n devices are its replicas, one micro-batch of a sample per device, experts over
// expert-parallel groups of ep.
Experiment expert_parallel_stage(std::string name, Workload w, Cluster c, int ep) {
  Experiment e;
  e.name = std::move(name);
  e.workload = std::move(w);
  e.micro_batch_size = static_cast<int>(c.devices.size());
  e.strategy.replicas = static_cast<int>(c.devices.size());
  e.cluster = std::move(c);
  e.strategy.partitioner = "uniform";
  e.strategy.schedule = "1f1b";
  e.strategy.micro_batches = 1;
  e.strategy.stages = 1;
  e.strategy.expert_parallel = ep;
  return e;
}

double replayed(Cluster c, const std::vector<double>& shares = {}) {
  return replayed_graph(std::move(c), shares).first;
}

// The same run as the 3D search estimates it (core/planners/search3d.h: one representative, the
// all-to-all in closed form): its one candidate t 1, p 1, d n, ep n, b 1 of a global batch of n.
double estimated(Cluster c, const std::vector<double>& shares = {}, int experts = 2, int top_k = 1,
                 MoeDispatcher dispatcher = MoeDispatcher::AllToAll) {
  const int n = static_cast<int>(c.devices.size());
  for (Device& d : c.devices) d.spec = flop_device();
  Experiment e;
  e.name = "moe";
  e.workload = one_moe_block(experts, top_k);
  e.cluster = std::move(c);
  e.strategy.moe.expert_shares = shares;
  Search3dOptions o;
  o.global_batch = n;
  o.tensor_parallel = {1};
  o.pipeline = {1};
  o.micro_batch_sizes = {1};
  o.schedules = {"1f1b"};
  o.recompute = {Recompute::None};
  o.sequence_parallel = {false};
  o.distributed_optimizer = {false};
  o.expert_parallel = {n};
  o.expert_tensor_parallel = {1};
  o.dispatchers = {dispatcher};
  Result<Search3dResult> r = search3d(e, o);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  REQUIRE(r->ranked.size() == 1);
  return r->ranked[0].iteration_time_s;
}

// By hand, per device and sample (FLOP = 2 MAC; the backward twice the forward; memory-bound kernels
// free on this device): before the dispatch, QKV 6 s h^2, the core 4 s^2 h, the projection 2 s h^2 and
// the router 2 s h E; the experts on the device's s copies at balanced load, 4 s h f.
double before_experts() {
  return (8 * kS * kH * kH + 4 * kS * kS * kH + 2 * kS * kH * 2) / kPeak;
}
double experts() {
  return 4 * kS * kH * kF / kPeak;
}
// The dispatch and the combine move each device's s h fp16 elements x its share for the other device.
double all_to_all(double share, double bandwidth, double latency) {
  return latency + share * kS * kH * kEb / bandwidth;
}
// The dense gradients (attention 4 h^2 + h, router 2 h, norm h) all-reduced by a ring of two: two steps
// of half the bytes each way. The expert gradients have no replica to reduce with (edp = 1).
double allreduce(double bandwidth, double latency) {
  const double bytes = (4 * kH * kH + 4 * kH) * kEb;
  return 2 * latency + bytes / bandwidth;
}

}  // namespace

TEST_CASE("MoE, two experts on two devices joined by one link, balanced: both all-to-alls by hand") {
  const double B = 50e9, a = 5e-6;
  // Forward: [attention, router] dispatch [expert] combine [rest: free]; backward the mirror, twice
  // the compute; then the dense all-reduce.
  const double a2a = all_to_all(0.5, B, a);
  const double expected = 3 * (before_experts() + experts()) + 4 * a2a + allreduce(B, a);
  CHECK(close_rel(replayed(line_cluster(2, B, a)), expected, 1e-6));
  // The 3D search's estimate of the same run.
  CHECK(close_rel(estimated(line_cluster(2, B, a)), expected, 1e-6));
}

TEST_CASE("MoE, 3:1 routing skew: the busier expert's device sets the pace, by hand") {
  const double B = 50e9, a = 5e-6;
  // Expert 0 (device 0) takes 3/4 of the copies: device 1 sends it 3/4 of its tokens, device 0 sends
  // 1/4; the link is full duplex, so each all-to-all takes the 3/4 flow's time. Device 0 computes
  // 1.5x the balanced experts, device 1 0.5x, and the combine waits for device 0.
  const double a2a = all_to_all(0.75, B, a);
  const double expected = 3 * (before_experts() + 1.5 * experts()) + 4 * a2a + allreduce(B, a);
  CHECK(close_rel(replayed(line_cluster(2, B, a), {0.75, 0.25}), expected, 1e-6));
  // The 3D search's estimate: the busier rank as the representative, its port carrying 3/4.
  CHECK(close_rel(estimated(line_cluster(2, B, a), {0.75, 0.25}), expected, 1e-6));
}

TEST_CASE(
    "MoE, all-to-all overlap without a pipeline: Megatron-Core's combined order, the pairs' all-to-alls "
    "hidden") {
  // Three micro-batches on one stage of two replicas (ep 2, one link). Megatron-Core's schedule without
  // pipelining under --overlap-moe-expert-parallel-comm (combined_1f1b.py's docstring): micro-batch 0's
  // forward alone, then each forward with the previous micro-batch's backward, the last backward alone.
  const double B = 50e9, a = 5e-6;
  const int m = 3;
  auto run = [&](bool overlap) {
    Cluster c = line_cluster(2, B, a);
    for (Device& d : c.devices) d.spec = flop_device();
    Experiment e;
    e.name = "moe overlap";
    e.workload = one_moe_block();
    e.cluster = std::move(c);
    e.micro_batch_size = 2;
    e.strategy.partitioner = "uniform";
    e.strategy.schedule = "1f1b";
    e.strategy.micro_batches = m;
    e.strategy.stages = 1;
    e.strategy.replicas = 2;
    e.strategy.expert_parallel = 2;
    e.strategy.moe_overlap = overlap;
    Result<PreparedRun> prepared = prepare(e);
    REQUIRE_MESSAGE(prepared.ok(), prepared.error().message);
    Result<sim::Replay> r = process::replay_isolated(e.cluster, prepared->graph);
    REQUIRE(r.ok());
    // The most activation bytes device 0 holds at once.
    double peak = 0;
    const std::vector<MemoryTrace> traces = memory_traces(prepared->graph, r->timeline);
    for (const MemoryPoint& x : traces[0])
      peak = std::max(peak, x.bytes[static_cast<int>(MemoryCategory::Activations)]);
    return std::make_tuple(r->timeline.makespan(), prepared->schedule, peak);
  };
  const auto [off, plain, stash] = run(false);  // one micro-batch at a time: its stash, S
  const auto [on, combined, on_peak] = run(true);
  for (size_t d = 0; d < 2; ++d) {
    std::string order;
    for (const Action& x : combined.device_actions[d]) order += to_string(x) + " ";
    CHECK(order == "0F0 0F1 0B0 0F2 0B1 0B2 ");
    CHECK(combined.paired[d] == std::vector<char>{0, 1, 0, 1, 0, 0});
    CHECK(plain.paired.empty());
  }
  // Without the overlap every micro-batch's four all-to-alls are exposed (the hand count of the test
  // above, m times). With it only the lone forward's two and the lone backward's two are: inside a
  // pair each all-to-all (15.5 us) runs beside the other micro-batch's compute piece (54-172 us).
  const double a2a = all_to_all(0.5, B, a), compute = 3 * (before_experts() + experts());
  CHECK(close_rel(off, m * (compute + 4 * a2a) + allreduce(B, a), 1e-6));
  CHECK(close_rel(on, m * compute + 4 * a2a + allreduce(B, a), 1e-6));
  // Memory: in a pair the forward stashes piece by piece (3 pieces: before the dispatch, the experts,
  // after the combine) while the backward frees piece by piece, the backward's first, so the pair holds
  // S - S/3 + S/3 = S at most, one micro-batch's stash, as without the overlap (not 2 S).
  REQUIRE(stash > 0);
  CHECK(close_rel(on_peak, stash, 1e-12));
}

TEST_CASE("MoE at t = ep = 1: a capacity factor drops copies before the experts, by hand") {
  // One device holds both experts (no all-to-all, no gradient to reduce). Capacity is cf x the
  // balanced share of the copies (Megatron's get_capacity, cf s k / E per expert): at cf 0.5 each
  // expert keeps s / 4 of its s / 2 copies, so the experts run on half the copies; at cf 1 under a
  // 3:1 skew expert 0 keeps s / 2 of its 3 s / 4 and expert 1 all its s / 4, three quarters. Until
  // 2026-12-05 a stage without tensor, context or expert parallelism ignored the factor.
  auto run = [](double cf, std::vector<double> shares) {
    Cluster c = line_cluster(1, 50e9, 5e-6);
    for (Device& d : c.devices) d.spec = flop_device();
    Experiment e = expert_parallel_stage("moe capacity", one_moe_block(), std::move(c), 1);
    e.strategy.moe.capacity_factor = cf;
    e.strategy.moe.expert_shares = std::move(shares);
    Result<PreparedRun> prepared = prepare(e);
    REQUIRE_MESSAGE(prepared.ok(), prepared.error().message);
    Result<sim::Replay> r = process::replay_isolated(e.cluster, prepared->graph);
    REQUIRE(r.ok());
    return r->timeline.makespan();
  };
  CHECK(close_rel(run(0, {}), 3 * (before_experts() + experts()), 1e-6));
  CHECK(close_rel(run(0.5, {}), 3 * (before_experts() + 0.5 * experts()), 1e-6));
  CHECK(close_rel(run(1, {}), 3 * (before_experts() + experts()), 1e-6));  // nothing dropped
  CHECK(close_rel(run(1, {0.75, 0.25}), 3 * (before_experts() + 0.75 * experts()), 1e-6));
}

TEST_CASE("MoE, the same expert-parallel group across two nodes: slower by the hand-computed amount") {
  const double B = 50e9, a = 5e-6;
  // Across two nodes: each device's NIC link (12.5 GB/s, 2 us) to one switch, routes of two links.
  const double Bn = 12.5e9, an = 2e-6;
  Cluster nodes = make_switch_cluster(2, "gpu", test_device(), Bn, an);
  nodes.devices[0].node = "node0";
  nodes.devices[1].node = "node1";
  const double slower =
      4 * (all_to_all(0.5, Bn, 2 * an) - all_to_all(0.5, B, a)) + allreduce(Bn, 2 * an) - allreduce(B, a);
  CHECK(close_rel(replayed(nodes) - replayed(line_cluster(2, B, a)), slower, 1e-6));
  CHECK(close_rel(estimated(nodes) - estimated(line_cluster(2, B, a)), slower, 1e-6));
}

TEST_CASE(
    "MoE, ep 8 over two DGX nodes of four: the node-aggregated all-to-all replays as the pairwise one") {
  // Eight experts, one per device, balanced: each all-to-all is 8 x 7 flows pairwise, 8 x 2 aggregated
  // (one to the next device of the node, one to the same position in the other node), four of them
  // (dispatch and combine, forward and backward); nothing else is on the links meanwhile.
  DgxSpec spec;
  spec.gpu = test_device();
  spec.nodes = 2;
  spec.gpus_per_node = 4;
  const Cluster dgx = *make_dgx_cluster(spec);
  using Flows = MoeOptions::AllToAllFlows;
  auto [pair_t, pair_n] = replayed_graph(dgx, {}, Flows::Pairwise, 8);
  auto [node_t, node_n] = replayed_graph(dgx, {}, Flows::ByNode, 8);
  CHECK(pair_n - node_n == 4 * 8 * (7 - 2));
  CHECK(close_rel(node_t, pair_t, 1e-9));
  // The default keeps one flow per pair below 2^22 all-to-all flows.
  CHECK(replayed_graph(dgx, {}, Flows::Auto, 8).second == pair_n);
  // Skewed routing is always pairwise (the pairs do not exchange alike).
  std::vector<double> skew(8, 0.1);
  skew[0] = 0.3;
  CHECK(replayed_graph(dgx, skew, Flows::ByNode, 8).second == pair_n);
}

TEST_CASE("MoE, DeepEP's de-duplicating dispatch over two nodes of two: the all-to-alls by hand") {
  // Four experts (one per device), top-2, balanced: a token's two experts are one of the C(4, 2) = 6
  // pairs, so a device's expert is among them with probability 1 - C(3, 2) / 6 = 1/2 and a node's two
  // with 1 - C(2, 2) / 6 = 5/6. T = s h fp16 bytes a device routes (one copy each).
  const double T = kS * kH * kEb;
  using Flows = MoeOptions::AllToAllFlows;
  auto run = [](const Cluster& c, MoeDispatcher d) {
    return replayed_graph(c, {}, Flows::Pairwise, 4, 2, d);
  };
  SUBCASE("one switch, one link per device: the forwarding shares the device's link") {
    const double B = 50e9, a = 1e-6;
    Cluster flat = make_switch_cluster(4, "gpu", test_device(), B, a);
    for (int i = 0; i < 4; ++i) flat.devices[static_cast<size_t>(i)].node = i < 2 ? "node0" : "node1";
    // alltoall: 2 T / 4 to each of the 3 peers, 1.5 T on the link. deepep: to the node's other device its
    // own tokens and those it forwards from the other node, T x 1/2 x 2 nodes = T; to the other node's
    // device at its position 5/6 T; the two flows share the link (max-min), 11/6 T in all. Four
    // all-to-alls per iteration (dispatch and combine, forward and backward), nothing else meanwhile.
    const auto [all_t, all_n] = run(flat, MoeDispatcher::AllToAll);
    const auto [dedup_t, dedup_n] = run(flat, MoeDispatcher::DeepEP);
    CHECK(all_n - dedup_n == 4 * 4 * (3 - 2));
    CHECK(close_rel(dedup_t - all_t, 4 * (11.0 / 6 - 1.5) * T / B, 1e-6));
  }
  SUBCASE("DGX nodes: NVLink inside, one NIC per GPU across; the replay and the search's estimate") {
    DgxSpec spec;
    spec.gpu = test_device();
    spec.nodes = 2;
    spec.gpus_per_node = 2;
    const Cluster dgx = *make_dgx_cluster(spec);
    const double nic = spec.infiniband.bandwidth;
    // The NIC sets the pace in both: alltoall sends 2 x T/2 across, deepep 5/6 T (its T over NVLink runs
    // at the same time and ends first).
    const double faster = 4 * (T - 5.0 / 6 * T) / nic;
    // A difference of two 1 ms replays: SimGrid's timing precision (1e-9 s here) is 2e-6 of the 28 us.
    CHECK(close_rel(run(dgx, MoeDispatcher::AllToAll).first - run(dgx, MoeDispatcher::DeepEP).first, faster,
                    1e-5));
    // Group-limited routing: 8 experts in 4 groups of 2, top-2 from 2 groups; a device holds one group
    // (hit 1 - 3/6 - 3/6 x C(2,2) / C(4,2) = 5/12), a node two (hit 13/18, tests/core/collectives_test.cc).
    auto limited = [&](MoeDispatcher d) {
      return replayed_graph(dgx, {}, Flows::Pairwise, 8, 2, d, {4, 2}).first;
    };
    CHECK(close_rel(limited(MoeDispatcher::AllToAll) - limited(MoeDispatcher::DeepEP),
                    4 * (T - 13.0 / 18 * T) / nic, 1e-5));
    CHECK(close_rel(
        estimated(dgx, {}, 4, 2, MoeDispatcher::AllToAll) - estimated(dgx, {}, 4, 2, MoeDispatcher::DeepEP),
        faster, 1e-6));
  }
}

TEST_CASE(
    "MoE memory: expert weights, gradients and ZeRO-1 state per device over ep and the expert data-parallel "
    "group") {
  // Eight experts on eight devices (one stage, d = 8), mixed-precision Adam (2 + 2 bytes of weights and
  // gradients, 12 of fp32 master weights and moments per parameter), ZeRO-1. By hand: the dense
  // parameters (attention 4 h^2 + LN1 h, router h E, LN2 h) on every device, their state over d = 8;
  // E / ep experts of 2 h f each, their state over the expert data-parallel group of 8 / ep.
  const double dense = 4 * kH * kH + kH + kH * 8 + kH, expert = 2 * kH * kF;
  for (int ep : {8, 4, 2}) {
    INFO("ep " << ep);
    Cluster c = make_switch_cluster(8, "gpu", test_device(), 50e9, 1e-6);
    for (Device& d : c.devices) d.spec = flop_device();
    Experiment e = expert_parallel_stage("moe memory", one_moe_block(8), std::move(c), ep);
    e.memory.optimizer = Optimizer::MixedAdam;
    e.memory.zero1 = true;
    Result<PreparedRun> run = prepare(e);
    REQUIRE_MESSAGE(run.ok(), run.error().message);
    const double local = 8.0 / ep * expert, edp = 8.0 / ep;
    for (int dev = 0; dev < 8; ++dev) {
      const MemoryBytes& m = run->graph.static_memory[static_cast<size_t>(dev)];
      CHECK(close_rel(m[static_cast<int>(MemoryCategory::Weights)], 2 * (dense + local), 1e-12));
      CHECK(close_rel(m[static_cast<int>(MemoryCategory::Gradients)], 2 * (dense + local), 1e-12));
      CHECK(close_rel(m[static_cast<int>(MemoryCategory::OptimizerState)], 12 * dense / 8 + 12 * local / edp,
                      1e-12));
    }
  }
}

// The host's synchronisation in a MoE block's program (core/stage_costs.cc, tp_forward): Megatron-Core's
// all-to-all dispatcher waits for the tokens' counts per expert before the experts run in the forward
// (token_dispatcher.py at core_v0.15.0, d2h_event.synchronize() at its cuda_sync_point) and keeps the
// forward's splits in the backward. Two blocks whose attention is long on the device (its efficiency
// 1e-7: about 100 s) and whose other kernels take microseconds, against a host launch of D = 1 s: the
// attention gives the host a lead of about 100 s. A group of n launches takes (n - 1) D where the
// host starts it as the device finishes (afresh, or drained), n D where the host is a launch behind
// (core/device.h, HostStream::issue). In the forward the experts' piece after an attention waits for
// the drain: (n - 1) D, where without it it would run on the lead in microseconds. In the backward the
// first block's experts do run on the lead the second block's attention left, while the second
// block's, after a short host-bound piece, take n D.
TEST_CASE("host: synchronised before the experts in a MoE block's forward, carried through its backward") {
  const double D = 1.0;
  Cluster c = line_cluster(2, 100e9, 1e-6);
  for (Device& d : c.devices) {
    d.spec = flop_device();
    d.spec.compute_efficiency[static_cast<int>(Precision::FP16)][static_cast<int>(KernelClass::Attention)] =
        1e-7;
    d.spec.kernel_dispatch_s = D;
    d.spec.kernel_startup_s = 1e-6;
    d.spec.layer_overhead_s = 0;
  }
  Experiment e = expert_parallel_stage("moe host", one_moe_block(2, 1, 0, 0, 2), std::move(c), 2);
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), run.error().message);
  const TensorParallelOptions o = tensor_parallel_options(e.strategy, e.memory);
  auto costs = stage_costs(e.workload, e.cluster, run->partition, e.micro_batch_size, Recompute::None, o);
  REQUIRE_MESSAGE(costs.ok(), costs.error().message);
  const StageCost& sc = (*costs)[0][0];
  // Per block a dispatch and a combine: five compute segments per pass, the experts' the second and
  // the fourth.
  REQUIRE(sc.tp_forward.compute.size() == 5);
  REQUIRE(sc.tp_backward.compute.size() == 5);
  // The experts' launches per pass, from their piece timed alone (afresh) on the host-bound device:
  // (n - 1) D.
  Result<TpLayer> block =
      tensor_parallel_layer(e.workload.layer(1), 1, o, e.workload.precision, ExpertSizes{2, 1});
  REQUIRE(block.ok());
  double forward_launches = 0, backward_launches = 0;
  for (const TpPiece& piece : block->forward)
    if (piece.expert_load) {
      Layer experts;
      experts.name = "experts";
      experts.kernels = piece.kernels;
      for (const Kernel& k : piece.kernels) {
        experts.forward_flops += k.forward_flops;
        experts.backward_input_flops += k.backward_input_flops;
        experts.backward_weight_flops += k.backward_weight_flops;
      }
      const PassTimes t = *layer_times(experts, e.workload.precision, e.cluster.devices[0].spec, 1);
      forward_launches = std::round(t.forward / D) + 1;
      backward_launches = std::round(t.backward() / D) + 1;
    }
  REQUIRE(forward_launches >= 2);
  REQUIRE(backward_launches >= 2);
  const std::vector<double>& f = sc.tp_forward.compute;
  const std::vector<double>& g = sc.tp_backward.compute;
  REQUIRE(f[0] > 50);                                        // the first block's attention, device-bound
  CHECK(close_rel(f[1], (forward_launches - 1) * D, 1e-3));  // drained after the attention's lead
  REQUIRE(f[2] > 50);                                        // the second block's attention
  CHECK(close_rel(f[3], (forward_launches - 1) * D, 1e-3));
  CHECK(close_rel(g[1], backward_launches * D, 1e-3));  // the second block's: after a short piece
  REQUIRE(g[2] > 50);                                   // the second block's attention backward
  CHECK(g[3] < 1e-3 * D);                               // the first block's: on that lead
  CHECK(g[3] > 0);
}
