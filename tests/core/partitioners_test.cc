#include <doctest/doctest.h>
#include <fmt/format.h>

#include <functional>
#include <limits>
#include <random>

#include "core/models/chain.h"
#include "core/strategy.h"
#include "core/topologies/generators.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using pipegrid::testing::test_device;

namespace {

std::vector<size_t> stage_sizes(const Partition& p) {
  std::vector<size_t> out;
  for (size_t s = 0; s < p.stage_count(); ++s) out.push_back(p.stage(s).layers.size());
  return out;
}

}  // namespace

TEST_CASE("uniform: equal layer counts, the first stages take the remainder, stage i on device i") {
  ChainSpec s;
  s.layers = 10;
  s.forward_s = 1e-3;
  Workload w = make_chain(s);
  Cluster c = make_switch_cluster(4, "gpu", test_device(), 1e9, 0);
  Partition p = *partition_uniform({w, c, 4, 1});
  CHECK(stage_sizes(p) == std::vector<size_t>{3, 3, 2, 2});
  CHECK(p.stage(2).layers == std::vector<int>{6, 7});
  CHECK(p.stage(2).devices == std::vector<int>{2});
  CHECK(p.is_chain());
  CHECK(p.depth() == 4);
  auto e = boost::edge(1, 2, p.graph);
  REQUIRE(e.second);
  CHECK(p.graph[e.first].bytes_per_sample == w.layer(5).output_bytes);
  CHECK(partition_uniform({w, c, 5, 1}).error().message == "5 stages need 5 devices, the cluster has 4");
}

TEST_CASE("balanced equals exhaustive search on random heterogeneous cases") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 8);
    const int p = 1 + static_cast<int>(rng() % std::min(n, 4));
    Workload w;
    std::vector<double> t(n);
    for (int i = 0; i < n; ++i) {
      t[i] = 1 + static_cast<double>(rng() % 100);
      Layer l;
      l.name = fmt::format("l{}", i);
      l.forward_flops = t[i] * 1e9;  // per sample
      w.add_layer(l);
      if (i) w.add_edge(i - 1, i);
    }
    Cluster c;
    std::vector<double> speed(p);
    for (int d = 0; d < p; ++d) {
      DeviceSpec spec = test_device();
      speed[d] = 1e9 * (1 + static_cast<double>(rng() % 3));
      spec.peak_flops.fill(speed[d]);
      c.devices.push_back({fmt::format("d{}", d), spec, ""});
    }
    // Exhaustive: every way to cut n layers into p non-empty contiguous stages.
    double best = std::numeric_limits<double>::infinity();
    std::vector<int> cuts;
    std::function<void(int, int)> rec = [&](int stage, int from) {
      if (stage == p - 1) {
        double worst = 0;
        int lo = 0;
        for (int s = 0; s < p; ++s) {
          int hi = s + 1 < p ? cuts[s] : n;
          double sum = 0;
          for (int k = lo; k < hi; ++k) sum += t[k] * 1e9 / speed[s];
          worst = std::max(worst, sum);
          lo = hi;
        }
        best = std::min(best, worst);
        return;
      }
      for (int cut = from + 1; cut <= n - (p - stage - 1); ++cut) {
        cuts.push_back(cut);
        rec(stage + 1, cut);
        cuts.pop_back();
      }
    };
    rec(0, 0);
    Partition part = *partition_balanced({w, c, p, 1});
    double worst = 0;
    for (size_t s = 0; s < part.stage_count(); ++s) {
      double sum = 0;
      for (int l : part.stage(s).layers) sum += t[l] * 1e9 / speed[s];
      worst = std::max(worst, sum);
      CHECK(part.stage(s).devices == std::vector<int>{static_cast<int>(s)});
    }
    INFO("trial " << trial << " n=" << n << " p=" << p);
    CHECK(worst == pipegrid::testing::approx(best).epsilon(1e-12));
  }
}

TEST_CASE("make_partition rejects stages numbered against the data flow") {
  ChainSpec s;
  s.layers = 3;
  Workload w = make_chain(s);
  CHECK(make_partition(w, {1, 0, 0}, {{0}, {1}}, 2).error().message ==
        "stage 1 feeds stage 0: stages must be numbered in dependency order");
  CHECK(make_partition(w, {0, 1, 0}, {{0}, {1}}, 2).error().message ==
        "stage 1 feeds stage 0: stages must be numbered in dependency order");
  CHECK(make_partition(w, {0, 0, 0}, {{0}, {1}}, 2).error().message == "stage 1 has no layer");
}
