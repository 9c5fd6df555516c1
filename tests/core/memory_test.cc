// The memory model against closed-forms.md's memory rows and hand computation (analytic
// evaluator, no communication).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include "core/device.h"
#include "core/evaluate.h"
#include "core/experiment.h"
#include "core/lower.h"
#include "core/metrics.h"
#include "core/strategy.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

Metrics analytic(const Experiment& e) {
  Result<PreparedRun> run = prepare(e);
  if (!run) FAIL(run.error().message);
  Result<Timeline> t = evaluate(run->graph, e.cluster);
  if (!t) FAIL(t.error().message);
  return compute_metrics(e.cluster, run->graph, *t);
}

// p stages of k chain layers, each layer: forward f, backward b, output A per micro-batch.
Experiment layered(int p, int k, int m, const char* sched, double f, double b, double a) {
  ChainSpec c;
  c.layers = p * k;
  c.forward_s = f;
  c.backward_s = b;
  c.activation_bytes = a;
  c.parameter_bytes = 1 << 20;
  Experiment e;
  e.workload = make_chain(c);
  e.cluster = make_switch_cluster(p, "gpu", test_device(), 1e21, 0);
  e.strategy.schedule = sched;
  e.strategy.micro_batches = m;
  return e;
}

}  // namespace

TEST_CASE(
    "full recomputation: one stage input per in-flight micro-batch plus one full stash during B, +T_F per "
    "B") {
  const int k = 3;
  const double f = 1e-3, b = 2e-3, a = 1 << 20;
  for (const char* sched : {"1f1b", "gpipe"}) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 2 * p; ++m) {
        Experiment e = layered(p, k, m, sched, f, b, a);
        Metrics none = analytic(e);
        e.memory.recompute = Recompute::Full;
        Metrics full = analytic(e);
        INFO(sched << " p=" << p << " m=" << m);
        const double tf = k * f, tbw = k * b;
        // Each backward re-runs the stage's forward first: T_BW becomes T_F + T_BW.
        CHECK(close_rel(full.iteration_time_s, (m + p - 1) * (2 * tf + tbw), 1e-9));
        CHECK(close_rel(full.iteration_time_s - none.iteration_time_s, (m + p - 1) * tf, 1e-9));
        for (int i = 0; i < p; ++i) {
          const int in_flight = std::string(sched) == "gpipe" ? m : std::min(p - i, m);
          // Without recomputation the stage stashes its k layer outputs per micro-batch.
          CHECK(none.devices[i].peak_activation_bytes == pipegrid::testing::approx(in_flight * k * a));
          // With it: the stage input (one layer output, A) per micro-batch, plus k A during a B.
          CHECK(full.devices[i].peak_activation_bytes == pipegrid::testing::approx(in_flight * a + k * a));
        }
      }
    }
  }
}

TEST_CASE("selective recomputation stashes the selective bytes and re-runs its fraction of the forward") {
  // One stage of two layers: stash 10 B/sample each; selective keeps 4 and re-runs half the forward.
  Workload w;
  for (int i = 0; i < 2; ++i) {
    Layer l;
    l.name = fmt::format("t{}", i);
    l.stash_bytes = 10;
    l.output_bytes = 10;
    l.selective_stash_bytes = 4;
    l.selective_recompute_fraction = 0.5;
    l.measured = MeasuredCost{2e-3, 4e-3, 0, 8, ""};  // per micro-batch of 8 samples
    w.add_layer(l);
    if (i) w.add_edge(0, 1);
  }
  Experiment e;
  e.workload = w;
  e.cluster = make_switch_cluster(1, "gpu", test_device(), 1e21, 0);
  e.strategy.micro_batches = 3;
  e.micro_batch_size = 8;
  e.memory.recompute = Recompute::Selective;
  Metrics m = analytic(e);
  // p = 1: F and B of each micro-batch in turn; B pays 0.5 x 4 ms of recomputed forward.
  CHECK(close_rel(m.iteration_time_s, 3 * (4e-3 + 8e-3 + 2e-3), 1e-9));
  // Stash 2 x 4 B x 8 samples per micro-batch, one in flight, plus (10 - 4) x 2 x 8 re-materialised.
  CHECK(m.devices[0].peak_activation_bytes == pipegrid::testing::approx(2 * 4 * 8 + 6 * 2 * 8));
}

TEST_CASE("the backward's workspace (largest layer output) adds to the peak during B") {
  Experiment e = layered(2, 2, 4, "1f1b", 1e-3, 2e-3, 1 << 20);
  Metrics m = analytic(e);
  for (int i = 0; i < 2; ++i)
    CHECK(m.devices[i].peak_memory_bytes ==
          pipegrid::testing::approx(m.devices[i].static_bytes + m.devices[i].peak_activation_bytes +
                                    (1 << 20)));
}

TEST_CASE("ZeRO-1 shards the optimizer state of a replicated stage across its replicas") {
  ChainSpec c;
  c.layers = 2;
  c.forward_s = 1e-3;
  c.backward_s = 2e-3;
  c.parameter_bytes = 64 << 20;
  Workload w = make_chain(c);
  Cluster cl = make_switch_cluster(4, "gpu", test_device(), 1e12, 0);
  // Stage 0 on gpu0; stage 1 replicated on gpu1..gpu3.
  Partition part = *make_partition(w, {0, 1}, {{0}, {1, 2, 3}}, 4);
  Schedule s = *schedule_1f1b({part, 4, 2});
  LoweringOptions o;
  o.micro_batches = 2;
  for (bool zero : {false, true}) {
    o.memory.zero1 = zero;
    TaskGraph g = *lower(w, cl, part, s, o);
    const double pb = 64 << 20;
    const auto opt = static_cast<int>(MemoryCategory::OptimizerState);
    CHECK(g.static_memory[0][opt] == pipegrid::testing::approx(2 * pb));  // Adam: m and v; not replicated
    for (int d = 1; d < 4; ++d) {
      CHECK(g.static_memory[d][opt] == pipegrid::testing::approx(zero ? 2 * pb / 3 : 2 * pb));
      CHECK(g.static_memory[d][static_cast<int>(MemoryCategory::Weights)] == pipegrid::testing::approx(pb));
    }
  }
}

// Megatron-Core's published bytes per parameter of its distributed optimizer
// (docs/source/api-guide/dist_optimizer.md, core_v0.15.0): bf16 parameters with fp32 gradients take
// 18 bytes unsharded and 6 + 12/d sharded over d replicas; the gradient buffer follows the reduce's
// precision (gradient_reduce: fp32, Megatron's grad_reduce_in_fp32). DeepSeek-V3's AdamW moments in
// bf16 with fp32 master weights and fp32 gradients (arXiv 2412.19437, section 3.3.3): 2 + 4 + 4 + 2 x 2.
// Transformer Engine's FusedAdam with store_param_remainders (optimizers/fused_adam.py, v2.9) keeps the
// fp32 master weights as the 16 bits the bf16 weights lack.
TEST_CASE(
    "mixed-precision Adam's bytes per parameter: Megatron's distributed-optimizer table, bf16 moments") {
  MemoryOptions o;
  o.optimizer = Optimizer::MixedAdam;
  const double n = 1e9;
  const auto per_parameter = [&](double d) {
    MemoryBytes m = static_memory(n, 2 * n, o);
    m[static_cast<int>(MemoryCategory::OptimizerState)] /= d;
    return total(m) / n;
  };
  CHECK(per_parameter(1) == pipegrid::testing::approx(16));  // bf16 weights and gradients
  o.gradient_bytes = 4;
  for (double d : {1.0, 2.0, 8.0, 128.0}) CHECK(per_parameter(d) == pipegrid::testing::approx(6 + 12 / d));
  CHECK(per_parameter(1) == pipegrid::testing::approx(18));
  o.moment_bytes = 2;
  CHECK(per_parameter(1) == pipegrid::testing::approx(2 + 4 + 4 + 2 * 2));
  CHECK(per_parameter(64) == pipegrid::testing::approx(6 + 8.0 / 64));
  // Transformer Engine's store_param_remainders: the master weights' 16 low bits, 2 bytes not 4.
  o.moment_bytes = 0;
  o.master_bytes = 2;
  CHECK(per_parameter(8) == pipegrid::testing::approx(6 + 10.0 / 8));
  o.master_bytes = 0;
  // A bf16 reduction of fp32 gradients keeps their fp32 buffer: never narrower than the weights.
  MemoryOptions f;
  f.optimizer = Optimizer::Adam;
  f.gradient_bytes = 2;
  const MemoryBytes fp32 = static_memory(n, 4 * n, f);
  CHECK(fp32[static_cast<int>(MemoryCategory::Gradients)] == pipegrid::testing::approx(4 * n));
  CHECK(total(fp32) == pipegrid::testing::approx(16 * n));
  f.moment_bytes = 2;  // fp32 weights, bf16 moments
  CHECK(total(static_memory(n, 4 * n, f)) == pipegrid::testing::approx(12 * n));
  // The fused step reads the gradient and reads and writes each moment at its own precision:
  // 2 + 2 x 4 + 2 x 2 x 4 + 2 = 28 bytes, then 4 + 8 + 2 x 2 x 2 + 2 = 22.
  MemoryOptions step;
  step.optimizer = Optimizer::MixedAdam;
  CHECK(optimizer_step_bytes_per_parameter(step, Precision::AMP_BF16) == pipegrid::testing::approx(28));
  step.gradient_bytes = 4;
  step.moment_bytes = 2;
  CHECK(optimizer_step_bytes_per_parameter(step, Precision::AMP_BF16) == pipegrid::testing::approx(22));
  step.master_bytes = 2;  // 4 + 2 x 2 + 2 x 2 x 2 + 2
  CHECK(optimizer_step_bytes_per_parameter(step, Precision::AMP_BF16) == pipegrid::testing::approx(18));
}

TEST_CASE("a run whose peak exceeds a device's memory is reported infeasible, naming the device") {
  Experiment e = layered(2, 2, 8, "gpipe", 1e-3, 2e-3, 64 << 20);
  e.cluster.devices[1].spec.memory_bytes = 256 << 20;  // static 2 x 4 MiB x 4 + 8 x 128 MiB of stash
  Metrics m = analytic(e);
  CHECK(!m.feasible());
  REQUIRE(m.over_capacity == std::vector<int>{1});
  CHECK(m.devices[1].peak_memory_bytes > m.devices[1].capacity_bytes);
  CHECK(m.devices[0].peak_memory_bytes <= m.devices[0].capacity_bytes);
}
