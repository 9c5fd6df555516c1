// The schedule library in SimGrid, against docs/reference/closed-forms.md (communication made
// negligible: 1000 TB/s links, zero latency, 1 KiB activations).
#include <doctest/doctest.h>

#include "core/experiment.h"
#include "core/metrics.h"
#include "core/strategy.h"
#include "sim/replay.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

constexpr double kAct = 1024;

Cluster fast(int p) {
  return make_switch_cluster(p, "gpu", test_device(), 1e15, 0);
}

struct Run {
  PreparedRun prepared;
  Timeline timeline;
  Metrics metrics;
};

Run simulate(const Experiment& e) {
  Result<PreparedRun> run = prepare(e);
  if (!run) FAIL(run.error().message);
  Result<sim::Replay> r = process::replay_isolated(e.cluster, run->graph);
  if (!r) FAIL(r.error().message);
  Metrics m = compute_metrics(e.cluster, run->graph, r->timeline);
  return {std::move(*run), std::move(r->timeline), m};
}

}  // namespace

TEST_CASE("interleaved-1f1b: m (T_F + T_BW) + (p - 1)(T_F + T_BW) / v and rank 0's stash, v = 2 and 4") {
  // T_F and T_BW are a device's whole share; one layer (A bytes) per chunk, so M_a = v A.
  const double tf = 1e-3, tbw = 2e-3;
  for (int v : {2, 4}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = p; m <= 3 * p; m += p) {
        Run r = simulate(schedule_experiment("interleaved-1f1b", p, m, fast(p), v, tf, tbw, 0, kAct));
        INFO("v=" << v << " p=" << p << " m=" << m);
        CHECK(close_rel(r.metrics.iteration_time_s, m * (tf + tbw) + (p - 1) * (tf + tbw) / v, 1e-6));
        const double bubble = ((p - 1.0) / v) / (m + (p - 1.0) / v);
        CHECK(close_rel(r.metrics.bubble_ratio, bubble, 1e-6));
        // Rank 0 holds p (1 + (p - 1)/(p v)) micro-batches' worth of M_a (= v p + p - 1 chunks),
        // unless the warm-up covers every chunk-step.
        const double chunks = std::min<double>(v * p + p - 1, m * v);
        CHECK(r.metrics.devices[0].peak_activation_bytes == pipegrid::testing::approx(chunks * kAct));
      }
    }
  }
}

TEST_CASE(
    "zb-h1: m (T_F + T_BW) + (p - 1)(T_F + T_B - T_W) and p micro-batches in flight, equal and unequal "
    "times") {
  struct Times {
    double f, b, w;
  };
  for (Times t : {Times{1e-3, 1e-3, 1e-3}, Times{1e-3, 2e-3, 1e-3}, Times{1.3e-3, 0.7e-3, 0.5e-3}}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = p; m <= 3 * p; ++m) {
        Run r = simulate(schedule_experiment("zb-h1", p, m, fast(p), 1, t.f, t.b, t.w, kAct));
        INFO("T=" << t.f << "," << t.b << "," << t.w << " p=" << p << " m=" << m);
        CHECK(
            close_rel(r.metrics.iteration_time_s, m * (t.f + t.b + t.w) + (p - 1) * (t.f + t.b - t.w), 1e-6));
        CHECK(r.metrics.devices[0].peak_activation_bytes == pipegrid::testing::approx(p * kAct));
        for (int i = 1; i < p; ++i) CHECK(r.metrics.devices[i].peak_activation_bytes <= p * kAct + 1e-9);
      }
    }
  }
}

TEST_CASE("zb-h2 with T_F = T_B = T_W: a parallelogram with no bubble in steady state, 2p - 1 in flight") {
  const double t = 1e-3;
  for (int p = 1; p <= 8; ++p) {
    for (int m = p; m <= 3 * p; ++m) {
      Run r = simulate(schedule_experiment("zb-h2", p, m, fast(p), 1, t, t, t, kAct));
      INFO("p=" << p << " m=" << m);
      CHECK(close_rel(r.metrics.iteration_time_s, m * 3 * t + (p - 1) * t, 1e-6));
      CHECK(r.metrics.devices[0].peak_activation_bytes ==
            pipegrid::testing::approx(std::min(2 * p - 1, m) * kAct));
      // With a steady state (m >= 2p - 1, so that worker 0 still has forwards to run when its first
      // backward arrives), worker i starts at i (T_F + c), c the transfer of kAct bytes at 1e15 B/s
      // (1e-12 s), and is busy without a gap until it ends.
      if (m < 2 * p - 1) continue;
      for (int i = 0; i < p; ++i) {
        double first = 1e300, last = 0;
        for (int32_t task : r.prepared.graph.device_order[i]) {
          first = std::min(first, r.timeline.start[task]);
          last = std::max(last, r.timeline.end[task]);
        }
        CHECK(first == pipegrid::testing::approx(i * (t + kAct / 1e15)).epsilon(1e-9));
        CHECK(close_rel(last - first, r.metrics.devices[i].busy_s, 1e-6));
        CHECK(close_rel(r.metrics.devices[i].busy_s, 3 * m * t, 1e-6));
      }
    }
  }
}

TEST_CASE("every registered schedule simulates for p in 1..8, m in 1..3p, with every task done once") {
  for (const ScheduleStrategy& s : schedule_strategies()) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 3 * p; ++m) {
        if (!schedule_takes(std::string(s.name), p, m)) continue;
        Run r = simulate(schedule_experiment(std::string(s.name), p, m, fast(p)));
        INFO(s.name << " p=" << p << " m=" << m);
        for (size_t t = 0; t < r.timeline.end.size(); ++t) REQUIRE(r.timeline.end[t] >= r.timeline.start[t]);
        // Nothing beats the busiest device's work; no device is idle at the end of everything.
        double busiest = 0;
        for (const DeviceMetrics& d : r.metrics.devices) busiest = std::max(busiest, d.busy_s);
        CHECK(r.metrics.iteration_time_s >= busiest * (1 - 1e-9));
        CHECK(r.metrics.iteration_time_s > 0);
      }
    }
  }
}

TEST_CASE("round trip: each schedule exported as CSV and replayed with `file` gives the same timeline") {
  for (const ScheduleStrategy& s : schedule_strategies()) {
    // DualPipe's two pipelines share their parameters between mirror stages, which a CSV cannot say.
    // DualPipeV's overlapped pairs are torch's OVERLAP_F_B cells, its V placement read from the rows.
    if (s.name == "file" || s.name == "dualpipe") continue;
    for (auto [p, m] : {std::pair{4, 8}, std::pair{3, 6}}) {
      const int chunks = s.name == "interleaved-1f1b" || s.name == "dualpipev" ? 2 : 1;
      Experiment original = schedule_experiment(std::string(s.name), p, m,
                                                make_switch_cluster(p, "gpu", test_device(), 25e9, 1e-6), 2,
                                                1e-3, 1.5e-3, 0.5e-3, 8 << 20);
      Run a = simulate(original);
      Experiment replayed = original;
      replayed.strategy.schedule = "file";
      replayed.strategy.chunks = chunks;
      replayed.strategy.schedule_text = to_csv(a.prepared.schedule);
      replayed.strategy.schedule_source = "exported.csv";
      Run b = simulate(replayed);
      INFO(s.name << " p=" << p << " m=" << m);
      CHECK(b.prepared.schedule.device_actions == a.prepared.schedule.device_actions);
      for (size_t d = 0; d < a.prepared.schedule.device_actions.size(); ++d)
        for (size_t i = 0; i < a.prepared.schedule.device_actions[d].size(); ++i)
          CHECK(b.prepared.schedule.is_paired(d, i) == a.prepared.schedule.is_paired(d, i));
      for (size_t st = 0; st < a.prepared.partition.stage_count(); ++st)
        CHECK(b.prepared.partition.stage(st).devices == a.prepared.partition.stage(st).devices);
      REQUIRE(b.timeline.start.size() == a.timeline.start.size());
      CHECK(b.timeline.start == a.timeline.start);
      CHECK(b.timeline.end == a.timeline.end);
    }
  }
}

TEST_CASE("a deadlocking schedule left to the replay fails it with the validator's located message") {
  // gpu1 runs its second micro-batch first; gpu0 runs 0B0 before 0F1: each waits for the other.
  Experiment e = schedule_experiment("1f1b", 2, 2, fast(2), 1, 1e-3, 2e-3, 0, kAct);
  Result<PreparedRun> run = prepare(e, nullptr, /*prove_deadlock_free=*/false);
  REQUIRE(run.ok());
  Schedule bad = run->schedule;
  bad.device_actions[0] = {
      {0, Pass::Forward, 0}, {0, Pass::Backward, 0}, {0, Pass::Forward, 1}, {0, Pass::Backward, 1}};
  bad.device_actions[1] = {
      {1, Pass::Forward, 1}, {1, Pass::Backward, 1}, {1, Pass::Forward, 0}, {1, Pass::Backward, 0}};
  const PlanRequest request{e.workload, e.cluster, e.strategy, e.memory, {{1, 2}}, nullptr};
  Plan plan = *run;
  plan.schedule = bad;
  // Proving first refuses the plan...
  Result<TaskGraph> proved = lower_plan(request, plan);
  REQUIRE(!proved.ok());
  const std::string expected =
      "invalid schedule: it deadlocks; no device can run its marked action\n"
      "  gpu0: 0F0 [0B0] 0F1 0B1  (waits for 1B0 on gpu1)\n"
      "  gpu1: [1F1] 1B1 1F0 1B0  (waits for 0F1 on gpu0)";
  CHECK(proved.error().message == expected);
  // ...and without the proof the graph lowers, and the replay stops with the same message.
  Result<TaskGraph> g = lower_plan(request, plan, /*prove_deadlock_free=*/false);
  REQUIRE(g.ok());
  sim::ReplayOptions o;
  o.schedule = &bad;
  Result<sim::Replay> r = process::replay_isolated(e.cluster, *g, o);
  REQUIRE(!r.ok());
  CHECK(r.error().message == expected);
  // Without the schedule, the executor says what each device waits for.
  Result<sim::Replay> bare = process::replay_isolated(e.cluster, *g);
  REQUIRE(!bare.ok());
  CHECK(bare.error().message.rfind("the schedule deadlocks:\n  gpu0 waits at 0B0 on gpu0 for 1B0 on gpu1",
                                   0) == 0);
}

TEST_CASE("a schedule file's OVERLAP_F_B pair starts once its backward's input is there too (by hand)") {
  // Two stages of T_F = 1 ms, T_B = 2 ms, communication negligible, 2 micro-batches; gpu0 runs
  // 0F0 0F1 0B0 0B1 and gpu1 1F0 1B0 1F1 1B1. Apart: 0F1 runs at [1, 2], 1B0 at [2, 4], 0B0 at
  // [4, 6], 1F1 at [4, 5], 1B1 at [5, 7], 0B1 at [7, 9]: 9 ms. As the pair (0F1;0B0), 0F1 also waits
  // for 0B0's input (1B0 ends at 4): 0F1 [4, 5], 0B0 [5, 7], 1F1 [5, 6], 1B1 [6, 8], 0B1 [8, 10]: 10 ms.
  Experiment e = schedule_experiment("file", 2, 2, fast(2), 1, 1e-3, 2e-3, 0, kAct);
  e.strategy.schedule_source = "pair.csv";
  e.strategy.schedule_text = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";
  CHECK(simulate(e).metrics.iteration_time_s == pipegrid::testing::approx(9e-3).epsilon(1e-6));
  e.strategy.schedule_text = "0F0,(0F1;0B0)OVERLAP_F_B,0B1\n1F0,1B0,1F1,1B1\n";
  Run paired = simulate(e);
  CHECK(paired.prepared.schedule.is_paired(0, 1));
  CHECK(paired.metrics.iteration_time_s == pipegrid::testing::approx(10e-3).epsilon(1e-6));
}

TEST_CASE("torch's DualPipeV order (I + W, B, OVERLAP_F_B) replays in its V with every weight gradient") {
  // ScheduleDualPipeV's order for 2 ranks and 4 micro-batches as torch writes it: full backwards (B) in
  // and out of pairs beside split ones (I, then W). Each device runs 2 stages x 4 micro-batches of
  // F + B + W (T_F / 2, (T_B + T_W) / 2 per stage): busy 4 (T_F + T_B + T_W) = 12 ms exactly, which
  // holds only if every full B costs its weight gradient too.
  Experiment e = schedule_experiment("dualpipev", 2, 4, fast(2), 2, 1e-3, 1.5e-3, 0.5e-3, kAct);
  e.strategy.schedule = "file";
  e.strategy.schedule_source = "dualpipev-torch.csv";
  e.strategy.schedule_text =
      "0F0,0F1,0F2,3F0,3I0,3W0,3F1,(0F3;3B1)OVERLAP_F_B,(3F2;0B0)OVERLAP_F_B,3B2,(3F3;0B1)OVERLAP_F_B,3B3,"
      "0I2,0W2,0I3,0W3\n"
      "1F0,2F0,1F1,2F1,1F2,2B0,(2F2;1B0)OVERLAP_F_B,(1F3;2B1)OVERLAP_F_B,(2F3;1B1)OVERLAP_F_B,2B2,1B2,2I3,"
      "1I3,2W3,1W3\n";
  Run r = simulate(e);
  CHECK(r.prepared.partition.stage(3).devices == std::vector<int>{0});  // the V: stages 0 and 3 on rank 0
  CHECK(r.prepared.partition.stage(2).devices == std::vector<int>{1});
  for (const DeviceMetrics& d : r.metrics.devices)
    CHECK(d.busy_s == pipegrid::testing::approx(12e-3).epsilon(1e-6));
  CHECK(r.metrics.iteration_time_s >= 12e-3);
}
