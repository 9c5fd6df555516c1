// The core pipeline (partition, schedule, lowering) run by the analytic evaluator, against the
// closed forms of docs/reference/closed-forms.md (independent oracle).
#include <doctest/doctest.h>

#include <algorithm>

#include "core/evaluate.h"
#include "core/experiment.h"
#include "core/lower.h"
#include "core/metrics.h"
#include "core/models/chain.h"
#include "core/validate.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

Metrics analytic(const Experiment& e) {
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  Result<Timeline> t = evaluate(run->graph, e.cluster);
  REQUIRE(t.ok());
  return compute_metrics(e.cluster, run->graph, *t);
}

}  // namespace

TEST_CASE("analytic: gpipe and 1f1b iteration time, bubble and stash match the closed forms") {
  const double tf = 1.3e-3, tbw = 2.9e-3, act = 3 << 20;
  for (const char* sched : {"gpipe", "1f1b"}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 3 * p; ++m) {
        // Zero latency, infinite-looking bandwidth: communication takes ~1e-12 s.
        Experiment e = chain_experiment(p, m, tf, tbw, sched,
                                        make_switch_cluster(p, "gpu", test_device(), 1e21, 0), act);
        Metrics mt = analytic(e);
        INFO(sched << " p=" << p << " m=" << m);
        CHECK(close_rel(mt.iteration_time_s, (m + p - 1) * (tf + tbw), 1e-9));
        CHECK(close_rel(mt.bubble_ratio, (p - 1.0) / (m + p - 1.0), 1e-9));
        for (int i = 0; i < p; ++i) {
          int in_flight = std::string(sched) == "gpipe" ? m : std::min(p - i, m);
          CHECK(mt.devices[i].peak_activation_bytes == pipegrid::testing::approx(in_flight * act));
        }
      }
    }
  }
}

TEST_CASE("analytic: transfers of duration c per boundary match the independent list simulation") {
  // closed-forms.md: T_F = 1, T_BW = 2, p = 4, m = 8: c = 0.5 gives GPipe 36, 1F1B 41; p = 3, m = 6,
  // T_F = T_BW = 1, c = 0.3 gives 17.2 and 19.0 (no contention). With c <= T_F no two transfers
  // ever share a link, so the evaluator's FIFO links give the same. With c = 2 > T_F they do: the
  // reference's 45 for GPipe assumes two transfers on one link at full speed at once, while the
  // evaluator serialises them (by hand: forward k crosses boundary 0 in [1 + 2k, 3 + 2k], reaches
  // stage 3 at 9 + 2k, so the last F ends at 24; the 8 backwards of 2 then flow back at one per 2
  // units through 3 transfers and 3 more backwards: 24 + 8 x 2 + 3 x (2 + 2) = 52). 1F1B's
  // alternation already spaces its transfers: 65 either way.
  struct Case {
    int p, m;
    double tf, tbw, c, gpipe, ofob;
  };
  for (Case k :
       {Case{4, 8, 1, 2, 0.5, 36, 41}, Case{4, 8, 1, 2, 2, 52, 65}, Case{3, 6, 1, 1, 0.3, 17.2, 19.0}}) {
    const double unit = 1e-3;
    const double bytes = 1 << 20;
    Cluster line = line_cluster(k.p, bytes / (k.c * unit), 0);
    Metrics g = analytic(chain_experiment(k.p, k.m, k.tf * unit, k.tbw * unit, "gpipe", line, bytes));
    Metrics o = analytic(chain_experiment(k.p, k.m, k.tf * unit, k.tbw * unit, "1f1b", line, bytes));
    INFO("p=" << k.p << " m=" << k.m << " c=" << k.c);
    CHECK(g.iteration_time_s == pipegrid::testing::approx(k.gpipe * unit).epsilon(1e-9));
    CHECK(o.iteration_time_s == pipegrid::testing::approx(k.ofob * unit).epsilon(1e-9));
    // GPipe's closed form with transfers: (m + p - 1)(T_F + T_BW) + 2 (p - 1) c, while c <= T_F.
    if (k.c <= k.tf)
      CHECK(g.iteration_time_s ==
            pipegrid::testing::approx(((k.m + k.p - 1) * (k.tf + k.tbw) + 2 * (k.p - 1) * k.c) * unit)
                .epsilon(1e-9));
  }
}

TEST_CASE("analytic: transfers that share a link go in turn, the last when fair sharing would end both") {
  // closed-forms.md: two flows sharing one link each get B/2 and both finish at a + 2S/B. The
  // evaluator's FIFO channel ends the first at a + S/B and the second at a + 2S/B; opposite
  // directions of a full-duplex link do not share, those of a shared-duplex link do.
  const double S = 1e6, B = 1e9, a = 1e-4;
  for (Duplex duplex : {Duplex::Full, Duplex::Shared}) {
    Cluster c = line_cluster(2, B, a);
    c.links[0].duplex = duplex;
    TaskGraph g;
    g.device_order.resize(2);
    g.static_memory.resize(2);
    for (auto [from, to] : {std::pair{0, 1}, std::pair{0, 1}, std::pair{1, 0}}) {
      Task t;
      t.kind = TaskKind::Transfer;
      t.device = from;
      t.peer = to;
      t.bytes = S;
      g.add(t);
    }
    Timeline t = *evaluate(g, c);
    CHECK(std::min(t.end[0], t.end[1]) == pipegrid::testing::approx(a + S / B));
    CHECK(std::max(t.end[0], t.end[1]) == pipegrid::testing::approx(a + 2 * S / B));
    CHECK(t.end[2] == pipegrid::testing::approx(duplex == Duplex::Full ? a + S / B : a + 3 * S / B));
  }
}

TEST_CASE("static memory follows the optimizer") {
  Experiment e =
      chain_experiment(2, 2, 1e-3, 2e-3, "1f1b", make_switch_cluster(2, "gpu", test_device(), 1e12, 0));
  const double pb = 1 << 20;  // parameter bytes per layer (fp32: pb / 4 parameters)
  struct Case {
    Optimizer o;
    double per_layer;
  };
  for (Case c : {Case{Optimizer::SGD, 2 * pb}, Case{Optimizer::Momentum, 3 * pb},
                 Case{Optimizer::Adam, 4 * pb}, Case{Optimizer::MixedAdam, 16 * pb / 4}}) {
    e.memory.optimizer = c.o;
    Metrics m = analytic(e);
    CHECK(m.devices[0].static_bytes == pipegrid::testing::approx(c.per_layer));
    // Peak = static + stashed activations + the backward's workspace (one layer output, 1 MiB).
    CHECK(m.devices[0].peak_memory_bytes ==
          pipegrid::testing::approx(c.per_layer + m.devices[0].peak_activation_bytes + (1 << 20)));
  }
  e.memory.bytes_per_parameter = 20;
  CHECK(analytic(e).devices[1].static_bytes == pipegrid::testing::approx(20 * pb / 4));
}

TEST_CASE("the optimizer step ends the iteration on every device") {
  Experiment e =
      chain_experiment(4, 8, 1e-3, 2e-3, "1f1b", make_switch_cluster(4, "gpu", test_device(), 1e21, 0));
  e.workload.optimizer_step_s = 5e-3;
  Metrics m = analytic(e);
  // Device 0 finishes last (its final backward ends the flush), then steps.
  CHECK(m.iteration_time_s == pipegrid::testing::approx(11 * 3e-3 + 5e-3).epsilon(1e-9));
  CHECK(m.devices[0].busy_s == pipegrid::testing::approx(8 * 3e-3 + 5e-3).epsilon(1e-9));
}

TEST_CASE("round-robin replicas: r pipelines of m / r whole micro-batches each (closed form)") {
  // p stages of r replicas each, replicas taking whole micro-batches in turn (PipeDream): replica j of
  // every stage runs micro-batches j, j + r, ...: r independent pipelines of m / r micro-batches, each
  // pass at the full micro-batch's time, so (m / r + p - 1)(T_F + T_BW) for GPipe and 1F1B alike. Split
  // replicas instead run every micro-batch at 1 / r of its time: (m + p - 1)(T_F + T_BW) / r.
  const double tf = 1.3e-3, tbw = 2.9e-3;
  for (const char* sched : {"gpipe", "1f1b"})
    for (int p : {1, 2, 3})
      for (int r : {2, 3})
        for (int k : {1, 2, 3}) {
          const int m = k * r;
          Experiment e = chain_experiment(p, m, tf, tbw, sched,
                                          make_switch_cluster(p * r, "gpu", test_device(), 1e21, 0));
          e.strategy.replicas = r;
          e.strategy.partitioner_options.round_robin = true;
          INFO(sched << " p=" << p << " r=" << r << " m=" << m);
          CHECK(close_rel(analytic(e).iteration_time_s, (k + p - 1) * (tf + tbw), 1e-9));
          e.strategy.partitioner_options.round_robin = false;
          CHECK(close_rel(analytic(e).iteration_time_s, (m + p - 1) * (tf + tbw) / r, 1e-9));
        }
}

TEST_CASE("round-robin replicas: PipeDream's 3,1 plan by hand, and a schedule that breaks the turns") {
  // Four layers of F = B = 1 ms; stage 0 (three layers: 3 ms a pass) on three round-robin replicas,
  // stage 1 (one layer) on one device; GPipe, m = 6. By hand (ms): the replicas run F of 0, 1, 2 in
  // [0, 3] and of 3, 4, 5 in [3, 6]; stage 1 runs F k in [3 + k, 4 + k] (k = 0 .. 5), then its six
  // backwards one after another in [9, 15], each 1 ms; a replica's backward of 3 ms starts once stage
  // 1's backward of its micro-batch is done and it is free: the last ends at 18 whatever order stage 1
  // takes them in (descending: 5 at 10 -> 13, then 2 at 13 -> 16; 4 at 11 -> 14, 1 at 14 -> 17; 3 at
  // 12 -> 15, 0 at 15 -> 18).
  ChainSpec spec;
  spec.layers = 4;
  spec.forward_s = 1e-3;
  spec.backward_s = 1e-3;
  spec.activation_bytes = 1024;
  spec.parameter_bytes = 1024;
  const Workload w = make_chain(spec);
  const Cluster c = make_switch_cluster(4, "gpu", test_device(), 1e21, 0);
  Result<Partition> part = make_partition(w, {0, 0, 0, 1}, {{0, 1, 2}, {3}}, 4);
  REQUIRE(part.ok());
  add_sequence_edges(*part);
  for (size_t s = 0; s < part->stage_count(); ++s) part->graph[s].round_robin = true;
  const int m = 6;
  Result<Schedule> sched = (*find_schedule("gpipe"))->build({*part, 4, m, 1, {}, {}});
  REQUIRE(sched.ok());
  const Schedule whole = *sched;
  keep_round_robin_turns(*sched, *part);
  const std::vector<std::string> names = device_names(c);
  REQUIRE(validate_schedule(*sched, *part, m, names).ok());
  CHECK(sched->device_actions[0].size() == 4);  // F and B of micro-batches 0 and 3
  CHECK(sched->device_actions[3].size() == 12);
  LoweringOptions lo;
  lo.micro_batches = m;
  Result<TaskGraph> g = lower(w, c, *part, *sched, lo);
  REQUIRE(g.ok());
  Result<Timeline> t = evaluate(*g, c);
  REQUIRE(t.ok());
  CHECK(close_rel(compute_metrics(c, *g, *t).iteration_time_s, 18e-3, 1e-9));
  // The plug-in's order, unfiltered, gives a replica another's micro-batch: a located error.
  Status bad = validate_schedule(whole, *part, m, names);
  REQUIRE(!bad.ok());
  CHECK(bad.error().message.find("stage 0's 3 replicas take whole micro-batches in turn (round-robin), and "
                                 "micro-batch 1 is replica 1's, not gpu0's (replica 0)") !=
        std::string::npos);
}

TEST_CASE("gradient accumulation: main-grad lengthens every backward, unfused every one after the first") {
  DeviceSpec dev = test_device();
  dev.memory_bandwidth = 1e12;  // memory efficiency 1
  dev.kernel_startup_s = 4e-6;
  const double tf = 1e-3, tbw = 2e-3;
  // A chain layer holds 2^20 fp32 parameter bytes = 262,144 parameters, one tensor: one kernel that
  // reads the accumulator and the new gradient and writes the accumulator, 3 x 4 bytes per
  // parameter: 4 us + 3.145728 us.
  const double acc = 4e-6 + 262144.0 * 12 / 1e12;
  for (int p : {1, 2, 4}) {
    for (int m : {1, 3, 8}) {
      Experiment e = chain_experiment(p, m, tf, tbw, "1f1b", make_switch_cluster(p, "gpu", dev, 1e21, 0));
      INFO("p=" << p << " m=" << m);
      CHECK(close_rel(analytic(e).iteration_time_s, (m + p - 1) * (tf + tbw), 1e-9));  // fused: none
      // Every backward of every stage longer by acc: 1F1B's closed form with T_BW + acc.
      e.memory.grad_accumulation = GradAccumulation::MainGrad;
      CHECK(close_rel(analytic(e).iteration_time_s, (m + p - 1) * (tf + tbw + acc), 1e-9));
    }
  }
  // One device: its m backwards in turn, the first without the add under unfused.
  for (int m : {1, 2, 5}) {
    Experiment e = chain_experiment(1, m, tf, tbw, "1f1b", make_switch_cluster(1, "gpu", dev, 1e21, 0));
    e.memory.grad_accumulation = GradAccumulation::Unfused;
    CHECK(close_rel(analytic(e).iteration_time_s, m * (tf + tbw) + (m - 1) * acc, 1e-9));
  }
  // Round-robin replicas (PipeDream): each of 2 replicas runs its own k micro-batches, its first free.
  for (int k : {1, 3}) {
    Experiment e = chain_experiment(1, 2 * k, tf, tbw, "1f1b", make_switch_cluster(2, "gpu", dev, 1e21, 0));
    e.strategy.replicas = 2;
    e.strategy.partitioner_options.round_robin = true;
    e.memory.grad_accumulation = GradAccumulation::Unfused;
    INFO("round-robin k=" << k);
    CHECK(close_rel(analytic(e).iteration_time_s, k * (tf + tbw) + (k - 1) * acc, 1e-9));
  }
  // A split backward (zero-bubble's B and W) pays it after W: the same total on one device.
  Experiment e = chain_experiment(1, 4, tf, tbw, "zb-h1", make_switch_cluster(1, "gpu", dev, 1e21, 0));
  e.memory.grad_accumulation = GradAccumulation::MainGrad;
  CHECK(close_rel(analytic(e).iteration_time_s, 4 * (tf + tbw + acc), 1e-9));
}
