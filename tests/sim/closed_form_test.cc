// The SimGrid replay against the closed forms of docs/reference/closed-forms.md.
#include <doctest/doctest.h>

#include "core/experiment.h"
#include "core/metrics.h"
#include "sim/replay.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

Metrics simulate(const Experiment& e) {
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  Result<sim::Replay> r = process::replay_isolated(e.cluster, run->graph);
  if (!r) FAIL(r.error().message);
  return compute_metrics(e.cluster, run->graph, r->timeline);
}

void check_grid(const char* sched) {
  // Communication made negligible: 1000 TB/s, zero latency, 1 KiB activations (1e-12 s each).
  const double tf = 1e-3, tbw = 2e-3, act = 1024;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 3 * p; ++m) {
      Experiment e =
          chain_experiment(p, m, tf, tbw, sched, make_switch_cluster(p, "gpu", test_device(), 1e15, 0), act);
      Metrics mt = simulate(e);
      INFO(sched << " p=" << p << " m=" << m);
      CHECK(close_rel(mt.iteration_time_s, (m + p - 1) * (tf + tbw), 1e-6));
      CHECK(close_rel(mt.bubble_ratio, (p - 1.0) / (m + p - 1.0), 1e-6));
      CHECK(close_rel(mt.throughput_samples_per_s, m / ((m + p - 1) * (tf + tbw)), 1e-6));
      for (int i = 0; i < p; ++i) {
        const int in_flight = std::string(sched) == "gpipe" ? m : std::min(p - i, m);
        CHECK(mt.devices[i].peak_activation_bytes == pipegrid::testing::approx(in_flight * act));
      }
    }
  }
}

}  // namespace

TEST_CASE(
    "simgrid: gpipe matches (m + p - 1)(T_F + T_BW) and (p - 1)/(m + p - 1) for p in 1..8, m in 1..3p") {
  check_grid("gpipe");
}

TEST_CASE("simgrid: 1f1b matches (m + p - 1)(T_F + T_BW) and (p - 1)/(m + p - 1) for p in 1..8, m in 1..3p") {
  check_grid("1f1b");
}

TEST_CASE("simgrid: transfers add the hand-computed terms") {
  // Cases of closed-forms.md whose transfers never overlap on a link (c < T_F), so SimGrid's flow
  // model gives the contention-free times: p = 4, m = 8, T_F = 1, T_BW = 2, c = 0.5: GPipe 36,
  // 1F1B 41; p = 3, m = 6, T_F = T_BW = 1, c = 0.3: 17.2 and 19.0.
  struct Case {
    int p, m;
    double tf, tbw, c, gpipe, ofob;
  };
  for (Case k : {Case{4, 8, 1, 2, 0.5, 36, 41}, Case{3, 6, 1, 1, 0.3, 17.2, 19.0}}) {
    const double unit = 1e-3, bytes = 1 << 20;
    Cluster line = line_cluster(k.p, bytes / (k.c * unit), 0);
    INFO("p=" << k.p << " m=" << k.m << " c=" << k.c);
    CHECK(simulate(chain_experiment(k.p, k.m, k.tf * unit, k.tbw * unit, "gpipe", line, bytes))
              .iteration_time_s == pipegrid::testing::approx(k.gpipe * unit).epsilon(1e-6));
    CHECK(simulate(chain_experiment(k.p, k.m, k.tf * unit, k.tbw * unit, "1f1b", line, bytes))
              .iteration_time_s == pipegrid::testing::approx(k.ofob * unit).epsilon(1e-6));
  }
}

TEST_CASE("simgrid: gpipe on a switch adds 2 (p - 1) c with c = 2 latency + S / bandwidth") {
  // Each transfer crosses two links (device -> switch -> device).
  const double tf = 1e-3, tbw = 2e-3;
  struct Case {
    int p, m;
    double bytes, bw, lat;
  };
  for (Case k :
       {Case{4, 8, 8 << 20, 25e9, 1e-6}, Case{3, 5, 1 << 20, 12.5e9, 5e-6}, Case{8, 16, 4 << 20, 50e9, 0}}) {
    Experiment e = chain_experiment(k.p, k.m, tf, tbw, "gpipe",
                                    make_switch_cluster(k.p, "gpu", test_device(), k.bw, k.lat), k.bytes);
    const double c = 2 * k.lat + k.bytes / k.bw;
    INFO("p=" << k.p << " m=" << k.m);
    CHECK(simulate(e).iteration_time_s ==
          pipegrid::testing::approx((k.m + k.p - 1) * (tf + tbw) + 2 * (k.p - 1) * c).epsilon(1e-6));
  }
}
