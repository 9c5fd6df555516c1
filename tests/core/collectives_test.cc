// All-reduce task graphs (structure, readiness), data-parallel replicas in the partitioners and the
// dp baseline, checked by counting and with the contention-free evaluator.
#include "core/collectives.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <map>

#include "core/evaluate.h"
#include "core/lower.h"
#include "core/models/chain.h"
#include "core/moe.h"
#include "core/nccl_tuning.h"
#include "core/strategy.h"
#include "core/topologies/generators.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

TaskGraph empty_graph(const Cluster& c) {
  TaskGraph g;
  g.device_order.resize(c.devices.size());
  g.static_memory.resize(c.devices.size());
  return g;
}

int32_t compute(TaskGraph& g, int device, double duration) {
  Task t;
  t.kind = TaskKind::Backward;
  t.device = device;
  t.duration = duration;
  const int32_t id = g.add(t);
  g.device_order[device].push_back(id);
  return id;
}

// Two DGX-style nodes of `per_node` GPUs: NVLink 300 GB/s to the node's switch, one 25 GB/s NIC per
// GPU into one InfiniBand switch, every link `latency`.
Cluster two_dgx_nodes(int per_node, double latency) {
  DgxSpec s;
  s.nodes = 2;
  s.gpus_per_node = per_node;
  s.gpu = test_device();
  s.nvlink = {300e9, latency};
  s.infiniband = {25e9, latency};
  return *make_dgx_cluster(s);
}

}  // namespace

TEST_CASE("ring all-reduce: 2(n-1) steps of n chunks of S/n - each device sends and receives 2(n-1)") {
  Cluster c = *make_ring_cluster(5, "gpu", test_device(), {1e9, 0});
  TaskGraph g = empty_graph(c);
  auto done =
      append_allreduce(g, AllReduceAlgorithm::Ring, c, {0, 1, 2, 3, 4}, std::vector<int32_t>(5, -1), 1e6, 7);
  REQUIRE(g.tasks.size() == 2 * 4 * 5);
  std::vector<int> sent(5), received(5);
  for (const Task& t : g.tasks) {
    CHECK(t.transfer == TransferKind::DataParallel);
    CHECK(t.stage == 7);
    CHECK(t.bytes == 2e5);
    CHECK(t.peer == (t.device + 1) % 5);
    ++sent[t.device];
    ++received[t.peer];
  }
  CHECK(sent == std::vector<int>(5, 8));
  CHECK(received == std::vector<int>(5, 8));
  for (int j = 0; j < 5; ++j) {
    REQUIRE(done[j].size() == 1);
    CHECK(g.tasks[done[j][0]].peer == j);
  }
  // On a ring of links without contention the evaluator gives the closed form exactly.
  Timeline t = *evaluate(g, c);
  CHECK(t.makespan() == pipegrid::testing::approx(2.0 * 4 / 5 * 1e6 / 1e9));
}

TEST_CASE("ring all-reduce: a device sends nothing of the reduce-scatter before its own data is ready") {
  // gpu2's gradients are ready at 5 s, the others' at once. gpu2's reduce-scatter sends and its first
  // all-gather send include its own data, and the later ones forward what those produced, so none
  // may start before 5 s, even when a chunk reached it earlier.
  Cluster c = *make_ring_cluster(3, "gpu", test_device(), {1e9, 0});
  TaskGraph g = empty_graph(c);
  std::vector<int32_t> ready = {compute(g, 0, 0.0), compute(g, 1, 0.0), compute(g, 2, 5.0)};
  append_allreduce(g, AllReduceAlgorithm::Ring, c, {0, 1, 2}, ready, 3e9);
  Timeline t = *evaluate(g, c);
  int checked = 0;
  for (size_t i = 3; i < g.tasks.size(); ++i)
    if (g.tasks[i].device == 2) {
      CHECK(t.start[i] >= 5.0);
      ++checked;
    }
  CHECK(checked == 4);
}

TEST_CASE("hierarchical all-reduce: reduce to each machine's leader, ring of leaders, broadcast") {
  DgxSpec s;
  s.nodes = 3;
  s.gpus_per_node = 4;
  s.gpu = test_device();
  Cluster c = *make_dgx_cluster(s);
  std::vector<int> devices(12);
  for (int i = 0; i < 12; ++i) devices[i] = i;
  TaskGraph g = empty_graph(c);
  auto done =
      append_allreduce(g, AllReduceAlgorithm::Hierarchical, c, devices, std::vector<int32_t>(12, -1), 9e6);
  // 3 x 3 reduce sends + 2 x 2 x 3 ring sends + 3 x 3 broadcast sends.
  REQUIRE(g.tasks.size() == 9 + 12 + 9);
  int full = 0, chunks = 0;
  for (const Task& t : g.tasks) {
    if (t.bytes == 9e6) {
      ++full;
      CHECK(c.devices[t.device].node == c.devices[t.peer].node);  // whole buffers stay inside a machine
    } else {
      ++chunks;
      CHECK(t.bytes == 3e6);
      CHECK(t.device % 4 == 0);  // leaders: gpu0, gpu4, gpu8
      CHECK(t.peer % 4 == 0);
    }
  }
  CHECK(full == 18);
  CHECK(chunks == 12);
  for (int j = 0; j < 12; ++j) CHECK(!done[j].empty());
}

TEST_CASE("replicas: uniform and balanced put stage i on devices i r .. i r + r - 1") {
  ChainSpec s;
  s.layers = 4;
  s.forward_s = 1e-3;
  Workload w = make_chain(s);
  Cluster c = make_switch_cluster(8, "gpu", test_device(), 1e9, 0);
  PartitionRequest r{w, c, 4, 1};
  r.replicas = 2;
  Partition p = *partition_uniform(r);
  REQUIRE(p.stage_count() == 4);
  CHECK(p.stage(3).devices == std::vector<int>{6, 7});
  CHECK(partition_balanced(r)->stage(1).devices == std::vector<int>{2, 3});
  r.stages = 5;
  CHECK(partition_uniform(r).error().message == "5 stages of 2 replicas need 10 devices, the cluster has 8");

  // Balanced times a stage by its slowest replica, for half of the micro-batch: with gpu3 half as
  // fast, rank 1 (gpu2, gpu3) is worth half of rank 0, so 3 + 1 layers beat 2 + 2.
  for (auto v : boost::make_iterator_range(boost::vertices(w.graph))) {
    w.graph[v].measured.reset();
    w.graph[v].forward_flops = 1e9;
  }
  Cluster h = make_switch_cluster(4, "gpu", test_device(), 1e9, 0);
  for (Device& d : h.devices) d.spec.peak_flops.fill(1e12);
  h.devices[3].spec.peak_flops.fill(0.5e12);
  PartitionRequest hr{w, h, 2, 2};
  hr.replicas = 2;
  Partition hp = *partition_balanced(hr);
  CHECK(hp.stage(0).layers.size() == 3);
  CHECK(hp.stage(1).layers.size() == 1);
}

TEST_CASE("dp: one stage with every layer on every device, and an all-reduce per replica set") {
  Experiment e =
      chain_experiment(4, 2, 1e-3, 2e-3, "1f1b", make_switch_cluster(4, "gpu", test_device(), 10e9, 1e-6));
  e.strategy.partitioner = "dp";
  PreparedRun run = *prepare(e);
  REQUIRE(run.partition.stage_count() == 1);
  CHECK(run.partition.stage(0).devices == std::vector<int>{0, 1, 2, 3});
  CHECK(run.partition.stage(0).layers.size() == 4);
  int allreduce = 0;
  for (const Task& t : run.graph.tasks) allreduce += t.transfer == TransferKind::DataParallel;
  CHECK(allreduce == 2 * 3 * 4);
  // Each device: 2 micro-batches of a quarter of the samples (times scale with the batch), F then B
  // of all 4 layers, then the ring all-reduce of 4 MiB of parameters through the switch: 6 steps of
  // 2 us + 1 MiB / 10 GB/s.
  Timeline t = *evaluate(run.graph, e.cluster);
  const double compute = 2 * 4 * (1e-3 + 2e-3) / 4;
  const double ring = 6 * (2e-6 + (4.0 * (1 << 20) / 4) / 10e9);
  CHECK(t.makespan() == pipegrid::testing::approx(compute + ring));
}

TEST_CASE("replicas: a partitioner that places other device counts is refused") {
  Experiment e =
      chain_experiment(4, 2, 1e-3, 2e-3, "1f1b", make_switch_cluster(4, "gpu", test_device(), 10e9, 1e-6));
  e.strategy.partitioner = "dp";
  e.strategy.replicas = 2;
  CHECK(prepare(e).error().message ==
        "partitioner dp does not place 2 replicas per stage (stage 0 has 4 devices)");
}

TEST_CASE("multi-ring orders: one ring per device of a machine, entering each machine at its k-th device") {
  DgxSpec s;
  s.nodes = 3;
  s.gpus_per_node = 4;
  s.gpu = test_device();
  Cluster c = *make_dgx_cluster(s);
  // Two devices on each machine (gpu0, gpu1 | gpu4, gpu5 | gpu8, gpu9): 2 rings, by hand.
  const std::vector<std::vector<size_t>> two = multi_ring_orders(c, {0, 1, 4, 5, 8, 9});
  CHECK(two == std::vector<std::vector<size_t>>{{0, 1, 2, 3, 4, 5}, {1, 0, 3, 2, 5, 4}});
  // Uneven machines (2, 1), one machine, one device per machine: the plain ring, in the order given.
  CHECK(multi_ring_orders(c, {4, 0, 1}) == std::vector<std::vector<size_t>>{{0, 1, 2}});
  CHECK(multi_ring_orders(c, {0, 1, 2, 3}) == std::vector<std::vector<size_t>>{{0, 1, 2, 3}});
  CHECK(multi_ring_orders(c, {0, 4, 8}) == std::vector<std::vector<size_t>>{{0, 1, 2}});
}

TEST_CASE("ring all-reduce closed form: 2 (n - 1) (a + S / (n B)) on a ring, the evaluator's time") {
  // 6 devices on a ring of 25 GB/s links with 2 us latency; 600 MB: chunk 100 MB, 4 ms + 2 us a step.
  const double B = 25e9, a = 2e-6, S = 600e6;
  Cluster c = *make_ring_cluster(6, "gpu", test_device(), {B, a});
  Router router(c);
  const double expected = 2.0 * 5 * (a + S / 6 / B);
  Result<double> t = concurrent_ring_time(c, router, {{0, 1, 2, 3, 4, 5}}, S);
  REQUIRE(t.ok());
  CHECK(*t == pipegrid::testing::approx(expected));
  // The full evaluator on the ring's transfers, the oracle the search's estimate stands in for.
  TaskGraph g = empty_graph(c);
  append_allreduce(g, AllReduceAlgorithm::Ring, c, {0, 1, 2, 3, 4, 5}, std::vector<int32_t>(6, -1), S);
  CHECK(evaluate(g, c)->makespan() == pipegrid::testing::approx(expected));
  // A ring of one device all-reduces nothing.
  CHECK(*concurrent_ring_time(c, router, {{3}}, S) == 0);
}

TEST_CASE("ring all-reduce closed form: rings whose flows share a link channel are charged the queue") {
  // Two rings of 2 devices across one link: devices 0, 1 on switch s0, devices 2, 3 on switch s1, s0-s1
  // one 10 GB/s link (device links 100 GB/s, every link 1 us). Rings {0, 2} and {1, 3}: each step sends
  // both rings' flows s0 -> s1 (and s1 -> s0) on the shared link: 2 flows a channel, so a step is
  // 3 us + 2 x (S / 2) / 10 GB/s; 2 (n - 1) = 2 steps.
  Cluster c;
  for (int i = 0; i < 4; ++i) c.devices.push_back({fmt::format("gpu{}", i), test_device()});
  c.switches = {"s0", "s1"};
  c.links = {
      {0, 4, 100e9, 1e-6}, {1, 4, 100e9, 1e-6}, {2, 5, 100e9, 1e-6}, {3, 5, 100e9, 1e-6}, {4, 5, 10e9, 1e-6}};
  REQUIRE(validate(c).ok());
  Router router(c);
  const double S = 1e9;
  Result<double> t = concurrent_ring_time(c, router, {{0, 2}, {1, 3}}, S);
  REQUIRE(t.ok());
  CHECK(*t == pipegrid::testing::approx(2 * (3e-6 + 2 * (S / 2) / 10e9)));
  // One ring alone: one flow a channel.
  CHECK(*concurrent_ring_time(c, router, {{0, 2}}, S) ==
        pipegrid::testing::approx(2 * (3e-6 + (S / 2) / 10e9)));
  // The evaluator runs the two rings' flows in turn on the shared link; the closed form is not below it.
  TaskGraph g = empty_graph(c);
  append_allreduce(g, AllReduceAlgorithm::Ring, c, {0, 2}, {-1, -1}, S);
  append_allreduce(g, AllReduceAlgorithm::Ring, c, {1, 3}, {-1, -1}, S);
  CHECK(evaluate(g, c)->makespan() <= *t * (1 + 1e-12));
}

// Megatron-LM's --overlap-grad-reduce (strategy dp_overlap, core/lower.h): the first stage's
// gradients in max(40 M, 1 M d)-parameter buckets, bucket k all-reduced once (k + 1) / K of its last
// backward has run. One stage of 4 layers on 2 replicas, 2 micro-batches (1F1B: F B F B, F = 4 ms,
// B = 8 ms per replica's half), 4 x 100 MB of fp32 parameters = 100 M: K = 3 buckets of 400 MB / 3.
// A ring of 2 through a switch moves an all-reduce of S bytes in S / B. The buckets follow each
// other (NCCL's one stream; each link carries them in turn), so the gradients are reduced at
// max_k (r_k + (K - k) A / K), r_k = 16 ms + (k + 1) 8 ms / 3, A = 400 MB / B: by hand, bucket by
// bucket (fluid below). pipegrid lowers the K buckets as two all-reduces with the same end.
TEST_CASE("dp overlap: the first stage's buckets during its last backward, the closed form") {
  auto run = [](double bandwidth, bool overlap, bool zero1, double reduce_bytes) {
    Experiment e = chain_experiment(4, 2, 2e-3, 4e-3, "1f1b",
                                    make_switch_cluster(2, "gpu", test_device(), bandwidth, 0));
    ChainSpec c;
    c.layers = 4;
    c.forward_s = 2e-3;
    c.backward_s = 4e-3;
    c.activation_bytes = 1 << 20;
    c.parameter_bytes = 100e6;
    e.workload = make_chain(c);
    e.strategy.stages = 1;
    e.strategy.replicas = 2;
    e.strategy.dp_overlap = overlap;
    e.strategy.gradient_reduce_bytes = reduce_bytes;
    e.memory.zero1 = zero1;
    PreparedRun p = *prepare(e);
    double step = 0;
    int buckets = 0;
    for (const Task& t : p.graph.tasks) {
      if (t.kind == TaskKind::Optimizer) step = t.duration;
      buckets += t.transfer == TransferKind::DataParallel && t.device == 0;
    }
    const double end = evaluate(p.graph, e.cluster)->makespan() - step;
    return std::make_pair(end, buckets / 2);  // all-reduces: a ring of 2 takes 2 steps each
  };
  const double ms = 1e-3;
  auto fluid = [&](double a) {  // a: the whole all-reduce's time
    double t = 0;
    for (int k = 0; k < 3; ++k) t = std::max(t, 16 * ms + (k + 1) * 8 * ms / 3) + a / 3;
    return t;
  };
  // Not overlapped: F B F B, then the whole all-reduce: 24 ms + 40 ms at 10 GB/s.
  CHECK(run(10e9, false, false, 0).first == pipegrid::testing::approx(24 * ms + 40 * ms));
  CHECK(run(10e9, false, false, 0).second == 1);
  // Overlapped, bandwidth-bound (A = 40 ms > B): the first bucket's start + A = 58.67 ms.
  CHECK(run(10e9, true, false, 0).second == 2);  // buckets 0 and 1 from r_0, bucket 2 after the pass
  CHECK(run(10e9, true, false, 0).first == pipegrid::testing::approx(fluid(40 * ms)));
  CHECK(fluid(40 * ms) == pipegrid::testing::approx((16 + 8.0 / 3 + 40) * ms));
  // Compute-bound (A = 4 ms < B): the last bucket after the backward, 24 + 4 / 3 ms.
  CHECK(run(100e9, true, false, 0).first == pipegrid::testing::approx((24 + 4.0 / 3) * ms));
  // ZeRO-1: a reduce-scatter, half the traffic (the parameter all-gather hidden): A = 20 ms.
  CHECK(run(10e9, true, true, 0).first == pipegrid::testing::approx(fluid(20 * ms)));
  // Reduced at 2 bytes per parameter instead of fp32's 4: A = 20 ms, overlapped or not.
  CHECK(run(10e9, true, false, 2).first == pipegrid::testing::approx(fluid(20 * ms)));
  CHECK(run(10e9, false, false, 2).first == pipegrid::testing::approx(44 * ms));
  // Megatron's bucket: max(40 M, 1 M x d) parameters.
  CHECK(dp_buckets(100e6, 2) == 3);
  CHECK(dp_buckets(100e6, 64) == 2);
  CHECK(dp_buckets(40e6, 8) == 1);
  CHECK(dp_buckets(0, 8) == 1);
  // The first stage's dense and expert buffers (Megatron-Core's expert_parallel_buffers, the same bucket
  // size): 100 M dense and 201 M expert parameters on 16 replicas, 3 and 6 buckets of 40 M.
  CHECK(first_stage_buckets(100e6, 201e6, 16, false).dense == 3);
  CHECK(first_stage_buckets(100e6, 201e6, 16, false).expert == 6);
  // One piece each: a dense buffer of one bucket (the lowering splits no backward then), DualPipe's
  // mirrored stages, one replica.
  CHECK(first_stage_buckets(30e6, 201e6, 16, false).expert == 1);
  CHECK(first_stage_buckets(100e6, 201e6, 16, true).dense == 1);
  CHECK(first_stage_buckets(100e6, 201e6, 16, true).expert == 1);
  CHECK(first_stage_buckets(100e6, 201e6, 1, false).dense == 1);
  CHECK(first_stage_buckets(100e6, 0, 16, false).expert == 1);
}

TEST_CASE("dp overlap: only the first stage is bucketed (Megatron's pipeline rank 0)") {
  Experiment e =
      chain_experiment(4, 4, 2e-3, 4e-3, "1f1b", make_switch_cluster(4, "gpu", test_device(), 10e9, 0));
  ChainSpec c;
  c.layers = 4;
  c.forward_s = 2e-3;
  c.backward_s = 4e-3;
  c.activation_bytes = 1 << 20;
  c.parameter_bytes = 100e6;  // 50 M parameters per stage of 2 layers: 2 buckets
  e.workload = make_chain(c);
  e.strategy.stages = 2;
  e.strategy.replicas = 2;
  e.strategy.dp_overlap = true;
  PreparedRun p = *prepare(e);
  std::map<int, int> steps;  // all-reduce ring steps per stage
  int backward_tasks_gpu0 = 0;
  for (const Task& t : p.graph.tasks) {
    if (t.transfer == TransferKind::DataParallel) ++steps[t.stage];
    backward_tasks_gpu0 += t.kind == TaskKind::Backward && t.device == 0;
  }
  CHECK(steps[0] == 2 * 2 * 2);  // 2 all-reduces (2 buckets) x 2 devices x 2 steps
  CHECK(steps[1] == 2 * 2);
  CHECK(backward_tasks_gpu0 == 4 + 1);  // 4 micro-batches, the last in 2 pieces
}

TEST_CASE(
    "merged rings over NICs: a tensor-parallel all-reduce across two nodes, one ring per NIC (by hand)") {
  // Two DGX-style nodes of 2 GPUs (NVLink 300 GB/s to the node's switch, one 25 GB/s NIC per GPU into
  // one InfiniBand switch; every link 1 us). A merged-ring all-reduce of S = 100 MB over the 4 GPUs:
  // one flow per device of 2 (n - 1) / n S = 1.5 S. One ring 0 -> 1 -> 2 -> 3 -> 0 crosses on gpu1's
  // and gpu3's NICs (a crossing is 2 links, NIC to switch to NIC: 2 us): 2 us + 1.5 S / 25 GB/s =
  // 2 us + 6 ms. NCCL's two channels (multi_ring_orders: 0 1 2 3 and 1 0 3 2) each carry S / 2:
  // 0.75 S per flow, ring 0 crossing on gpu1 -> gpu2 and gpu3 -> gpu0, ring 1 on gpu0 -> gpu3 and
  // gpu2 -> gpu1: every NIC direction carries one flow, 2 us + 3 ms (NVLink hops: 0.5 ms or less).
  Cluster c = two_dgx_nodes(2, 1e-6);
  const double S = 100e6;
  const std::vector<int> devices{0, 1, 2, 3};
  const std::vector<Deps> ready(4);
  const FlowTag tag{TransferKind::TensorParallel, 0, 0};
  TaskGraph one = empty_graph(c);
  append_merged_rings(one, CollectiveKind::AllReduce, devices, {{0, 1, 2, 3}}, ready, S, tag);
  CHECK(evaluate(one, c)->makespan() == pipegrid::testing::approx(2e-6 + 1.5 * S / 25e9));
  TaskGraph two = empty_graph(c);
  const auto orders = multi_ring_orders(c, devices);
  REQUIRE(orders.size() == 2);
  append_merged_rings(two, CollectiveKind::AllReduce, devices, orders, ready, S, tag);
  CHECK(two.tasks.size() == 8);
  CHECK(evaluate(two, c)->makespan() == pipegrid::testing::approx(2e-6 + 0.75 * S / 25e9));
}

TEST_CASE("the rank fold's ring: member q's two flows of the merged ring, built alike") {
  // append_merged_ring_at(q) must build exactly the flows q - 1 -> q and q -> q + 1 of
  // append_merged_ring (ends, bytes 2 (n - 1) / n S, the two ends' readiness as dependencies), in the
  // ring's order, and hand member q the same {out, in}; the other members get nothing.
  Cluster c = two_dgx_nodes(2, 1e-6);
  const double S = 64e6;
  const std::vector<int> devices{0, 1, 2, 3};
  const FlowTag tag{TransferKind::TensorParallel, 0, 0};
  for (size_t q : {size_t{0}, size_t{2}, size_t{3}}) {
    CAPTURE(q);
    TaskGraph whole = empty_graph(c), one = empty_graph(c);
    std::vector<Deps> ready;
    for (int d = 0; d < 4; ++d) {
      Task t;
      t.kind = TaskKind::Forward;
      t.device = d;
      t.duration = 1e-3 * (d + 1);
      ready.push_back({whole.add(t)});
      one.add(t);
    }
    const std::vector<Deps> all =
        append_merged_ring(whole, CollectiveKind::AllReduce, devices, ready, S, tag);
    const std::vector<Deps> mine =
        append_merged_ring_at(one, CollectiveKind::AllReduce, devices, ready, S, tag, q);
    REQUIRE(one.tasks.size() == 6);
    for (size_t i = 0; i < 4; ++i) CHECK(mine[i].size() == (i == q ? 2u : 0u));
    REQUIRE(all[q].size() == 2);
    const size_t before = (q + 3) % 4;
    for (size_t k = 0; k < 2; ++k) {
      const Task &a = whole.tasks[all[q][k]], &b = one.tasks[mine[q][k]];
      CHECK(a.device == b.device);
      CHECK(a.peer == b.peer);
      CHECK(b.bytes == 1.5 * S);
      CHECK(a.bytes == b.bytes);
    }
    CHECK(one.tasks[mine[q][0]].device == static_cast<int>(q));       // out: q -> q + 1
    CHECK(one.tasks[mine[q][1]].device == static_cast<int>(before));  // in: q - 1 -> q
    // The ring's order: the lower-numbered sender first.
    CHECK((mine[q][0] < mine[q][1]) == (q < before));
    // Each flow waits for both of its ends' readiness (the compute tasks 0 .. 3).
    one.pack_dependencies();
    for (int32_t f : mine[q]) {
      const Task& x = one.tasks[f];
      int waits = 0;
      for (int32_t u = 0; u < 4; ++u)
        for (int32_t v : one.successors(u)) waits += v == f && (u == x.device || u == x.peer);
      CHECK(waits == 2);
    }
  }
}

TEST_CASE("data-parallel rings lowered merged (kAutoMergeRingFlows): the stepped rings' time") {
  // Two nodes of 4 GPUs (NVLink 300 GB/s, a 25 GB/s NIC per GPU). The stepped multi-ring all-reduce
  // (4 rings, 2 (n - 1) = 14 steps of S / (n rings)) and the merged rings (one flow of
  // 2 (n - 1) / n x S / rings per device and ring) move the same bytes: 14 x S / 32 / 25 GB/s on the
  // NICs (1.75 ms at S = 100 MB), plus one 2-link route latency (1 us a link): the analytic evaluator
  // pipelines a route's latency (core/evaluate.cc), so the stepped rings pay it once too. SimGrid's
  // replay charges it to each of the stepped rings' 14 flows in sequence (docs/speed.md measures the
  // difference at scale).
  const double S = 100e6;
  const std::vector<int> devices{0, 1, 2, 3, 4, 5, 6, 7};
  for (double a : {0.0, 1e-6}) {
    CAPTURE(a);
    Cluster c = two_dgx_nodes(4, a);
    TaskGraph stepped = empty_graph(c);
    append_multiring(stepped, c, CollectiveKind::AllReduce, devices, std::vector<Deps>(8), S, FlowTag{});
    TaskGraph merged = empty_graph(c);
    append_merged_rings(merged, CollectiveKind::AllReduce, devices, multi_ring_orders(c, devices),
                        std::vector<Deps>(8), S, FlowTag{});
    CHECK(merged.tasks.size() == 32);  // 4 rings x 8 devices, against 4 x 2 x 7 x 8 = 448 steps
    CHECK(stepped.tasks.size() == 448);
    const double bandwidth_term = 14 * S / 32 / 25e9;
    CHECK(evaluate(stepped, c)->makespan() == pipegrid::testing::approx(2 * a + bandwidth_term));
    CHECK(evaluate(merged, c)->makespan() == pipegrid::testing::approx(2 * a + bandwidth_term));
  }
}

TEST_CASE("double binary trees: binary, logarithmic, no machine an inner node of both (NCCL 2.4 blog)") {
  // The blog: "There might be one rank which is a leaf on both trees but no rank is a node on both
  // trees" (for an even count; for an odd one at most one is); each tree is binary, so its depth is at most
  // floor(log2 N) + 1 (the root has one child).
  for (int N = 2; N <= 200; ++N) {
    INFO("N=" << N);
    const std::array<std::vector<int>, 2> trees = double_binary_trees(N);
    std::array<std::vector<int>, 2> children{std::vector<int>(N, 0), std::vector<int>(N, 0)};
    int max_depth = 0;
    for (int t = 0; t < 2; ++t) {
      int roots = 0;
      for (int i = 0; i < N; ++i) {
        const int up = trees[t][i];
        if (up < 0) {
          ++roots;
          continue;
        }
        ++children[t][up];
        int depth = 0;  // walk to the root: no cycle, a bounded depth
        for (int x = i; x >= 0 && depth <= N; x = trees[t][x]) ++depth;
        max_depth = std::max(max_depth, depth - 1);
      }
      CHECK(roots == 1);
      for (int i = 0; i < N; ++i) CHECK(children[t][i] <= 2);
    }
    int floor_log2 = 0;
    while ((2 << floor_log2) <= N) ++floor_log2;
    CHECK(max_depth <= floor_log2 + 1);
    int inner_both = 0, leaf_both = 0;
    for (int i = 0; i < N; ++i) {
      inner_both += children[0][i] > 0 && children[1][i] > 0;
      leaf_both += children[0][i] == 0 && children[1][i] == 0;
    }
    CHECK(inner_both <= N % 2);  // odd N: one may be (three machines: two chains of 3 share their middle)
    CHECK(leaf_both <= 1);
  }
  // Four machines by hand: 0 is the root with child 2, which has 1 and 3; mirrored: 3 over 1 over 2, 0.
  CHECK(double_binary_trees(4)[0] == std::vector<int>{-1, 2, 0, 2});
  CHECK(double_binary_trees(4)[1] == std::vector<int>{1, 3, 1, -1});
}

TEST_CASE("double binary tree all-reduce: each device sends and receives 2 S, each root S (nccl#457)") {
  // NCCL's maintainers (NVIDIA/nccl#457): with the tree "each rank sends and receives 2 S, except the
  // root which moves S"; with two trees of S / 2 each, a device that is the root of one and a leaf
  // of the other moves S. Counted by hand on four machines (trees of the case above): device 0 is T1's root
  // (sends S / 2 down to 2) and a leaf of T2 (sends S / 2 up): S; device 3 likewise; devices 1 and 2 are an
  // inner node of one tree (S / 2 up, 2 x S / 2 down) and a leaf of the other (S / 2 up): 2 S. Received: the
  // same by symmetry.
  Cluster c = make_switch_cluster(4, "gpu", test_device(), 10e9, 1e-6);
  TaskGraph g = empty_graph(c);
  const double S = 8.0 * kTreeChunkBytes;  // 4 chunks per tree
  std::vector<Deps> ready(4);
  append_double_tree(g, c, {0, 1, 2, 3}, ready, S, FlowTag{});
  std::vector<double> sent(4, 0), got(4, 0);
  for (const Task& t : g.tasks) {
    sent[t.device] += t.bytes;
    got[t.peer] += t.bytes;
  }
  CHECK(g.tasks.size() == double_tree_flows(c, {0, 1, 2, 3}, S));
  CHECK(g.tasks.size() == 2u * 4 * 2 * 3);  // 2 trees x 4 chunks x (up + down) x 3 edges
  for (int d : {0, 3}) {
    CHECK(close_rel(sent[d], S, 1e-12));
    CHECK(close_rel(got[d], S, 1e-12));
  }
  for (int d : {1, 2}) {
    CHECK(close_rel(sent[d], 2 * S, 1e-12));
    CHECK(close_rel(got[d], 2 * S, 1e-12));
  }
}

TEST_CASE("double binary tree on DGX nodes: a pair of trees per NIC, a chain inside each machine") {
  // Two machines of 4: 4 channels, each 2 trees of S / 8; in each tree the 3 chain hops of each machine
  // and the one hop between the heads: 7 edges. Every device's NIC link (to another machine) carries
  // only its own channel: the flows between machines leave from device k of a machine in channel k.
  Cluster c = two_dgx_nodes(4, 1e-6);
  TaskGraph g = empty_graph(c);
  const double S = 4 * 2 * kTreeChunkBytes;  // one chunk per channel and tree
  std::vector<int> devices(8);
  for (int i = 0; i < 8; ++i) devices[i] = i;
  append_double_tree(g, c, devices, std::vector<Deps>(8), S, FlowTag{});
  CHECK(g.tasks.size() == 4u * 2 * 1 * 2 * 7);
  std::map<int, int> across;  // device -> flows it sends to the other machine
  for (const Task& t : g.tasks) {
    CHECK(close_rel(t.bytes, S / 8, 1e-12));
    if ((t.device < 4) != (t.peer < 4)) {
      ++across[t.device];
      CHECK(t.device % 4 == t.peer % 4);  // head to head: the same NIC rail
    }
  }
  for (int d = 0; d < 8; ++d) CHECK(across[d] == 2);  // per tree, one flow up or down across
}

TEST_CASE("NCCL 2.21.5's model: latencies and the ring-or-tree pick, against hand arithmetic") {
  // Latency only (0 bytes), ppn = 8 on NVLink: the tables of tuning.cc worked by hand (the protocol
  // with the least latency, LL, for both): 128 ranks on 16 machines, ring 6.6 + (254 - 32) x max(0.6,
  // 1) + 32 x 2.7 = 315.0 us, tree 6.8 + 2 (7 x 0.6 + 4 x 5.0) = 55.2 us; 1,024 on 128: 2,487.8 and 85.2.
  NcclModelInput in;
  in.channels = 4;
  in.channel_bw = 25e9;
  in.ranks = 128;
  in.nodes = 16;
  NcclModelTime t = nccl_allreduce_model(in, 0);
  CHECK(close_rel(t.ring, 315.0e-6, 1e-12));
  CHECK(close_rel(t.tree, 55.2e-6, 1e-12));
  in.ranks = 1024;
  in.nodes = 128;
  t = nccl_allreduce_model(in, 0);
  CHECK(close_rel(t.ring, 2487.8e-6, 1e-12));
  CHECK(close_rel(t.tree, 85.2e-6, 1e-12));
  // The pick, worked apart from pipegrid (a script over the same tables, Hopper, 4 channels of 25 GB/s,
  // 128 ranks on 16 machines): the tree up to 256 MiB (LL, then LL128), the ring from 512 MiB.
  in.ranks = 128;
  in.nodes = 16;
  for (int e = 3; e <= 28; ++e) {
    INFO("2^" << e << " bytes");
    CHECK(nccl_allreduce_model(in, std::ldexp(1.0, e)).tree_wins());
  }
  CHECK_FALSE(nccl_allreduce_model(in, std::ldexp(1.0, 29)).tree_wins());
  CHECK_FALSE(nccl_allreduce_model(in, std::ldexp(1.0, 30)).tree_wins());
}

namespace engine_cases {

// n FPGAs on one switch (links B, a) with a collective engine of the given figures.
Cluster engine_switch(int n, double B, double a, const CollectiveEngine& e) {
  DeviceSpec fpga = test_device();
  fpga.family = "fpga";
  Cluster c = make_switch_cluster(n, "fpga", fpga, B, a);
  c.engine = e;
  return c;
}

}  // namespace engine_cases

TEST_CASE("FPGA collective engine: each flow waits its step, each device's first step the call as well") {
  const CollectiveEngine e{"test", 500e-6, 20e-6, 4e9, 10e9};
  Cluster c = engine_cases::engine_switch(3, 12.5e9, 0.5e-6, e);
  TaskGraph g = empty_graph(c);
  append_allreduce(g, AllReduceAlgorithm::Ring, c, {0, 1, 2}, {-1, -1, -1}, 3e6);
  // 2 (n - 1) = 4 steps of 3 flows: step 0's flows (tasks 0-2, one per device) carry the call.
  REQUIRE(g.tasks.size() == 12);
  for (size_t t = 0; t < g.tasks.size(); ++t) {
    INFO("task " << t);
    CHECK(g.tasks[t].duration == (t < 3 ? 20e-6 + 500e-6 : 20e-6));
  }
  // A GPU in the group: the engine's costs on its FPGA-to-FPGA flows only (dev0 -> dev1, the first
  // of each step), as its rate (until 2026-12-05 none of the group's flows paid step or call).
  Cluster mixed = c;
  mixed.devices[2].spec.family = "gpu";
  TaskGraph h = empty_graph(mixed);
  append_allreduce(h, AllReduceAlgorithm::Ring, mixed, {0, 1, 2}, {-1, -1, -1}, 3e6);
  REQUIRE(h.tasks.size() == 12);
  for (size_t t = 0; t < h.tasks.size(); ++t) {
    INFO("task " << t << ": " << h.tasks[t].device << " -> " << h.tasks[t].peer);
    const bool fpgas = h.tasks[t].device != 2 && h.tasks[t].peer != 2;
    CHECK(h.tasks[t].duration == (!fpgas ? 0.0 : t < 3 ? 20e-6 + 500e-6 : 20e-6));
  }
  CHECK(std::isinf(mixed.engine_rate(0, 2, true)));
  CHECK(mixed.engine_rate(0, 1, true) == 4e9);
  CHECK(mixed.engine_rate(0, 1, false) == 10e9);
}

TEST_CASE("FPGA collective engine: the call once per board at the start, for a tree and a hierarchy too") {
  // Engine call 500 us, step 20 us, 4 GB/s; links 12.5 GB/s, 0.5 us (a = 1 us a route); S = 8e6 bytes.
  // The call delays only the flows that wait on no other flow of the collective: charged on each
  // board's first flow in task order instead, a tree's root paid it again before its down flow and a
  // hierarchical leader before its ring (a helper's hand count, 2026-12-05).
  const CollectiveEngine e{"test", 500e-6, 20e-6, 4e9, 10e9};
  const double call = 500e-6, hop = 20e-6 + 1e-6, S = 8e6, bw = 4e9;
  // Two boards, NCCL's double binary tree of 8 bytes: each tree's one chunk (4 bytes) goes up leaf ->
  // root, then down; both trees at once, one per direction: call + 2 (step + a + 4 / bw).
  Cluster two = engine_cases::engine_switch(2, 12.5e9, 0.5e-6, e);
  auto tree_time = [&](const Cluster& c, double bytes) {
    TaskGraph g = empty_graph(c);
    append_allreduce(g, AllReduceAlgorithm::Tree, c, {0, 1}, {-1, -1}, bytes);
    Result<Timeline> t = evaluate(g, c);
    REQUIRE(t.ok());
    return t->makespan();
  };
  CHECK(close_rel(tree_time(two, 8), call + 2 * (hop + 4 / bw), 1e-12));
  // Pipelined in chunks (8e6 bytes): whatever the chunks' order, the call delays the whole once.
  Cluster no_call = two;
  no_call.engine->call = 0;
  CHECK(close_rel(tree_time(two, S) - tree_time(no_call, S), call, 1e-9));
  // Two machines of two boards, hierarchical: the members' reduce into their leader (S), the leaders'
  // ring of 2 (2 steps of S / 2), the leader's broadcast (S): call + 4 (step + a) + 3 S / bw = 6,584 us.
  Cluster four = engine_cases::engine_switch(4, 12.5e9, 0.5e-6, e);
  for (int d = 0; d < 4; ++d) four.devices[d].node = d < 2 ? "m0" : "m1";
  TaskGraph hier = empty_graph(four);
  append_allreduce(hier, AllReduceAlgorithm::Hierarchical, four, {0, 1, 2, 3}, {-1, -1, -1, -1}, S);
  Result<Timeline> t = evaluate(hier, four);
  REQUIRE(t.ok());
  CHECK(close_rel(t->makespan(), call + 4 * hop + 3 * S / bw, 1e-12));
  // The ring is as before: every board's first step, and only it, carries the call.
  TaskGraph ring = empty_graph(four);
  append_allreduce(ring, AllReduceAlgorithm::Ring, four, {0, 1, 2, 3}, {-1, -1, -1, -1}, S);
  for (size_t k = 0; k < ring.tasks.size(); ++k)
    CHECK(ring.tasks[k].duration == (k < 4 ? 20e-6 + call : 20e-6));
}

TEST_CASE("FPGA collective engine: the closed form and the evaluator, by hand") {
  // 4 boards on a switch (12.5 GB/s, 0.5 us per link), engine call 500 us, step 20 us, 4 GB/s.
  // Ring all-reduce of S = 32e6 bytes: 6 steps, each a flow of S / 4 = 8e6 bytes over two links
  // (1 us) after the step (20 us), at 4 GB/s (2 ms); the first step after the call as well:
  // 500 + 6 x (20 + 1 + 2000) us = 12,626 us.
  const CollectiveEngine e{"test", 500e-6, 20e-6, 4e9, 10e9};
  Cluster c = engine_cases::engine_switch(4, 12.5e9, 0.5e-6, e);
  const double expected = 500e-6 + 6 * (20e-6 + 1e-6 + 2e-3);
  Router router(c);
  Result<LinkCost> hop = ring_link_cost(router, {0, 1, 2, 3});
  REQUIRE(hop.ok());
  CHECK(hop->call == 500e-6);
  CHECK(close_rel(hop->latency, 21e-6, 1e-12));
  CHECK(hop->bandwidth == 4e9);
  CHECK(close_rel(closed_form::ring_allreduce(4, 32e6, *hop), expected, 1e-12));
  TaskGraph g = empty_graph(c);
  append_allreduce(g, AllReduceAlgorithm::Ring, c, {0, 1, 2, 3}, {-1, -1, -1, -1}, 32e6);
  Result<Timeline> t = evaluate(g, c);
  REQUIRE(t.ok());
  CHECK(close_rel(t->makespan(), expected, 1e-12));
  Result<double> rings = concurrent_ring_time(c, router, {{0, 1, 2, 3}}, 32e6);
  REQUIRE(rings.ok());
  CHECK(close_rel(*rings, expected, 1e-12));
  // Without the engine: 6 x (1 us + 8e6 / 12.5e9) = 3,846 us.
  c.engine.reset();
  CHECK(close_rel(closed_form::ring_allreduce(4, 32e6, *ring_link_cost(Router(c), {0, 1, 2, 3})),
                  6 * (1e-6 + 8e6 / 12.5e9), 1e-12));
}

TEST_CASE("DeepEP's de-duplication: hit probabilities, the byte matrix and its closed form, by hand") {
  // C(E - g, k) / C(E, k): none of a token's k experts among g given ones.
  CHECK(close_rel(routed_hit_probability({4, 2}, 1), 1 - 3.0 / 6, 1e-15));         // C(3,2) / C(4,2)
  CHECK(close_rel(routed_hit_probability({4, 2}, 2), 1 - 1.0 / 6, 1e-15));         // C(2,2) / C(4,2)
  CHECK(close_rel(routed_hit_probability({64, 6}, 2), 1 - 1653.0 / 2016, 1e-14));  // C(62,6) / C(64,6)
  CHECK(routed_hit_probability({8, 8}, 1) == 1);                                   // every expert is drawn
  CHECK(routed_hit_probability({8, 2}, 0) == 0);
  CHECK(routed_hit_probability({8, 1}, 2) == 0.25);  // top-1: held / E
  // Group-limited: 8 experts in 4 groups of 2, a token's 2 experts from its 2 of the 4 groups (4
  // experts). One expert: its group is picked with C(3,1) / C(4,2) = 1/2, then among the 4 with 1/2.
  const RoutingDraw limited{8, 2, 4, 2};
  CHECK(close_rel(routed_hit_probability(limited, 1), 0.25, 1e-15));
  // Two whole groups (4 experts): missed when neither group is picked (1/6), or one is (4/6) and both
  // experts come from the other (C(2,2) / C(4,2) = 1/6): 1 - 1/6 - 4/36 = 13/18.
  CHECK(close_rel(routed_hit_probability(limited, 4), 13.0 / 18, 1e-15));
  CHECK(aligned_with_groups(limited, 1));
  CHECK(aligned_with_groups(limited, 4));
  CHECK(!aligned_with_groups(limited, 3));
  // DeepSeek-V3 (256 experts, top-8 from 4 of 8 groups) at ep 64 over 8 nodes: a node holds one group,
  // picked with 4/8, then hit unless all 8 experts come from the other 96 of 128; about 3.6 nodes per
  // token, under the report's "at most 4".
  const double v3_node =
      0.5 * (1 - 96.0 / 128 * 95 / 127 * 94 / 126 * 93 / 125 * 92 / 124 * 91 / 123 * 90 / 122 * 89 / 121);
  CHECK(close_rel(routed_hit_probability({256, 8, 8, 4}, 32), v3_node, 1e-14));
  CHECK(8 * v3_node < 4);
  // Two nodes of two devices (node, position): (0,0) (0,1) (1,0) (1,1); T = 8 bytes, hit 1/2 and 5/6.
  const std::vector<std::pair<int, int>> where{{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  const auto b = deduplicated_dispatch_bytes(where, 2, 8, 0.5, 5.0 / 6);
  // Same node: own tokens and those forwarded from the other node, 8 x 1/2 x 2; the other node's device
  // at the same position: 8 x 5/6; the other node's other device: nothing (the forwarder sends it).
  const std::vector<std::vector<double>> expected{
      {0, 8, 8 * 5.0 / 6, 0}, {8, 0, 0, 8 * 5.0 / 6}, {8 * 5.0 / 6, 0, 0, 8}, {0, 8 * 5.0 / 6, 8, 0}};
  for (size_t i = 0; i < 4; ++i)
    for (size_t j = 0; j < 4; ++j) CHECK(close_rel(b[i][j], expected[i][j], 1e-15));
  // The closed form: the NIC's 5/6 T against NVLink's T; one node: the NVLink part only.
  const LinkCost nvlink{1e-6, 300e9}, nic{2e-6, 25e9};
  const double T = 1e6;
  CHECK(close_rel(closed_form::deduplicated_all_to_all(2, 2, T, 0.5, 5.0 / 6, nvlink, nic),
                  2e-6 + 5.0 / 6 * T / 25e9, 1e-15));
  CHECK(close_rel(closed_form::deduplicated_all_to_all(1, 4, T, 0.5, 1, nvlink, nic),
                  1e-6 + 3 * 0.5 * T / 300e9, 1e-15));
  CHECK(closed_form::deduplicated_all_to_all(4, 1, 0, 0.5, 1, nvlink, nic) == 0);
}

// Megatron-LM without --overlap-grad-reduce reduces every model chunk's gradients after the schedule
// (finalize_model_grads: each chunk's finish_grad_sync a synchronous call, one after another); with it,
// a chunk's reduction starts once that chunk's last backward has run (grad_sync_func). Interleaved
// 1F1B, 2 pipeline ranks x 2 chunks (a chain of 4 layers, one per stage), 2 replicas on a switch of 4
// GPUs at 10 GB/s without latency (replicas on neighbouring GPUs); 10 MB of gradients per stage, a
// ring of 2 (two steps of S / 2): S / B = 1 ms each.
TEST_CASE("dp without overlap: a device's chunks reduce after its last backward, one after another") {
  auto run = [](bool overlap) {
    Experiment e = chain_experiment(4, 4, 2e-3, 4e-3, "interleaved-1f1b",
                                    make_switch_cluster(4, "gpu", test_device(), 10e9, 0));
    ChainSpec c;
    c.layers = 4;
    c.forward_s = 2e-3;
    c.backward_s = 4e-3;
    c.activation_bytes = 1024;  // the last backward's send beside the rings: under 0.1 us
    c.parameter_bytes = 10e6;   // per layer, so per stage: one bucket (Megatron's 40 M parameters at least)
    e.workload = make_chain(c);
    e.strategy.stages = 2;
    e.strategy.chunks = 2;
    e.strategy.replicas = 2;
    e.strategy.dp_overlap = overlap;
    PreparedRun p = *prepare(e);
    const Timeline t = *evaluate(p.graph, e.cluster);
    // Per device: its last backward's end, its first gradient flow's start, its optimizer step's start.
    std::map<int, std::array<double, 3>> at;
    for (size_t i = 0; i < p.graph.tasks.size(); ++i) {
      const Task& k = p.graph.tasks[i];
      auto& x = at.try_emplace(k.device, std::array<double, 3>{0, 1e9, 0}).first->second;
      if (k.kind == TaskKind::Backward) x[0] = std::max(x[0], t.end[i]);
      if (k.transfer == TransferKind::DataParallel) x[1] = std::min(x[1], t.start[i]);
      if (k.kind == TaskKind::Optimizer) x[2] = t.start[i];
    }
    return at;
  };
  const auto after = run(false), during = run(true);
  REQUIRE(after.size() == 4);
  for (const auto& [d, x] : after) {
    INFO("device " << d);
    CHECK(x[1] == pipegrid::testing::approx(x[0]));                    // nothing before the last backward
    CHECK(x[2] == pipegrid::testing::approx(x[0] + 2 * 10e6 / 10e9));  // two reductions in turn: 2 ms
  }
  // With overlap the later chunk's reduction starts while the device still runs the earlier chunk's
  // backwards, and the step follows the last backward by one reduction's time.
  for (const auto& [d, x] : during) {
    INFO("device " << d);
    CHECK(x[1] < x[0] - 1e-3);
    CHECK(x[2] == pipegrid::testing::approx(x[0] + 10e6 / 10e9));
  }
}
