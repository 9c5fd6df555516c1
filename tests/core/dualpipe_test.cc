// DualPipe and DualPipeV against DeepSeek-V3's Table 2 (arXiv 2412.19437) and the DualPipe README:
// bubble (PP/2 - 1)(F&B + B - 3W), 2x parameters per device, PP + 1 micro-batches of activations.
// Replayed by the analytic evaluator on a chain with negligible communication (its timeline is exact
// there: no link is shared).
#include <doctest/doctest.h>

#include <iomanip>

#include "core/evaluate.h"
#include "core/experiment.h"
#include "core/metrics.h"
#include "core/validate.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

struct Replayed {
  double iteration = 0;
  Metrics metrics;
  PreparedRun run;
};

// A chain of `layers` layers (F, B the whole backward, W its weight part, per layer) on `ranks` devices.
Replayed replay(const std::string& schedule, int ranks, int layers, int m, double f, double b, double w,
                int chunks = 1) {
  Experiment e = schedule_experiment(
      schedule, ranks, m, make_switch_cluster(ranks, "gpu", test_device(), 1e15, 0), chunks,
      f * layers / ranks / chunks, (b - w) * layers / ranks / chunks, w * layers / ranks / chunks, 1024);
  e.strategy.stages = ranks;
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), run.error().message);
  Result<Timeline> t = evaluate(run->graph, e.cluster);
  REQUIRE(t.ok());
  return {t->makespan(), compute_metrics(e.cluster, run->graph, *t), std::move(*run)};
}

}  // namespace

TEST_CASE(
    "DualPipe: iteration = M (F + B) + (PP/2 - 1)(F&B + B - 3W), F&B = F + B, on (p, m) = (4, 8), (4, 12), "
    "(8, 16), (8, 20)") {
  // Per stage F = B (the full backward) = 2 ms, W = 1 ms: a regime in which the table's formula is
  // exact (elsewhere the replay differs from it either way: docs/moe.md). Each rank runs both
  // pipelines' stage: M forwards and M backwards of one stage's work.
  const double F = 2e-3, B = 2e-3, W = 1e-3;
  for (auto [p, m] : {std::pair{4, 8}, {4, 12}, {8, 16}, {8, 20}}) {
    Replayed r = replay("dualpipe", p, p, m, F, B, W);
    const double bubble = (p / 2.0 - 1) * ((F + B) + B - 3 * W);
    // Then the two copies of each stage sum their gradients (1 MiB, a ring of two at 1e15 B/s): both
    // of a rank's stages after its last backward (no dp_overlap: Megatron's finalize_model_grads after
    // the schedule), the two rings sharing the rank's link.
    const double mirrors = 2.0 * (1 << 20) / 1e15;
    INFO("p=" << p << " m=" << m << " replayed " << std::setprecision(15) << r.iteration);
    CHECK(close_rel(r.iteration, m * (F + B) + bubble + mirrors, 1e-9));
  }
}

TEST_CASE("DualPipeV: the same formula with PP = 2N stages on N ranks") {
  const double F = 2e-3, B = 2e-3, W = 1e-3;  // per stage (a chunk: half a rank's layers)
  for (auto [n, m] : {std::pair{4, 8}, {4, 12}, {8, 16}}) {
    INFO("n=" << n << " m=" << m);
    Replayed r = replay("dualpipev", n, 2 * n, m, 2 * F, 2 * B, 2 * W, 2);
    const double bubble = (2 * n / 2.0 - 1) * ((F + B) + B - 3 * W);
    CHECK(close_rel(r.iteration, 2 * m * (F + B) + bubble, 1e-9));
  }
}

TEST_CASE("DualPipe: 2x parameters per device against 1F1B, PP + 1 micro-batches of activations at most") {
  for (int p : {4, 8}) {
    INFO("p=" << p);
    Replayed dual = replay("dualpipe", p, p, 2 * p, 1e-3, 2e-3, 1e-3);
    Replayed one = replay("1f1b", p, p, 2 * p, 1e-3, 2e-3, 1e-3);
    const auto weights = static_cast<int>(MemoryCategory::Weights);
    for (size_t d = 0; d < static_cast<size_t>(p); ++d)
      CHECK(dual.run.graph.static_memory[d][weights] == 2 * one.run.graph.static_memory[d][weights]);
    // The chain's stage keeps 1 KiB per micro-batch: the busiest device holds PP + 1 of them.
    double peak = 0;
    for (const DeviceMetrics& m : dual.metrics.devices) peak = std::max(peak, m.peak_activation_bytes);
    CHECK(peak == (p + 1) * 1024.0);
  }
}

TEST_CASE("DualPipe runs two pipelines on half the micro-batches each, the validator holds them to it") {
  Replayed r = replay("dualpipe", 4, 4, 8, 1e-3, 2e-3, 1e-3);
  const Partition& part = r.run.partition;
  REQUIRE(part.stage_count() == 8);
  CHECK(part.stage(0).route == 1);
  CHECK(part.stage(4).route == 2);
  CHECK(part.stage(4).layers == part.stage(0).layers);
  CHECK(part.stage(4).devices == part.stage(3).devices);  // stage 0 of the up pipeline on the last rank
  Schedule bad = r.run.schedule;
  for (Action& a : bad.device_actions[0])
    if (a.stage == 0 && a.micro_batch == 0) a.micro_batch = 4;
  Status s =
      validate_schedule(bad, part, 8, device_names(make_switch_cluster(4, "gpu", test_device(), 1, 0)));
  REQUIRE(!s.ok());
  CHECK(
      s.error().message.find("stage 0 runs the first half of the 8 micro-batches (DualPipe's two pipelines), "
                             "not micro-batch 4") != std::string::npos);
}

TEST_CASE("DualPipe's constraints are located errors") {
  Experiment odd =
      schedule_experiment("dualpipe", 3, 6, make_switch_cluster(3, "gpu", test_device(), 1e15, 0));
  odd.strategy.stages = 3;
  CHECK(prepare(odd).error().message ==
        "dualpipe needs an even rank count and an even number of micro-batches of at least 2N (DeepSeek's "
        "reference asserts it); got 3 ranks and 6 micro-batches");
  Experiment few =
      schedule_experiment("dualpipev", 4, 6, make_switch_cluster(4, "gpu", test_device(), 1e15, 0));
  few.strategy.stages = 4;
  CHECK(prepare(few).error().message == "dualpipev needs at least 2N = 8 micro-batches on 4 ranks, got 6");
}
