// The device clocks (the replay's default for compute tasks, sim/replay.cc) against SimGrid's own CPU
// model (ReplayOptions::simgrid_execs: every compute task a SimGrid Exec): every start and end of
// every task must be identical, bit for bit, on configurations drawn at random (fixed seed) over the
// schedules, switch clusters whose links are shared (max-min and TCP sharing, mixed latencies), lines
// and meshes, replicated stages, device speeds that do not divide the work exactly, and the corner
// cases of SimGrid's arithmetic the device clocks reproduce: exact ties between many completions,
// completions less than SimGrid's timing precision (1e-9 s) apart, compute tasks shorter than that,
// work below SimGrid's work precision, and route latencies too small to move the clock.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <random>

#include "core/experiment.h"
#include "sim/replay.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

std::vector<std::string> hex_rows(const TaskGraph& g, const Timeline& t) {
  std::vector<std::string> out;
  for (size_t i = 0; i < g.tasks.size(); ++i)
    out.push_back(fmt::format("{} {:a} {:a}", i, t.start[i], t.end[i]));
  return out;
}

// Replays `e` both ways; returns the number of tasks compared.
size_t compare_modes(const Experiment& e) {
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), run.error().message);
  Result<sim::Replay> clocks = process::replay_isolated(e.cluster, run->graph);
  REQUIRE_MESSAGE(clocks.ok(), clocks.error().message);
  sim::ReplayOptions o;
  o.simgrid_execs = true;
  Result<sim::Replay> execs = process::replay_isolated(e.cluster, run->graph, o);
  REQUIRE_MESSAGE(execs.ok(), execs.error().message);
  const std::vector<std::string> a = hex_rows(run->graph, clocks->timeline);
  const std::vector<std::string> b = hex_rows(run->graph, execs->timeline);
  REQUIRE(a.size() == b.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i] && differ++ < 3) CHECK_MESSAGE(a[i] == b[i], "device clocks vs SimGrid Execs");
  CHECK(differ == 0);
  return a.size();
}

DeviceSpec device_with_speed(double flops) {
  DeviceSpec d = test_device();
  d.peak_flops.fill(flops);
  return d;
}

// `count` devices on one switch; link i's latency from `latencies` (cycled): flows between devices
// share their access links, with routes of unequal latency.
Cluster shared_switch(int count, double bandwidth, const std::vector<double>& latencies, double speed,
                      Sharing sharing) {
  Cluster c;
  c.name = "switch";
  c.switches.push_back("sw");
  for (int i = 0; i < count; ++i) {
    c.devices.push_back({"gpu" + std::to_string(i), device_with_speed(speed * (1 + 0.137 * i)), ""});
    c.links.push_back(
        {i, count, bandwidth, latencies[static_cast<size_t>(i) % latencies.size()], Duplex::Full});
  }
  c.sharing = sharing;
  return c;
}

}  // namespace

TEST_CASE("device clocks: bit-identical to SimGrid's CPU model on random configurations") {
  std::mt19937_64 rng(20261124);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  const std::vector<std::string> schedules = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "file"};
  size_t tasks = 0, configurations = 0;
  for (int k = 0; k < 36; ++k) {
    const std::string schedule = schedules[static_cast<size_t>(k) % schedules.size()];
    const int p = 2 + pick(3), m = 3 + pick(6);
    const double speed = uniform(1e12, 3e14);
    const double bandwidth = uniform(1e9, 5e10);
    Cluster cluster;
    switch (pick(4)) {
      case 0:
        cluster = line_cluster(p, bandwidth, uniform(0, 5e-6));
        break;
      case 1:
        cluster = shared_switch(p, bandwidth, {1e-6, 2.2e-5, 3.7e-6}, speed, Sharing::MaxMin);
        break;
      case 2:
        cluster = shared_switch(p, bandwidth, {1e-6, 2.2e-5}, speed, Sharing::Tcp);
        break;
      default:
        cluster = shared_switch(p, bandwidth, {0.0}, speed, Sharing::MaxMin);
        break;
    }
    for (Device& d : cluster.devices) d.spec.peak_flops.fill(speed * uniform(0.7, 1.3));
    const double tf = uniform(2e-4, 2e-3), tb = uniform(2e-4, 2e-3), tw = uniform(1e-4, 1e-3);
    Experiment e = schedule_experiment(schedule, p, m, cluster, 2, tf, tb, tw, uniform(1e4, 4e7));
    INFO("configuration " << k << ": " << schedule << ", p " << p << ", m " << m);
    tasks += compare_modes(e);
    ++configurations;
  }
  CHECK(configurations == 36);
  CHECK(tasks > 2000);
}

TEST_CASE("device clocks: replicated stages with a ring all-reduce over a shared switch") {
  for (double latency : {0.0, 1e-6, 3.3e-6}) {
    Experiment e =
        chain_experiment(3, 6, 1.3e-3, 2.9e-3, "1f1b",
                         shared_switch(6, 1.1e10, {latency, 2 * latency}, 7.3e13, Sharing::MaxMin), 3e6);
    e.strategy.replicas = 2;
    INFO("latency " << latency);
    CHECK(compare_modes(e) > 0);
  }
}

TEST_CASE("device clocks: exact ties, near ties and durations below SimGrid's precisions") {
  // Integer milliseconds on equal devices: many compute tasks end at exactly the same dates.
  Experiment ties = schedule_experiment("1f1b", 4, 8, shared_switch(4, 1e10, {0.0}, 1e12, Sharing::MaxMin), 2,
                                        1e-3, 2e-3, 1e-3, 1e6);
  for (Device& d : ties.cluster.devices) d.spec.peak_flops.fill(1e12);
  CHECK(compare_modes(ties) > 0);
  // Near ties: two branches a1 -> a2 and b1 -> b2 joined by c, on their own devices from time 0, whose
  // forward times differ by 0.4 ns. SimGrid's CPU model reports both first forwards at the earlier
  // end (within its 1e-9 s precision); checked on the Execs themselves below, then both ways.
  auto layer = [](const std::string& name, double f) {
    Layer l;
    l.name = name;
    l.output_bytes = l.stash_bytes = 1e5;
    l.parameter_bytes = 4e6;
    l.parameters = 1e6;
    l.measured = MeasuredCost{f, 2 * f, 0, 1, ""};
    return l;
  };
  Experiment near;
  for (const char* n : {"a1", "a2"}) near.workload.add_layer(layer(n, 1e-3));
  for (const char* n : {"b1", "b2"}) near.workload.add_layer(layer(n, 1e-3 + 4e-10));
  const int c = near.workload.add_layer(layer("c", 1e-6));
  near.workload.add_edge(0, 1);
  near.workload.add_edge(2, 3);
  near.workload.add_edge(1, c);
  near.workload.add_edge(3, c);
  near.cluster = line_cluster(4, 1e10, 1e-6);
  near.strategy.micro_batches = 4;
  near.strategy.partitioner = "graphpipe";
  near.strategy.schedule = "graph-1f1b";
  {
    Result<PreparedRun> run = prepare(near);
    REQUIRE(run.ok());
    sim::ReplayOptions o;
    o.simgrid_execs = true;
    Result<sim::Replay> r = process::replay_isolated(near.cluster, run->graph, o);
    REQUIRE(r.ok());
    // The first task of each device starting at 0: those of a1's and b1's devices end together.
    std::vector<double> first_ends;
    for (const std::vector<int32_t>& order : run->graph.device_order)
      if (!order.empty() && r->timeline.start[order.front()] == 0)
        first_ends.push_back(r->timeline.end[order.front()]);
    REQUIRE(first_ends.size() == 2);
    CHECK(first_ends[0] == first_ends[1]);
  }
  CHECK(compare_modes(near) > 0);
  // Compute tasks of 0.3 ns (below the timing precision) and of 1e-27 s (work below the work
  // precision at 1 TFLOP/s), on a switch of zero latency and one of 1e-20 s latency, which does not
  // move a clock of a few nanoseconds.
  for (double tf : {3e-10, 1e-27})
    for (double latency : {0.0, 1e-20}) {
      Experiment tiny = schedule_experiment(
          "gpipe", 3, 4, shared_switch(3, 1e10, {latency}, 1e12, Sharing::MaxMin), 2, tf, tf, tf, 10);
      for (Device& d : tiny.cluster.devices) d.spec.peak_flops.fill(1e12);
      INFO("forward " << tf << " s, latency " << latency << " s");
      CHECK(compare_modes(tiny) > 0);
    }
}
