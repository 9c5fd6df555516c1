// Work-size limits (issue 16): the task graph's size is counted before anything is allocated, and
// plans, mini-batch sweeps and planner searches above the documented limits are refused with a
// message naming the product and the limit.
#include <doctest/doctest.h>

#include "core/cluster.h"
#include "core/evaluate.h"
#include "core/experiment.h"
#include "core/lower.h"
#include "core/models/zoo.h"
#include "core/topologies/generators.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

TEST_CASE("count_tasks: a 1F1B chain has 2pm + p compute tasks and 2(p - 1)m transfers") {
  // p = 4 stages, m = 8 micro-batches, one device each: F and B of every (stage, micro-batch) plus
  // one optimizer step per device = 2*4*8 + 4 = 68; activations and gradients across each of the 3
  // boundaries per micro-batch = 2*3*8 = 48; no all-reduce. 116 in all.
  Experiment e =
      chain_experiment(4, 8, 1e-3, 2e-3, "1f1b", make_switch_cluster(4, "gpu", test_device(), 1e9, 0));
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  const TaskCount n = count_tasks(run->partition, 8, 2);
  CHECK(n.compute == 68);
  CHECK(n.transfers == 48);
  CHECK(n.ring_steps == 0);
  CHECK(run->graph.tasks.size() == 116);
}

TEST_CASE("count_tasks: replicated stages add their ring all-reduce steps") {
  // 2 stages x 2 replicas on 4 devices, m = 3: compute 2*2*3*2 + 4 optimizer steps = 28; replica
  // i of the first stage shares its half of each micro-batch with replica i of the second only
  // (2 pairs), 2 transfers per pair and micro-batch = 12; a ring of r = 2 takes 2(r - 1) steps of
  // r transfers = 4 per stage, 8 in all. 48 tasks.
  Experiment e =
      chain_experiment(2, 3, 1e-3, 2e-3, "1f1b", make_switch_cluster(4, "gpu", test_device(), 1e9, 0));
  e.strategy.replicas = 2;
  e.strategy.stages = 2;
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  const TaskCount n = count_tasks(run->partition, 3, 2);
  CHECK(n.compute == 28);
  CHECK(n.transfers == 12);
  CHECK(n.ring_steps == 8);
  CHECK(run->graph.tasks.size() == 48);
}

TEST_CASE("count_tasks' lower bound: rings the lowering will merge count one flow per device") {
  // One stage of r = 2,048 replicas: a stepped ring is 2 (r - 1) r = 8,384,512 flows, above 2^22, so
  // under NCCL's ring per NIC, its trees or NCCL's pick the lowering merges it (at least one flow per
  // device: 2,048); a plain ring stays stepped. Counted on the partition alone (nothing lowered).
  Experiment e =
      chain_experiment(1, 1, 1e-3, 2e-3, "1f1b", make_switch_cluster(1, "gpu", test_device(), 1e9, 0));
  auto one_stage = [&](int r) {
    std::vector<int> devices(static_cast<size_t>(r));
    for (int d = 0; d < r; ++d) devices[static_cast<size_t>(d)] = d;
    Result<Partition> p = make_partition(e.workload, std::vector<int>(e.workload.layer_count(), 0), {devices},
                                         static_cast<size_t>(r));
    REQUIRE_MESSAGE(p.ok(), p.error().message);
    return *p;
  };
  const Partition wide = one_stage(2048);
  CHECK(count_tasks(wide, 1, 2).ring_steps == 2 * 2047 * 2048);
  CHECK(count_tasks(wide, 1, 2, AllReduceAlgorithm::Ring).ring_steps == 2 * 2047 * 2048);
  for (AllReduceAlgorithm a :
       {AllReduceAlgorithm::MultiRing, AllReduceAlgorithm::Tree, AllReduceAlgorithm::Nccl})
    CHECK(count_tasks(wide, 1, 2, a).ring_steps == 2048);
  // Below 2^22 stepped flows nothing changes (r = 2: 4 steps).
  CHECK(count_tasks(one_stage(2), 1, 2, AllReduceAlgorithm::Nccl).ring_steps == 4);
}

TEST_CASE("a plan above the task ids' range is refused before it is scheduled") {
  // 2,048 stages x 1,000,000 micro-batches x 2 passes = 4,096,000,000 compute tasks > 2^31 - 1.
  Experiment e = chain_experiment(2048, 1000000, 1e-3, 2e-3, "gpipe",
                                  make_switch_cluster(2048, "gpu", test_device(), 1e9, 0));
  Result<PreparedRun> run = prepare(e);
  REQUIRE_FALSE(run.ok());
  CHECK(run.error().message.find("1000000 micro-batches x 2048 stage replicas (2048 stages) x 2 passes") !=
        std::string::npos);
  CHECK(run.error().message.find("4096002048 compute tasks") !=
        std::string::npos);  // + 2,048 optimizer steps
  CHECK(run.error().message.find("limit of 2147483647") != std::string::npos);
}

TEST_CASE("a plan whose graph would not fit the memory available is refused with the estimate") {
  // 64 stages x 1,000 micro-batches: 128,064 compute tasks + 2 x 63 x 1,000 transfers = 254,064
  // tasks x 128 bytes = 32,520,192 bytes (31.01 MiB), against 10 MiB available.
  Experiment e =
      chain_experiment(64, 1000, 1e-3, 2e-3, "gpipe", make_switch_cluster(64, "gpu", test_device(), 1e9, 0));
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  const TaskCount n = count_tasks(run->partition, 1000, 2);
  CHECK(n.total() == 254064);
  const Status s = check_task_count(n, run->partition, 1000, 2, 10.0 * 1024 * 1024);
  REQUIRE_FALSE(s.ok());
  INFO(s.error().message);
  CHECK(s.error().message.find("= 254064 tasks in one iteration, about 31.01 MiB at 128 bytes a task") !=
        std::string::npos);
  CHECK(s.error().message.find("more than the 10 MiB available") != std::string::npos);
  CHECK(check_task_count(n, run->partition, 1000, 2, 32.0 * 1024 * 1024).ok());
}

TEST_CASE("a mini-batch whose divisors make too many micro-batches is refused before planning") {
  // 720720 = 2^4 3^2 5 7 11 13 has (4+1)(2+1)(1+1)^4 = 240 divisors summing to
  // 31 * 13 * 6 * 8 * 12 * 14 = 3,249,792 micro-batches; each costs 8 stages x 2 passes + 2 x 7
  // transfers = 30 tasks: 97,493,760 > 2^25.
  Experiment e =
      chain_experiment(8, 1, 1e-3, 2e-3, "1f1b", make_switch_cluster(8, "gpu", test_device(), 1e9, 0));
  e.strategy.mini_batch = 720720;
  Result<PreparedRun> run = prepare(e);
  REQUIRE_FALSE(run.ok());
  CHECK(run.error().message.find("240 micro-batch sizes make 3249792 micro-batches in all, x 30 tasks") !=
        std::string::npos);
  CHECK(run.error().message.find("= 97493760 tasks") != std::string::npos);
}

TEST_CASE("a mini-batch sweep within the limit still plans") {
  // 64 has 7 divisors summing to 127 micro-batches, x 30 tasks: far below the limit.
  Experiment e =
      chain_experiment(8, 1, 1e-3, 2e-3, "1f1b", make_switch_cluster(8, "gpu", test_device(), 1e9, 0));
  e.strategy.mini_batch = 64;
  CHECK(prepare(e).ok());
}

TEST_CASE("graphpipe refuses a chain too long for its memo before planning") {
  // One series node of 2,000 leaves: 2000 * 2001 / 2 runs x 9 device counts (18,009,000) + the
  // runs' layer lists (2000 * 2001 * 2002 / 6 = 1,335,334,000) = 1.35e9 cells > 2^28.
  Experiment e = chain_experiment(2000, 8, 1e-3, 2e-3, "graph-1f1b",
                                  make_switch_cluster(8, "gpu", test_device(), 1e9, 0));
  e.strategy.partitioner = "graphpipe";
  Result<PreparedRun> run = prepare(e);
  REQUIRE_FALSE(run.ok());
  CHECK(run.error().message.find("graphpipe: planning needs about 1.35e+09 memo cells") != std::string::npos);
}

TEST_CASE("graphpipe refuses a series of more parts than its memo keys hold") {
  // 10,000 layers in a chain: one series node of 10,000 children, above 4,095 (12 bits of the key).
  Experiment e = chain_experiment(10000, 8, 1e-3, 2e-3, "graph-1f1b",
                                  make_switch_cluster(8, "gpu", test_device(), 1e9, 0));
  e.strategy.partitioner = "graphpipe";
  Result<PreparedRun> run = prepare(e);
  REQUIRE_FALSE(run.ok());
  CHECK(run.error().message.find("a node of 10000 parts") != std::string::npos);
  CHECK(run.error().message.find("limit of 4095") != std::string::npos);
}

// Cluster sizes (issue 16: a 683,277-device switch took the fuzzer's 2 GiB): each generator counts its
// devices, network nodes and links before it allocates. The counts are checked at the boundary against
// hand counts of what the generator then builds.
TEST_CASE("cluster limits: a ring of 131072 devices builds, one more is refused") {
  const LinkSpec link{25e9, 1e-6};
  Result<Cluster> at = make_ring_cluster(131072, "gpu", test_device(), link);
  REQUIRE(at.ok());
  CHECK(at->devices.size() == 131072);
  CHECK(at->links.size() == 131072);  // a ring of n > 2 devices has n links
  Result<Cluster> over = make_ring_cluster(131073, "gpu", test_device(), link);
  REQUIRE_FALSE(over.ok());
  CHECK(over.error().message ==
        "a ring would have 131073 devices, above pipegrid's limit of 131072 (see docs/limits.md)");
}

TEST_CASE("cluster limits: a one-group dragonfly's local links are counted before they are made") {
  // One group of r routers with one device each: r device links and r (r - 1) / 2 local links, no global
  // link. r = 2047: 2047 + 2,094,081 = 2,096,128 links (under 2^21 = 2,097,152); r = 2048: 2048 +
  // 2,096,128 = 2,098,176 (over).
  DragonflySpec s;
  s.groups = 1;
  s.routers = 2047;
  s.hosts = 1;
  s.global = 1;
  s.device = test_device();
  s.host_link = s.local_link = s.global_link = LinkSpec{25e9, 1e-6};
  Result<Cluster> at = make_dragonfly_cluster(s);
  REQUIRE(at.ok());
  CHECK(at->links.size() == 2096128);
  s.routers = 2048;
  Result<Cluster> over = make_dragonfly_cluster(s);
  REQUIRE_FALSE(over.ok());
  CHECK(over.error().message.find("would have 2098176 links, above pipegrid's limit of 2097152") !=
        std::string::npos);
}

TEST_CASE("cluster limits: a fat-tree counts its switches and switch links") {
  // k = 16: k^3/4 = 1024 device slots, 5 k^2 / 4 = 320 switches, k^3/4 edge-aggregation plus k^3/4
  // aggregation-core links = 2048, plus one link per device.
  Result<Cluster> c = make_fat_tree_cluster(16, 1000, "gpu", test_device(), LinkSpec{25e9, 1e-6});
  REQUIRE(c.ok());
  CHECK(c->switches.size() == 320);
  CHECK(c->links.size() == 1000 + 2048);
  // k = 128 with every slot (524,288 devices) is over the device limit; 131,072 of them fit.
  CHECK_FALSE(make_fat_tree_cluster(128, 524288, "gpu", test_device(), LinkSpec{25e9, 1e-6}).ok());
  CHECK(check_cluster_size("x", 131072, 5.0 * 128 * 128 / 4, 131072 + 2.0 * 524288).ok());
}

TEST_CASE("cluster limits: products of sizes cannot overflow the count") {
  // 1,000,000^3 overflows 64-bit integers' 9.2e18 only as a product of three; in doubles it is 1e18.
  DragonflySpec s;
  s.groups = s.routers = s.hosts = 1000000;
  s.global = 1;
  s.device = test_device();
  s.host_link = s.local_link = s.global_link = LinkSpec{25e9, 1e-6};
  Result<Cluster> c = make_dragonfly_cluster(s);
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().message.find("would have 1000000000000000000 devices") != std::string::npos);
}

TEST_CASE("layer limits: a model graph stops at 131072 layers, counted as it is built") {
  // candle-uno with one branch of L fully connected layers and a one-layer trunk: its input, L layers,
  // the trunk layer and the output = L + 3 layers (no concat with one branch). L = 131,069 gives
  // exactly 131,072; one more is refused.
  Result<const ModelInfo*> info = find_model("candle-uno");
  REQUIRE(info.ok());
  const ModelArgs small{{"branches", 1}, {"width", 8}, {"trunk_layers", 1}, {"trunk_width", 8}};
  ModelArgs args = small;
  args["layers"] = 131069;
  Result<Workload> at = build_model(**info, args, Precision::FP32);
  REQUIRE(at.ok());
  CHECK(at->layer_count() == 131072);
  args["layers"] = 131070;
  Result<Workload> over = build_model(**info, args, Precision::FP32);
  REQUIRE_FALSE(over.ok());
  CHECK(over.error().message ==
        "model candle-uno: the model has more than 131072 layers, pipegrid's limit (see docs/limits.md)");
}

TEST_CASE("the widest plan the limits allow, 131,072 one-layer stages on 131,072 devices, is simulated") {
  // One stage per device of the largest cluster (kMaxClusterDevices) on one switch, GPipe, one
  // micro-batch: the forward and the backward walk the chain once each. By hand: 131,072 x (1 ms +
  // 2 ms) of compute plus 2 x 131,071 transfers of 1 MiB over two 25 GB/s, 1 us links, each
  // 2 us + 2^20 / 25e9 s = 43.94304 us: 404.7353163... s. (Before: a stages x devices table in the
  // lowering, 64 GiB here, and a search per pair through the switch's ports, 54 s at 32,768 devices
  // and growing with the square.)
  const int n = static_cast<int>(kMaxClusterDevices);
  Experiment e =
      chain_experiment(n, 1, 1e-3, 2e-3, "gpipe", make_switch_cluster(n, "gpu", test_device(), 25e9, 1e-6));
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  CHECK(run->graph.tasks.size() ==
        static_cast<size_t>(2 * n + n + 2 * (n - 1)));  // F, B, optimizer steps, transfers
  Result<Timeline> t = evaluate(run->graph, e.cluster);
  REQUIRE(t.ok());
  const double hop = 2e-6 + 1048576 / 25e9;
  const double expected = n * 3e-3 + 2.0 * (n - 1) * hop;
  CHECK(t->makespan() == pipegrid::testing::approx(expected).epsilon(1e-9));
}
