// Backend placement (core/backends.h) against hand computation and exhaustive enumeration.
#include "core/backends.h"

#include <doctest/doctest.h>

#include <functional>
#include <random>
#include <set>

#include "tests/support/approx.h"

using namespace pipegrid;
using pipegrid::testing::approx;

namespace {

PatternOp op(const std::string& kind) {
  return PatternOp{kind, PatternOp::Kind::LayerKind, KernelClass::Gemm};
}

// A pattern with given forward and backward seconds for one sample.
BackendPattern timed(std::vector<std::string> kinds, double f, double b) {
  BackendPattern p;
  for (const auto& k : kinds) p.ops.push_back(op(k));
  MeasuredCost m;
  m.forward_s = f;
  m.backward_s = b;
  p.cost.measured = m;
  return p;
}

Workload chain(const std::vector<std::string>& kinds) {
  Workload w;
  for (size_t i = 0; i < kinds.size(); ++i) {
    Layer l;
    l.name = "l" + std::to_string(i);
    l.kind = kinds[i];
    l.output_bytes = 1;
    w.add_layer(l);
    if (i > 0) w.add_edge(static_cast<int>(i) - 1, static_cast<int>(i));
  }
  return w;
}

DeviceSpec dev() {
  DeviceSpec d;
  d.kind = "dev";
  return d;
}

// Three layers x -> y -> z, two backends:      x        y        z
//   P                                          1 + 2    4 + 4    1 + 1   (forward + backward, s)
//   Q                                          2 + 2.5  1 + 1    3 + 3
BackendCatalog three_layer_catalog(double latency) {
  BackendCatalog c;
  c.backends.push_back({"P", "dev", "", {timed({"x"}, 1, 2), timed({"y"}, 4, 4), timed({"z"}, 1, 1)}});
  c.backends.push_back({"Q", "dev", "", {timed({"x"}, 2, 2.5), timed({"y"}, 1, 1), timed({"z"}, 3, 3)}});
  c.conversions.push_back({"*", "*", latency, 0, ""});
  return c;
}

std::string backends(const Placement& p, const BackendCatalog& c) {
  std::string s;
  for (int b : p.backend_of) s += c.backends[b].name;
  return s;
}

}  // namespace

TEST_CASE("three layers, two backends, a conversion cost: the hand's placement and time") {
  const Workload w = chain({"x", "y", "z"});
  // Conversion 0.5 s per crossing and pass (1 s per crossed edge). By hand:
  //   PPP 3+8+2 = 13, QQQ 4.5+2+6 = 12.5, PQP 3+2+2 + 2 = 9, QQP 4.5+2+2 + 1 = 9.5,
  //   PQQ 3+2+6 + 1 = 12, PPQ 18, QPP 15.5, QPQ 20.5: PQP, 9 s.
  {
    const BackendCatalog c = three_layer_catalog(0.5);
    auto p = place(w, c, dev());
    REQUIRE(p);
    CHECK(backends(*p, c) == "PQP");
    CHECK(p->total_s() == approx(9));
    CHECK(p->conversion_s == approx(2));
    CHECK(p->exact);
    // The consumer pays the conversion into it, forward and backward (input gradient).
    CHECK(p->layer_times[1].forward == approx(1 + 0.5));
    CHECK(p->layer_times[1].backward_input == approx(1 + 0.5));
    CHECK(p->layer_times[2].forward == approx(1 + 0.5));
  }
  // Conversion 2 s per pass (4 s per crossed edge): PQP 7 + 8 = 15, QQP 8.5 + 4 = 12.5, QQQ 12.5,
  // PPP 13, PQQ 11 + 4 = 15: QQP and QQQ tie at 12.5; a 2.1 s conversion breaks the tie for QQQ.
  {
    const BackendCatalog c = three_layer_catalog(2.1);
    auto p = place(w, c, dev());
    REQUIRE(p);
    CHECK(backends(*p, c) == "QQQ");
    CHECK(p->total_s() == approx(12.5));
    CHECK(p->conversion_s == 0);
  }
}

TEST_CASE("a fused chain covers its layers as one instance") {
  const Workload w = chain({"x", "y", "z"});
  BackendCatalog c = three_layer_catalog(0.5);
  c.backends[0].patterns.push_back(timed({"y", "z"}, 1, 1));  // P fuses y -> z: 2 s for both
  auto p = place(w, c, dev());
  REQUIRE(p);
  // P x + P (y z) = 3 + 2 = 5 without conversions, against PQP's 9.
  CHECK(backends(*p, c) == "PPP");
  CHECK(p->total_s() == approx(5));
  REQUIRE(p->groups.size() == 2);
  CHECK(p->groups[1].layers == std::vector<int>{1, 2});
}

TEST_CASE("a chain does not fuse across a tensor that another layer also reads") {
  Workload w = chain({"x", "y", "z"});
  Layer extra;
  extra.name = "side";
  extra.kind = "z";
  const int s = w.add_layer(extra);
  w.add_edge(1, s);  // y's output also feeds `side`: y -> z cannot be fused
  BackendCatalog c = three_layer_catalog(0.5);
  c.backends[0].patterns.push_back(timed({"y", "z"}, 0, 0));
  auto cands = placement_candidates(w, c, dev(), {});
  REQUIRE(cands);
  for (const BackendCandidate& cd : (*cands)[1]) CHECK(cd.layers.size() == 1);
}

TEST_CASE("a fused chain's later layers lose their launches and streamed bytes (cost model)") {
  // 1 TFLOP/s, 100 GB/s, 10 us per kernel call, no per-layer overhead.
  DeviceSpec d = dev();
  d.peak_flops.fill(1e12);
  d.memory_bandwidth = 1e11;
  d.kernel_startup_s = 1e-5;
  Workload w;
  Layer fc;
  fc.name = "fc";
  fc.kind = "linear";
  fc.forward_flops = fc.backward_input_flops = fc.backward_weight_flops = 1e9;
  Layer act;
  act.name = "act";
  act.kind = "relu";
  act.forward_bytes = 1e6;
  act.backward_bytes = 2e6;
  w.add_layer(fc);
  w.add_layer(act);
  w.add_edge(0, 1);
  BackendCatalog c;
  BackendPattern lin{{op("linear")}, {}, ""}, relu{{op("relu")}, {}, ""},
      both{{op("linear"), op("relu")}, {}, ""};
  c.backends.push_back({"plain", "dev", "", {lin, relu}});
  c.backends.push_back({"fused", "dev", "", {both}});
  // plain: fc 3 x (10 us + 1 ms) = 3.03 ms; relu forward 10 us + 1 MB / 100 GB/s = 20 us, backward
  // 10 us + 20 us = 30 us: 3.08 ms. fused: fc's 3.03 ms only.
  PlacementOptions only_plain;
  only_plain.allowed = {0};
  auto p = place(w, c, d, only_plain);
  REQUIRE(p);
  CHECK(p->total_s() == approx(3.03e-3 + 50e-6));
  auto f = place(w, c, d);
  REQUIRE(f);
  CHECK(f->total_s() == approx(3.03e-3));
  CHECK(backends(*f, c) == "fusedfused");
}

TEST_CASE("a layer no allowed backend implements is an error that names it") {
  const Workload w = chain({"x", "unknown"});
  auto p = place(w, three_layer_catalog(0), dev());
  REQUIRE(!p);
  CHECK(p.error().message ==
        "no allowed backend implements layer \"l1\" (kind \"unknown\") on device kind \"dev\"");
}

TEST_CASE("on random small graphs the search equals exhaustive enumeration") {
  std::mt19937 rng(20221002);
  std::uniform_real_distribution<double> t(0.1, 5.0);
  const std::vector<std::string> kinds = {"x", "y", "z"};
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 6);
    const int nb = 2 + static_cast<int>(rng() % 2);
    Workload w;
    for (int i = 0; i < n; ++i) {
      Layer l;
      l.name = "l" + std::to_string(i);
      l.kind = kinds[rng() % 3];
      l.output_bytes = 1 + rng() % 4;
      w.add_layer(l);
    }
    std::set<std::pair<int, int>> edges;
    for (int j = 1; j < n; ++j) {
      edges.insert({static_cast<int>(rng() % j), j});  // connected, topologically numbered
      if (rng() % 3 == 0) edges.insert({static_cast<int>(rng() % j), j});
    }
    for (auto [a, b] : edges) w.add_edge(a, b);
    BackendCatalog c;
    for (int b = 0; b < nb; ++b) {
      Backend be{std::string(1, static_cast<char>('A' + b)), "dev", "", {}};
      for (const auto& k : kinds)
        if (b == 0 || rng() % 4 != 0) be.patterns.push_back(timed({k}, t(rng), t(rng)));  // A covers all
      for (int f = 0; f < 2; ++f)
        be.patterns.push_back(timed({kinds[rng() % 3], kinds[rng() % 3]}, t(rng), t(rng)));
      if (rng() % 2)
        be.patterns.push_back(timed({kinds[rng() % 3], kinds[rng() % 3], kinds[rng() % 3]}, t(rng), t(rng)));
      c.backends.push_back(be);
    }
    std::vector<std::vector<double>> lat(nb, std::vector<double>(nb, 0));
    for (int a = 0; a < nb; ++a)
      for (int b = 0; b < nb; ++b)
        if (a != b) {
          lat[a][b] = rng() % 2 ? t(rng) : 0.0;
          c.conversions.push_back({c.backends[a].name, c.backends[b].name, lat[a][b], 4.0, ""});
        }

    // The oracle: every cover, built from the lowest-numbered uncovered layer (which must start its
    // group), costed from the pattern table and the conversion table directly.
    std::vector<int> backend_of(n, -1);
    double best = 1e300;
    std::function<void(double)> cover = [&](double acc) {
      int v = 0;
      while (v < n && backend_of[v] >= 0) ++v;
      if (v == n) {
        double total = acc;
        for (auto [a, b] : edges)
          if (backend_of[a] != backend_of[b])
            total += 2 * (lat[backend_of[a]][backend_of[b]] + w.layer(a).output_bytes / 4.0);
        best = std::min(best, total);
        return;
      }
      for (int b = 0; b < nb; ++b) {
        for (const BackendPattern& p : c.backends[b].patterns) {
          std::vector<int> members;
          int cur = v;
          bool ok = true;
          for (size_t i = 0; i < p.ops.size() && ok; ++i) {
            if (i > 0) {
              std::vector<int> outs;
              for (auto [e1, e2] : edges) {
                if (e1 == cur) outs.push_back(e2);
              }
              ok = outs.size() == 1;
              if (!ok) break;
              cur = outs[0];
            }
            ok = ok && backend_of[cur] < 0 && w.layer(cur).kind == p.ops[i].text;
            members.push_back(cur);
          }
          if (!ok) continue;
          for (int m : members) backend_of[m] = b;
          cover(acc + p.cost.measured->forward_s + p.cost.measured->backward_s);
          for (int m : members) backend_of[m] = -1;
        }
      }
    };
    cover(0);
    auto p = place(w, c, dev());
    REQUIRE(p);
    INFO("trial " << trial << ", " << n << " layers, " << nb << " backends");
    CHECK(p->exact);
    CHECK(p->total_s() == approx(best));
  }
}

TEST_CASE("the graph-level refinement follows a whole-placement evaluator (hand computed)") {
  const Workload w = chain({"x", "y", "z"});
  const BackendCatalog c = three_layer_catalog(0.5);
  auto p = place(w, c, dev());
  REQUIRE(p);
  // With the additive objective, nothing changes.
  auto same = refine_placement(w, c, dev(), {}, *p, [](const Placement& q) { return q.total_s(); });
  REQUIRE(same);
  CHECK(backends(*same, c) == "PQP");
  // A penalty of 5 s for using a second backend (not additive over layers). From PQP (9 + 5 = 14):
  // x on Q gives QQP 9.5 + 5, no; y on P gives PPP 13, taken; from PPP no single change helps
  // (QPP 15.5 + 5, PQP 14, PPQ 18 + 5). QQQ (12.5) is better but two changes away.
  auto penalty = [&](const Placement& q) {
    std::set<int> used(q.backend_of.begin(), q.backend_of.end());
    return q.total_s() + 5.0 * (static_cast<double>(used.size()) - 1);
  };
  auto r = refine_placement(w, c, dev(), {}, *p, penalty);
  REQUIRE(r);
  CHECK(backends(*r, c) == "PPP");
  CHECK(penalty(*r) == approx(13));
}

TEST_CASE("apply_placement gives each layer its placed times for the device kind and names the backend") {
  const Workload w = chain({"x", "y", "z"});
  const BackendCatalog c = three_layer_catalog(0.5);
  PlacementOptions o;
  o.batch = 4;
  auto p = place(w, c, dev(), o);
  REQUIRE(p);
  auto placed = apply_placement(w, *p, c, dev(), o);
  REQUIRE(placed);
  // y on Q: 1 s forward per sample x 4 samples + 0.5 s conversion.
  const PassTimes t = *layer_times(placed->layer(1), w.precision, dev(), 4);
  CHECK(t.forward == approx(4.5));
  CHECK(placed->layer(1).description == "backend: Q");
  // Another device kind does not see the placement.
  DeviceSpec other = dev();
  other.kind = "other";
  CHECK(!layer_times(placed->layer(1), w.precision, other, 4));  // no FLOPs to cost it there
}

TEST_CASE("apply_placement makes a fused group one layer, so no stage boundary can fall inside it") {
  // x -> y -> z -> w, and z also reads x (a residual): P fuses y -> z (y's only consumer is z).
  Workload w = chain({"x", "y", "z", "z"});
  w.add_edge(0, 2);
  w.graph[1].stash_bytes = 2;  // y stashes 2 B, or 0.5 B under selective recomputation
  w.graph[1].selective_stash_bytes = 0.5;
  w.graph[2].stash_bytes = 3;  // z has no selective figure of its own: its 3 B either way
  BackendCatalog c = three_layer_catalog(0.5);
  c.backends[0].patterns.push_back(timed({"y", "z"}, 1, 1));  // 1 s forward, 1 s backward per sample
  PlacementOptions o;
  o.batch = 4;
  auto p = place(w, c, dev(), o);
  REQUIRE(p);
  // By hand, per sample: P x 3, P (y z) 2, P w 2 = 7 s; any Q costs more and converts.
  CHECK(backends(*p, c) == "PPPP");
  CHECK(p->total_s() == approx(7 * 4));
  auto placed = apply_placement(w, *p, c, dev(), o);
  REQUIRE(placed);
  REQUIRE(placed->layer_count() == 3);
  const Layer& fused = placed->layer(1);
  CHECK(fused.name == "l1+l2");
  CHECK(fused.kind == "fused");  // y and z differ
  CHECK(fused.description == "fused y -> z; backend: P");
  CHECK(placed_backend(fused) == "P");
  // The instance's 1 + 1 s per sample at 4 samples, wherever place() put them within the group.
  REQUIRE(fused.measured);
  CHECK(fused.measured->forward_s == approx(4));
  CHECK(fused.measured->backward_s == approx(4));
  CHECK(fused.output_bytes == approx(1));
  CHECK(fused.stash_bytes == approx(5));
  CHECK(fused.selective_stash_bytes == approx(3.5));
  // Edges x -> (y z) (twice before: x -> y and x -> z) and (y z) -> w.
  CHECK(boost::num_edges(placed->graph) == 2);
  CHECK(boost::edge(0, 1, placed->graph).second);
  CHECK(boost::edge(1, 2, placed->graph).second);
  CHECK(placed->layer(2).name == "l3");
}

TEST_CASE("a backend runs only on its device kind and that device's aliases") {
  const Workload w = chain({"x", "y", "z"});
  BackendCatalog c = three_layer_catalog(0.5);
  c.backends[1].device_kind = "other";
  PlacementOptions o;
  o.allowed = {0, 1};
  // Until 2026-12-05 an allowed backend of another kind was costed with this device's figures.
  auto p = place(w, c, dev(), o);
  REQUIRE(!p);
  CHECK(p.error().message == "backend \"Q\" runs on device kind \"other\", not \"dev\"");
  // The same device under another catalog name (a100 and a100-80gb): allowed.
  c.backends[1].device_aliases = {"dev"};
  CHECK(place(w, c, dev(), o));
  CHECK(runs_on(c.backends[1], "dev"));
  CHECK(runs_on(c.backends[1], "other"));
  CHECK_FALSE(runs_on(c.backends[1], "third"));
}
