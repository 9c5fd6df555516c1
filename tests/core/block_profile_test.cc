// What the contiguous planners share: the block profile (core/planners/block_profile.h) against sums,
// maxima and cuts counted layer by layer here, on a small DAG with a skip connection and a branch, at
// one block per layer and coarser (integer and half values: the sums are exact); RouteCache::ring
// against ring_link_cost; contiguous_stages.
#include "core/planners/block_profile.h"

#include <doctest/doctest.h>

#include <algorithm>

#include "core/partitioners/common.h"
#include "core/planners/common.h"
#include "core/topologies/generators.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;

namespace {

// 0 -> 1 -> 2 -> 3 -> 4 -> 5, with 0 -> 3 (skip), 1 -> 4 and 2 -> 5 (branch): layer i has
// parameters 10 (i + 1), parameter bytes 4x that, stash i + 1, output 100 (i + 1) bytes per sample
// except layer 3 (output 50, the largest-output maxima are then not monotone), selective stash
// (i + 1) / 2 for even i only.
Workload dag() {
  Workload w;
  w.input_bytes_per_sample = 7;
  for (int i = 0; i < 6; ++i) {
    Layer l;
    l.name = "l" + std::to_string(i);
    l.parameters = 10.0 * (i + 1);
    l.parameter_bytes = 4 * l.parameters;
    l.stash_bytes = i + 1;
    l.output_bytes = i == 3 ? 50 : 100.0 * (i + 1);
    if (i % 2 == 0) l.selective_stash_bytes = (i + 1) / 2.0;
    w.add_layer(l);
  }
  for (auto [a, b] : {std::pair{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {0, 3}, {1, 4}, {2, 5}})
    w.add_edge(a, b);
  return w;
}

// What crosses the cut before position k of `order`, counted from the edges.
double cut_by_hand(const Workload& w, const std::vector<int>& order, int k) {
  std::vector<int> pos(order.size());
  for (size_t q = 0; q < order.size(); ++q) pos[order[q]] = static_cast<int>(q);
  double bytes = 0;
  for (int q = 0; q < k; ++q) {
    bool crosses = false;
    for (auto [e, end] = boost::out_edges(order[q], w.graph); e != end; ++e)
      crosses |= pos[boost::target(*e, w.graph)] >= k;
    if (crosses) bytes += w.layer(order[q]).output_bytes;
  }
  return bytes;
}

}  // namespace

TEST_CASE("block profile: one block per layer, against layer-by-layer sums, maxima and cuts") {
  const Workload w = dag();
  const std::vector<int> order = topological_order(w);
  const BlockProfile p(w, order);
  const int n = static_cast<int>(order.size());
  REQUIRE(p.blocks() == n);
  for (int j = 0; j <= n; ++j)
    for (int k = j; k <= n; ++k) {
      double params = 0, pbytes = 0, stash = 0, selective = 0, largest = 0;
      for (int q = j; q < k; ++q) {
        const Layer& l = w.layer(order[q]);
        params += l.parameters;
        pbytes += l.parameter_bytes;
        stash += l.stash_bytes;
        selective += l.selective_stash_bytes >= 0 ? l.selective_stash_bytes : l.stash_bytes;
        largest = std::max(largest, l.output_bytes);
      }
      CHECK(p.parameters(j, k) == params);
      CHECK(p.parameter_bytes(j, k) == pbytes);
      CHECK(p.stash(j, k) == stash);
      CHECK(p.selective_stash(j, k) == selective);
      CHECK(p.largest_output(j, k) == largest);
    }
  CHECK(p.cut(0) == 7);  // the model's input
  for (int k = 1; k <= n; ++k) CHECK(p.cut(k) == cut_by_hand(w, order, k));
  // By hand: before layer 3, the outputs of 0 (skip to 3), 1 (to 4) and 2 (to 3 and 5) cross.
  CHECK(p.cut(3) == 100 + 200 + 300);
  CHECK(p.cut(5) == 300 + 500);  // before layer 5: 2 -> 5 and 4 -> 5
  CHECK(p.cut(n) == 0);
}

TEST_CASE("block profile: coarse blocks sum their layers and cut at their starts") {
  const Workload w = dag();
  const std::vector<int> order = topological_order(w);
  const BlockProfile layers(w, order);
  const BlockProfile p(w, order, {0, 2, 5, 6});
  REQUIRE(p.blocks() == 3);
  const std::vector<int> start{0, 2, 5, 6};
  for (int j = 0; j <= 3; ++j)
    for (int k = j; k <= 3; ++k) {
      CHECK(p.parameters(j, k) == layers.parameters(start[j], start[k]));
      CHECK(p.stash(j, k) == layers.stash(start[j], start[k]));
      CHECK(p.largest_output(j, k) == layers.largest_output(start[j], start[k]));
    }
  CHECK(p.largest_output(1) == 500);  // layers 2, 3, 4: 300, 50, 500
  for (int k = 0; k <= 3; ++k) CHECK(p.cut(k) == layers.cut(start[k]));
  CHECK(p.start(1) == 2);
}

TEST_CASE("RouteCache::ring is ring_link_cost over the cached routes") {
  // A ring of 6: the ring 0 -> 3 -> 1 -> 4 -> 0 crosses 3, 2, 3 and 2 links (latency 2 us per link).
  const Cluster c = *make_ring_cluster(6, "gpu", pipegrid::testing::test_device(), {25e9, 2e-6});
  RouteCache cache(c);
  const Router router(c);
  for (const std::vector<int>& ring : {std::vector<int>{0, 3, 1, 4}, {2, 5}, {1, 2, 3, 4, 5, 0}, {4}}) {
    const LinkCost cached = cache.ring(ring);
    const LinkCost direct = *ring_link_cost(router, ring);
    CHECK(cached.latency == direct.latency);
    CHECK(cached.bandwidth == direct.bandwidth);
  }
  CHECK(cache.ring({0, 3, 1, 4}).latency == pipegrid::testing::approx(6e-6));
  CHECK(cache.ring({4}).latency == 0);  // one device: no hop
  CHECK(!cache.error());
}

TEST_CASE("contiguous_stages: ranges of the order on the given devices") {
  const Workload w = dag();
  const std::vector<int> order = topological_order(w);
  Result<Partition> p = contiguous_stages(w, order, {{0, 2}, {2, 5}, {5, 6}}, {{0}, {1, 2}, {3}}, 4);
  REQUIRE(p);
  REQUIRE(p->stage_count() == 3);
  CHECK(p->stage(0).layers == std::vector<int>{0, 1});
  CHECK(p->stage(1).layers == std::vector<int>{2, 3, 4});
  CHECK(p->stage(1).devices == std::vector<int>{1, 2});
  CHECK(p->stage(2).layers == std::vector<int>{5});
  CHECK(p->successors(0) == std::vector<int>{1});
  CHECK(p->successors(1) == std::vector<int>{2});
  CHECK(!contiguous_stages(w, order, {{0, 2}, {2, 5}}, {{0}, {1}}, 4));  // layer 5 in no stage
}
