// The BaPipe-style strategy: its partition step against exhaustive search, memory safety.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>

#include "core/evaluate.h"
#include "core/experiment.h"
#include "core/metrics.h"
#include "core/models/zoo.h"
#include "core/planners/common.h"
#include "core/strategy.h"
#include "core/topologies/generators.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

Layer timed(int i, double t, double params, double stash) {
  Layer l;
  l.name = fmt::format("l{}", i);
  l.forward_flops = t * 1e9;  // per sample
  l.parameters = params;
  l.parameter_bytes = 4 * params;
  l.stash_bytes = stash;
  l.output_bytes = stash;
  return l;
}

// A chain of n layers with random times (per sample, in GFLOP at 1 GFLOP/s), parameters and stash.
struct RandomChain {
  Workload workload;
  std::vector<double> time, params, stash;
};

RandomChain random_chain(std::mt19937& rng, int n) {
  RandomChain c;
  for (int i = 0; i < n; ++i) {
    c.time.push_back(1 + rng() % 50);
    c.params.push_back((1 + rng() % 20) * 1e5);
    c.stash.push_back((1 + rng() % 20) * 1e5);
    c.workload.add_layer(timed(i, c.time[i], c.params[i], c.stash[i]));
    if (i) c.workload.add_edge(i - 1, i);
  }
  return c;
}

// Adds `count` devices of `capacity` bytes with random speeds (1, 2 or 3 GFLOP/s); returns them.
std::vector<double> add_random_devices(std::mt19937& rng, Cluster& c, int count, double capacity) {
  std::vector<double> speed;
  for (int d = 0; d < count; ++d) {
    DeviceSpec spec = test_device(capacity);
    speed.push_back(1e9 * (1 + rng() % 3));
    spec.peak_flops.fill(speed.back());
    c.devices.push_back({fmt::format("d{}", d), spec, ""});
  }
  return speed;
}

}  // namespace

TEST_CASE("bapipe's partition equals exhaustive search (replicas, heterogeneous devices, memory)") {
  std::mt19937 rng(3);
  int constrained = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 7);
    const int p = 1 + static_cast<int>(rng() % std::min(n, 3));
    const int r = 1 + static_cast<int>(rng() % 2);
    const int m = 1 + static_cast<int>(rng() % 6);
    const bool gpipe = rng() % 2;
    const RandomChain chain = random_chain(rng, n);
    const Workload& w = chain.workload;
    const std::vector<double>&t = chain.time, &params = chain.params, &stash = chain.stash;
    Cluster c;
    const double capacity = (2 + rng() % 40) * 1e6;
    const std::vector<double> speed = add_random_devices(rng, c, p * r, capacity);
    // Exhaustive: every cut; stage i on devices [i r, (i + 1) r), each with b / r = 2 / r samples
    // (b = 2: whole samples for r = 1 and 2, which bapipe requires since issue 30).
    const double share = 2.0 / r;
    double best = std::numeric_limits<double>::infinity();
    std::vector<int> cuts{0};
    std::function<void(int)> rec = [&](int stage) {
      if (stage == p) {
        if (cuts.back() != n) return;
        double worst = 0;
        for (int i = 0; i < p; ++i) {
          double slowest = 0, ps = 0, st = 0, largest = 0;
          for (int x = 0; x < r; ++x) {
            double sum = 0;
            for (int k = cuts[i]; k < cuts[i + 1]; ++k) sum += t[k] * 1e9 * share / speed[i * r + x];
            slowest = std::max(slowest, sum);
          }
          for (int k = cuts[i]; k < cuts[i + 1]; ++k) {
            ps += params[k];
            st += stash[k];
            largest = std::max(largest, stash[k]);
          }
          const int in_flight = gpipe ? m : std::min(p - i, m);
          // Adam: 16 bytes per parameter (4 x 4-byte weights); infinite bandwidth: no all-reduce time.
          if (16 * ps + (in_flight * st + largest) * share > capacity) return;
          worst = std::max(worst, slowest);
        }
        best = std::min(best, worst);
        return;
      }
      for (int k = cuts.back() + 1; k <= n - (p - stage - 1); ++k) {
        cuts.push_back(k);
        rec(stage + 1);
        cuts.pop_back();
      }
    };
    rec(0);
    c.switches = {"sw"};
    for (int d = 0; d < p * r; ++d) c.links.push_back({d, p * r, 1e30, 0, Duplex::Full});
    Result<Partition> part =
        partition_bapipe({w, c, p, 2, 1, m, MemoryOptions{}, gpipe ? "gpipe" : "1f1b", r});
    INFO("trial " << trial << " n=" << n << " p=" << p << " r=" << r << " m=" << m);
    if (!std::isfinite(best)) {
      ++constrained;
      CHECK(!part.ok());
      continue;
    }
    REQUIRE(part.ok());
    CHECK(part->plan.predicted_time_per_stage_s == pipegrid::testing::approx(best).epsilon(1e-9));
  }
  CHECK(constrained > 5);
}

TEST_CASE("bapipe never returns a plan over memory, and says so when nothing fits") {
  for (double capacity : {8e6, 40e6, 2e9}) {
    Experiment e = chain_experiment(
        4, 8, 1e-3, 2e-3, "1f1b", make_switch_cluster(4, "gpu", test_device(capacity), 25e9, 1e-6), 8 << 20);
    e.strategy.partitioner = "bapipe";
    e.strategy.mini_batch = 8;
    Result<PreparedRun> run = prepare(e);
    INFO("capacity " << capacity);
    if (capacity < 10e6) {  // each layer alone needs 4 MiB of Adam state and 8 MiB of activations
      REQUIRE(!run.ok());
      CHECK(run.error().message.rfind("bapipe: no plan fits the devices' memory (", 0) == 0);
      continue;
    }
    REQUIRE(run.ok());
    Metrics m = compute_metrics(e.cluster, run->graph, *evaluate(run->graph, e.cluster));
    CHECK(m.feasible());
  }
}

TEST_CASE("bapipe with free replica counts equals exhaustive search over cuts and device counts") {
  // Stages take consecutive devices from the first (devices may be left idle); stage i on c_i
  // devices runs b / c_i samples per replica and adds its ring all-reduce, 2 (c - 1) latencies and
  // 2 (c - 1) / c x parameter bytes over the bandwidth, amortised over the m micro-batches.
  std::mt19937 rng(11);
  int constrained = 0, uneven = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 6);
    const int D = 2 + static_cast<int>(rng() % 5);
    const int p = 1 + static_cast<int>(rng() % std::min({n, D, 3}));
    const int m = 1 + static_cast<int>(rng() % 6);
    const bool gpipe = rng() % 2;
    const double b = 4;
    const RandomChain chain = random_chain(rng, n);
    const Workload& w = chain.workload;
    const std::vector<double>&t = chain.time, &params = chain.params, &stash = chain.stash;
    Cluster c;
    const double capacity = (4 + rng() % 60) * 1e6;
    const double bandwidth = (1 + rng() % 4) * 2e9, latency = (rng() % 3) * 1e-3;
    const std::vector<double> speed = add_random_devices(rng, c, D, capacity);
    c.switches = {"sw"};
    for (int d = 0; d < D; ++d) c.links.push_back({d, D, bandwidth, latency, Duplex::Full});
    // Route between two devices: two links, the bandwidth of one and twice its latency.
    double best = std::numeric_limits<double>::infinity();
    std::vector<int> cuts{0}, counts;
    std::function<void(int, int)> rec = [&](int stage, int used) {
      if (stage == p) {
        if (cuts.back() != n) return;
        double worst = 0;
        for (int i = 0, first = 0; i < p; first += counts[i], ++i) {
          const int r = counts[i];
          const double share = b / r;
          double slowest = 0, ps = 0, st = 0, largest = 0;
          for (int x = 0; x < r; ++x) {
            double sum = 0;
            for (int k = cuts[i]; k < cuts[i + 1]; ++k) sum += t[k] * 1e9 * share / speed[first + x];
            slowest = std::max(slowest, sum);
          }
          for (int k = cuts[i]; k < cuts[i + 1]; ++k) {
            ps += params[k];
            st += stash[k];
            largest = std::max(largest, stash[k]);
          }
          if (r > 1) slowest += (2.0 * (r - 1) * 2 * latency + 2.0 * (r - 1) / r * 4 * ps / bandwidth) / m;
          const int in_flight = gpipe ? m : std::min(p - i, m);
          if (16 * ps + (in_flight * st + largest) * share > capacity) return;
          worst = std::max(worst, slowest);
        }
        best = std::min(best, worst);
        return;
      }
      for (int k = cuts.back() + 1; k <= n - (p - stage - 1); ++k)
        for (int r = 1; used + r <= D - (p - stage - 1); ++r) {
          if (static_cast<int>(b) % r != 0) continue;  // whole samples per replica only (issue 30)
          cuts.push_back(k);
          counts.push_back(r);
          rec(stage + 1, used + r);
          cuts.pop_back();
          counts.pop_back();
        }
    };
    rec(0, 0);
    Result<Partition> part =
        partition_bapipe({w, c, p, b, 1, m, MemoryOptions{}, gpipe ? "gpipe" : "1f1b", kAnyReplicas});
    INFO("trial " << trial << " n=" << n << " D=" << D << " p=" << p << " m=" << m);
    if (!std::isfinite(best)) {
      ++constrained;
      CHECK(!part.ok());
      continue;
    }
    REQUIRE(part.ok());
    CHECK(part->plan.predicted_time_per_stage_s == pipegrid::testing::approx(best).epsilon(1e-9));
    std::vector<size_t> sizes;
    size_t used = 0;
    for (size_t st = 0; st < part->stage_count(); ++st) {
      sizes.push_back(part->stage(st).devices.size());
      for (int d : part->stage(st).devices)
        CHECK(d == static_cast<int>(used++));  // consecutive, from the first
    }
    CHECK(used <= static_cast<size_t>(D));
    if (std::adjacent_find(sizes.begin(), sizes.end(), std::not_equal_to<>()) != sizes.end()) ++uneven;
  }
  CHECK(constrained > 5);
  CHECK(uneven > 5);  // the search does pick different counts per stage
}

TEST_CASE("bapipe names the reason when no plan can be costed, not memory") {
  // A zoo model on devices without compute rates (the test device): every combination fails to
  // cost its layers; the message says so instead of blaming memory.
  Experiment e =
      chain_experiment(4, 8, 1e-3, 2e-3, "1f1b", make_switch_cluster(4, "gpu", test_device(), 25e9, 1e-6));
  e.workload = *build_model(**find_model("vgg16"), {}, Precision::FP32);
  e.strategy.planner = "bapipe";
  Result<PreparedRun> run = prepare(e);
  REQUIRE(!run.ok());
  INFO(run.error().message);
  CHECK(run.error().message.rfind("bapipe: no plan (", 0) == 0);
  CHECK(run.error().message.find("has no fp32 compute rate") != std::string::npos);
  CHECK(run.error().message.find("memory") == std::string::npos);
}

TEST_CASE(
    "bapipe's plan is at least as fast, analytically, as the best-estimate option of every stage count") {
  // The planner ranks its options by pipeline_estimate ((m + p - 1) x max(slowest stage, busiest link
  // per micro-batch); busiest_link_time is tested below), evaluates the best
  // twelve, and also the best option of every other stage count (up to 32 of them; data
  // parallelism, p = 1, always). So without a judge its plan must be at least as fast, by the
  // analytic evaluator, as the best-estimate option of every stage count p. The oracle re-enumerates
  // the options itself (each schedule, micro-batch size, replica count, as the planner does), keeps
  // the best estimate of each p and evaluates it. The case is the one that exposed the estimate's
  // weakness: ResNet-50 on 16 U280-like boards with 4x the DSPs, where pipelines of a few stage
  // counts filled the twelve and ran slower than other stage counts.
  Experiment e = resnet50_on_u280_ring(16, 4 * 9024, 64);
  e.strategy.planner = "bapipe";
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  Result<Timeline> t = evaluate(run->graph, e.cluster);
  REQUIRE(t.ok());
  const double chosen = compute_metrics(e.cluster, run->graph, *t).iteration_time_s;

  std::vector<MicroBatching> mbs;
  for (int b = 1; b <= e.strategy.mini_batch; ++b)
    if (e.strategy.mini_batch % b == 0) mbs.push_back({static_cast<double>(b), e.strategy.mini_batch / b});
  const PlanRequest r{e.workload, e.cluster, e.strategy, e.memory, mbs, nullptr};
  const PartitionStrategy& bapipe = **find_partitioner("bapipe");
  const Router router(e.cluster);
  const int D = static_cast<int>(e.cluster.devices.size());
  const int stage_counts = std::min(D, static_cast<int>(e.workload.layer_count()));
  int evaluated = 0;
  for (int p = 1; p <= stage_counts; ++p) {
    struct Best {
      double estimate = std::numeric_limits<double>::infinity();
      const ScheduleStrategy* schedule = nullptr;
      MicroBatching mb{};
      int k = 0;
    } best;
    for (const char* s : {"gpipe", "1f1b"}) {
      for (MicroBatching mb : mbs) {
        std::vector<int> ks;
        for (int k = 1; p * k <= D; ++k) ks.push_back(k);
        if (p < D) ks.push_back(kAnyReplicas);  // 16 devices: per-stage counts are searched too
        for (int k : ks) {
          Result<Partition> part =
              bapipe.build({e.workload, e.cluster, p, mb.size, 1, mb.count, e.memory, s, k});
          if (!part) continue;
          Result<double> estimate = pipeline_estimate(*part, p, mb, e.cluster, router);
          REQUIRE(estimate.ok());
          if (*estimate < best.estimate) best = {*estimate, *find_schedule(s), mb, k};
        }
      }
    }
    if (best.schedule == nullptr) continue;  // no option of p stages fits memory
    Result<Candidate> c = make_candidate(r, bapipe, *best.schedule, best.mb, p, best.k);
    REQUIRE(c.ok());
    REQUIRE(score(r, *c).ok());
    if (!c->fits) continue;  // the planner prefers any plan that fits
    ++evaluated;
    INFO("p = " << p << ": " << best.schedule->name << ", " << best.mb.count << " x " << best.mb.size
                << ", replicas " << best.k << ", analytic " << c->analytic << " s; chosen " << chosen
                << " s");
    CHECK(chosen <= c->analytic * (1 + 1e-9));
  }
  CHECK(evaluated >= 8);  // most stage counts have a plan that fits: the check is not vacuous
}

TEST_CASE("busiest_link_time: the receiving replica's link carries every slice (full and shared duplex)") {
  // Two layers; layer 0 outputs A bytes per sample. Stage 0 on devices 0, 1, 2 (each holds a third of
  // the micro-batch), stage 1 on device 3; a switch with one link of bandwidth B per device. Per
  // micro-batch of b samples, device 3's link carries the three slices of activations inward (A b in
  // all) and the three of gradients outward (A b); each sender's link a third of both. Full duplex:
  // the busiest direction carries A b, so A b / B. Shared: device 3's link carries 2 A b, so 2 A b / B.
  const double A = 3e6, B = 25e9, b = 4;
  Workload w;
  w.add_layer(timed(0, 1, 1e5, A));
  w.add_layer(timed(1, 1, 1e5, A));
  w.add_edge(0, 1);
  Cluster c = make_switch_cluster(4, "gpu", test_device(), B, 1e-6);
  Partition part = *make_partition(w, {0, 1}, {{0, 1, 2}, {3}}, 4);
  {
    const Router router(c);
    Result<double> t = busiest_link_time(part, b, c, router);
    REQUIRE(t.ok());
    CHECK(*t == pipegrid::testing::approx(A * b / B).epsilon(1e-12));
  }
  for (Link& l : c.links) l.duplex = Duplex::Shared;
  const Router router(c);
  Result<double> t = busiest_link_time(part, b, c, router);
  REQUIRE(t.ok());
  CHECK(*t == pipegrid::testing::approx(2 * A * b / B).epsilon(1e-12));
  // One stage on every device (data parallelism): nothing crosses a link per micro-batch.
  Partition dp = *make_partition(w, {0, 0}, {{0, 1, 2, 3}}, 4);
  CHECK(*busiest_link_time(dp, b, c, router) == 0);
}
