// Series-parallel decomposition of hand-made graphs, against decompositions worked out by hand.
#include <doctest/doctest.h>

#include "core/sp_tree.h"

using namespace pipegrid;

namespace {

Workload graph(const std::vector<std::string>& names, const std::vector<std::pair<int, int>>& edges) {
  Workload w;
  for (const std::string& n : names) w.add_layer(Layer{.name = n});
  for (auto [a, b] : edges) w.add_edge(a, b);
  return w;
}

std::string decompose(const Workload& w, int* added = nullptr) {
  SpTree t = sp_decompose(w);
  if (added) *added = t.added_dependencies;
  // Every node lists exactly the layers of its children.
  for (const SpNode& n : t.nodes) {
    if (n.kind == SpNode::Kind::Leaf) {
      CHECK(n.layers.size() == 1);
      continue;
    }
    size_t total = 0;
    for (int c : n.children) total += t.nodes[c].layers.size();
    CHECK(total == n.layers.size());
    CHECK(n.children.size() >= 2);
  }
  CHECK(t.nodes[t.root].layers.size() == w.layer_count());
  return t.to_string(w);
}

}  // namespace

TEST_CASE("sp: a chain is one series composition") {
  int added = -1;
  CHECK(decompose(graph({"a", "b", "c"}, {{0, 1}, {1, 2}}), &added) == "S(a, b, c)");
  CHECK(added == 0);
  CHECK(decompose(graph({"a"}, {})) == "a");
}

TEST_CASE("sp: branches between a fork and a join are a parallel composition") {
  int added = -1;
  // in -> {a1 -> a2, b1 -> b2} -> cat -> out
  Workload w = graph({"in", "a1", "a2", "b1", "b2", "cat", "out"},
                     {{0, 1}, {1, 2}, {0, 3}, {3, 4}, {2, 5}, {4, 5}, {5, 6}});
  CHECK(decompose(w, &added) == "S(in, P(S(a1, a2), S(b1, b2)), cat, out)");
  CHECK(added == 0);
}

TEST_CASE("sp: nested compositions and several inputs") {
  // in -> {a, b -> {c, d} -> e} -> f
  Workload nested = graph({"in", "a", "b", "c", "d", "e", "f"},
                          {{0, 1}, {0, 2}, {2, 3}, {2, 4}, {3, 5}, {4, 5}, {1, 6}, {5, 6}});
  CHECK(decompose(nested) == "S(in, P(a, S(b, P(c, d), e)), f)");
  // Two inputs joined: {x1, x2} -> y; and DLRM's shape: dense and sparse branches meet.
  CHECK(decompose(graph({"x1", "x2", "y"}, {{0, 2}, {1, 2}})) == "S(P(x1, x2), y)");
  Workload dlrm = graph({"d1", "d2", "e1", "e2", "inter", "top"}, {{0, 1}, {1, 4}, {2, 4}, {3, 4}, {4, 5}});
  CHECK(decompose(dlrm) == "S(P(S(d1, d2), e1, e2), inter, top)");
}

TEST_CASE("sp: a residual skip adds no concurrency (the block is a chain of layers)") {
  // x -> c1 -> c2 -> add, x -> add
  CHECK(decompose(graph({"x", "c1", "c2", "add"}, {{0, 1}, {1, 2}, {2, 3}, {0, 3}})) == "S(x, c1, c2, add)");
}

TEST_CASE("sp: a non-series-parallel graph gets the fewest dependencies that split it") {
  // The "N": a < c, a < d, b < d. Ordering b before c (one dependency) makes it (a|b);(c|d).
  int added = -1;
  CHECK(decompose(graph({"a", "b", "c", "d"}, {{0, 2}, {0, 3}, {1, 3}}), &added) == "S(P(a, b), P(c, d))");
  CHECK(added == 1);
  // Two independent N's in parallel: each fixed on its own, and the branches stay concurrent.
  Workload two = graph({"a", "b", "c", "d", "p", "q", "r", "s"},
                       {{0, 2}, {0, 3}, {1, 3}, {4, 6}, {4, 7}, {5, 7}});
  CHECK(decompose(two, &added) == "P(S(P(a, b), P(c, d)), S(P(p, q), P(r, s)))");
  CHECK(added == 2);
}
