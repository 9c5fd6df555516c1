// GraphPipe-style planning: graph-1f1b, the graphpipe partitioner, and their oracles.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <random>

#include "core/evaluate.h"
#include "core/experiment.h"
#include "core/metrics.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

struct Planned {
  PreparedRun run;
  Metrics metrics;
};

Planned plan(const Experiment& e) {
  Result<PreparedRun> run = prepare(e);
  if (!run) FAIL(run.error().message);
  Result<Timeline> t = evaluate(run->graph, e.cluster);
  if (!t) FAIL(t.error().message);
  Metrics m = compute_metrics(e.cluster, run->graph, *t);  // before the run is moved from
  return {std::move(*run), m};
}

Layer layer(const std::string& name, double f, double b, double act, double params) {
  Layer l;
  l.name = name;
  l.output_bytes = act;
  l.stash_bytes = act;
  l.parameter_bytes = params;
  l.parameters = params / 4;
  l.measured = MeasuredCost{f, b, 0, 1, ""};  // per sample
  return l;
}

// Two branches of two equal layers each (no shared layer).
Workload two_branches(double f, double b) {
  Workload w;
  for (const char* n : {"a1", "a2", "b1", "b2"}) w.add_layer(layer(n, f, b, 8, 64 << 20));
  w.add_edge(0, 1);
  w.add_edge(2, 3);
  return w;
}

}  // namespace

TEST_CASE("graph-1f1b equals 1f1b on chains") {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 3 * p; ++m) {
      Cluster c = make_switch_cluster(p, "gpu", test_device(), 1e15, 0);
      Experiment a = chain_experiment(p, m, 1e-3, 2e-3, "1f1b", c);
      Experiment b = chain_experiment(p, m, 1e-3, 2e-3, "graph-1f1b", c);
      INFO("p=" << p << " m=" << m);
      CHECK(prepare(a)->schedule.device_actions == prepare(b)->schedule.device_actions);
    }
  }
}

TEST_CASE("a cheap join shares the stage of one branch's end (join fusion), saving its own device") {
  // a1 -> a2 and b1 -> b2 joined by a near-free concat c, on 4 devices. Without fusion the concat
  // needs a device of its own, so one branch gets one device for two layers (bottleneck 2 (F + B)
  // per sample, since replication pays a 64 MiB all-reduce); with it, {b2, c} is one stage and
  // every layer has its device: bottleneck F + B (+ the concat's), the stage graph a1 -> a2 ->
  // {b2, c} <- b1 of depth 3, iteration (m + 2)(T_F + T_BW) up to the concat's time.
  const double f = 1e-3, b = 2e-3, tiny = 1e-7;
  for (int m : {4, 8}) {
    Experiment e;
    e.workload = two_branches(f, b);
    const int c = e.workload.add_layer(layer("c", tiny, tiny, 8, 0));
    e.workload.add_edge(1, c);
    e.workload.add_edge(3, c);
    e.cluster = make_switch_cluster(4, "gpu", test_device(), 25e9, 0);
    e.strategy.micro_batches = m;
    e.strategy.partitioner = "graphpipe";
    e.strategy.schedule = "graph-1f1b";
    Planned g = plan(e);
    INFO("m=" << m << ": " << g.run.partition.plan.summary);
    CHECK(g.run.partition.plan.summary.find("1 joins fused with") != std::string::npos);
    REQUIRE(g.run.partition.stage_count() == 4);
    CHECK(g.run.partition.depth() == 3);
    auto stage_of = [&](int layer) {
      for (size_t s = 0; s < g.run.partition.stage_count(); ++s)
        for (int l : g.run.partition.stage(s).layers)
          if (l == layer) return static_cast<int>(s);
      return -1;
    };
    CHECK((stage_of(c) == stage_of(1) || stage_of(c) == stage_of(3)));
    for (size_t s = 0; s < 4; ++s) CHECK(g.run.partition.stage(s).devices.size() == 1);
    CHECK(g.metrics.iteration_time_s >= (m + 2) * (f + b));
    CHECK(g.metrics.iteration_time_s <= (m + 2) * (f + b + 2 * tiny) * (1 + 1e-6));
  }
}

TEST_CASE("two equal branches on 4 devices: graphpipe's depth is 2 where the sequential pipeline's is 4") {
  const double f = 1e-3, b = 2e-3;  // per sample; micro-batches of one sample
  for (int m : {4, 8, 16}) {
    Experiment e;
    e.workload = two_branches(f, b);
    e.cluster = make_switch_cluster(4, "gpu", test_device(), 25e9, 0);
    e.strategy.micro_batches = m;
    e.strategy.partitioner = "graphpipe";
    e.strategy.schedule = "graph-1f1b";
    Planned g = plan(e);
    // Each layer alone on one device (replicating would pay a 64 MiB all-reduce per layer).
    CHECK(g.run.partition.stage_count() == 4);
    CHECK(g.run.partition.depth() == 2);
    for (size_t s = 0; s < 4; ++s) CHECK(g.run.partition.stage(s).devices.size() == 1);
    // A depth-2 pipeline: (m + 2 - 1)(T_F + T_BW); transfers of 8 bytes are negligible.
    CHECK(close_rel(g.metrics.iteration_time_s, (m + 1) * (f + b), 1e-6));
    e.strategy.partitioner = "uniform";
    e.strategy.schedule = "1f1b";
    Planned s = plan(e);
    CHECK(s.run.partition.depth() == 4);  // a chain: a1, a2, b1, b2
    CHECK(close_rel(s.metrics.iteration_time_s, (m + 3) * (f + b), 1e-6));
    // Memory: the graph pipeline's first stages hold 2 micro-batches, the chain's first holds 4.
    CHECK(g.metrics.devices[0].peak_activation_bytes == pipegrid::testing::approx(std::min(m, 2) * 8.0));
    CHECK(s.metrics.devices[0].peak_activation_bytes == pipegrid::testing::approx(std::min(m, 4) * 8.0));
  }
}

TEST_CASE("graphpipe never returns a plan that violates memory, and says so when nothing fits") {
  std::mt19937 rng(11);
  int planned = 0, refused = 0;
  for (int trial = 0; trial < 40; ++trial) {
    // A random multi-branch model: in -> k branches of random depth -> join -> head.
    Workload w;
    auto rnd = [&](double lo, double hi) { return lo + (hi - lo) * (rng() % 1000) / 1000.0; };
    const int in =
        w.add_layer(layer("in", rnd(1, 2) * 1e-4, rnd(1, 2) * 2e-4, rnd(1, 8) * 1e5, rnd(1, 4) * 1e6));
    const int branches = 1 + static_cast<int>(rng() % 4);
    std::vector<int> ends;
    for (int br = 0; br < branches; ++br) {
      int prev = in;
      for (int d = 0, depth = 1 + static_cast<int>(rng() % 4); d < depth; ++d) {
        int l = w.add_layer(layer(fmt::format("b{}_{}", br, d), rnd(1, 5) * 1e-4, rnd(2, 10) * 1e-4,
                                  rnd(1, 8) * 1e5, rnd(1, 16) * 1e6));
        w.add_edge(prev, l);
        prev = l;
      }
      ends.push_back(prev);
    }
    const int join = w.add_layer(layer("join", 1e-5, 2e-5, rnd(1, 8) * 1e5, 0));
    for (int e : ends) w.add_edge(e, join);
    w.add_edge(join, w.add_layer(layer("head", rnd(1, 2) * 1e-4, rnd(1, 2) * 2e-4, 1e3, rnd(1, 4) * 1e6)));
    Experiment e;
    e.workload = w;
    const int devices = 2 + static_cast<int>(rng() % 6);
    e.cluster = make_switch_cluster(devices, "gpu", test_device(rnd(0.02, 1.0) * 1e9), 25e9, 1e-6);
    e.strategy.partitioner = "graphpipe";
    e.strategy.schedule = "graph-1f1b";
    e.strategy.micro_batches = 1 + static_cast<int>(rng() % 12);
    e.micro_batch_size = 4;
    Result<PreparedRun> run = prepare(e);
    INFO("trial " << trial);
    if (!run) {
      ++refused;
      CHECK(run.error().message.find("graphpipe: no partition of the model over") == 0);
      continue;
    }
    ++planned;
    Result<Timeline> t = evaluate(run->graph, e.cluster);
    REQUIRE(t.ok());
    Metrics m = compute_metrics(e.cluster, run->graph, *t);
    CHECK(m.feasible());
    for (const DeviceMetrics& d : m.devices) CHECK(d.peak_memory_bytes <= d.capacity_bytes);
  }
  MESSAGE("graphpipe planned " << planned << " and refused " << refused << " of 40 random cases");
  CHECK(planned > 5);
  CHECK(refused >= 3);  // the refusal path is exercised (join fusion plans a few more)
}

TEST_CASE("on a sequential model graphpipe matches the sequential planner's throughput within 5%") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    Workload w;
    const int n = 8 + static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) {
      w.add_layer(layer(fmt::format("l{}", i), (1 + rng() % 10) * 1e-4, (2 + rng() % 20) * 1e-4, 1e4, 1e5));
      if (i) w.add_edge(i - 1, i);
    }
    Experiment e;
    e.workload = w;
    const int devices = 2 + static_cast<int>(rng() % 7);
    e.cluster = make_switch_cluster(devices, "gpu", test_device(), 25e9, 1e-6);
    e.strategy.micro_batches = 16;
    e.micro_batch_size = 4;
    e.strategy.partitioner = "balanced";
    e.strategy.schedule = "1f1b";
    const double sequential = plan(e).metrics.throughput_samples_per_s;
    e.strategy.partitioner = "graphpipe";
    e.strategy.schedule = "graph-1f1b";
    const double graph = plan(e).metrics.throughput_samples_per_s;
    INFO("trial " << trial << " layers " << n << " devices " << devices);
    CHECK(graph >= 0.95 * sequential);
  }
}

TEST_CASE("graphpipe refuses a search estimated above its limit, before searching") {
  // A chain of 48 layers is one series node of 48 children: 48^3 / 6 = 18,432 runs x splits, x 64^2
  // device counts x min(16 micro-batches, 64 devices) in-flight depths = 1,207,959,552 steps > 2^30.
  // (It ran for minutes before the limit.) On 32 devices: 3.0e8, under the limit.
  Experiment e =
      chain_experiment(48, 16, 1e-3, 2e-3, "1f1b", make_switch_cluster(64, "gpu", test_device(), 25e9, 1e-6));
  e.strategy.partitioner = "graphpipe";
  Result<PreparedRun> run = prepare(e);
  REQUIRE(!run.ok());
  CHECK(run.error().message.find("graphpipe: the search would take about 1.21e+09 steps") !=
        std::string::npos);
  CHECK(run.error().message.find("widest 48, x 64 devices squared x 16 in-flight depths") !=
        std::string::npos);
  CHECK(run.error().message.find("limit of 1.07e+09 (2^30") != std::string::npos);
}

TEST_CASE("a graphpipe mini-batch sweep is refused on its total search, before planning any size") {
  // 48-layer chain on 32 devices, mini_batch 64: sizes 1, 2, 4, ..., 64 make m = 64, 32, ..., 1
  // micro-batches, min(m, 32) in-flight depths = 32 + 32 + 16 + 8 + 4 + 2 + 1 = 95; each size
  // 48^3 / 6 x 32^2 = 18,874,368 steps per depth: 1,793,064,960 in all > 2^30, though every size
  // alone (at most 6.0e8) is under it.
  Experiment e =
      chain_experiment(48, 1, 1e-3, 2e-3, "1f1b", make_switch_cluster(32, "gpu", test_device(), 25e9, 1e-6));
  e.strategy.partitioner = "graphpipe";
  e.strategy.mini_batch = 64;
  Result<PreparedRun> run = prepare(e);
  REQUIRE(!run.ok());
  CHECK(run.error().message.find(
            "global_batch 64: graphpipe over its 7 micro-batch sizes would take about 1.79e+09 "
            "search steps in all") != std::string::npos);
}

TEST_CASE("graphpipe's refusal under a schedule other than graph-1f1b says it counted every micro-batch") {
  // A chain of 8 layers of 1 MiB on 4 devices of 20 MiB with 8 micro-batches: 1F1B's 2/2/2/2 fits
  // (17 MiB), but graphpipe counts all m in flight for schedules other than graph-1f1b, and its
  // refusal said only "no partition fits" (with the memory in raw bytes).
  Workload w;
  int prev = -1;
  for (int i = 0; i < 8; ++i) {
    const int l = w.add_layer(layer(fmt::format("l{}", i), 1e-3, 2e-3, 1 << 20, 1 << 20));
    if (prev >= 0) w.add_edge(prev, l);
    prev = l;
  }
  Experiment e;
  e.workload = w;
  e.cluster = make_switch_cluster(4, "gpu", test_device(20.0 * (1 << 20)), 10e9, 1e-6);
  e.strategy.partitioner = "graphpipe";
  e.strategy.schedule = "1f1b";
  e.strategy.micro_batches = 8;
  Result<PreparedRun> run = prepare(e);
  REQUIRE(!run);
  CHECK(run.error().message.find("counting all 8 in flight as under schedule 1f1b") != std::string::npos);
  CHECK(run.error().message.find("(20 MiB each)") != std::string::npos);
  e.strategy.schedule = "graph-1f1b";
  CHECK(prepare(e).ok());
}
