// Series-parallel decomposition of a layer DAG (GraphPipe's view of a multi-branch model).
//
// The layers form a partial order (u < v when v depends on u). A set of layers is
//  - a series composition A;B;... when every layer of A precedes every layer of B, and so on;
//  - a parallel composition A|B|... when its parts have no dependency between them (the weakly
//    connected components of the set);
//  - a leaf when it is one layer.
// This is the two-terminal edge formulation (each layer an edge, a virtual source before the
// inputs and a virtual sink after the outputs) seen from the layers: a series split is a point
// every source-to-sink path crosses; a parallel split is a pair of terminals shared by branches.
//
// A graph that is not series-parallel (it contains an "N": a < c, a < d, b < d, b unordered with
// a and c) is made so by adding dependencies, which only removes concurrency: at a set that is
// neither a series nor a parallel composition, the topological prefix that needs the fewest new
// dependencies to precede the rest (ties: the most balanced) is made to precede it; the number
// of dependencies added is reported. Series-parallel graphs get none and their exact
// decomposition (a topological prefix is the only way to split a series composition).
#pragma once

#include <string>
#include <vector>

#include "core/workload.h"

namespace pipegrid {

struct SpNode {
  enum class Kind { Leaf, Series, Parallel };
  Kind kind = Kind::Leaf;
  std::vector<int> layers;    // every layer below this node, in topological order
  std::vector<int> children;  // node indices, in order (series: dependency order; parallel: by first layer)
};

struct SpTree {
  std::vector<SpNode> nodes;  // nodes[root] is the whole graph
  int root = -1;
  int added_dependencies = 0;  // dependencies added to make the graph series-parallel

  // "S(P(a, b), c)"-style text with layer names, for tests and messages.
  std::string to_string(const Workload& w) const;
};

// Precondition: the workload is acyclic and has at least one layer.
SpTree sp_decompose(const Workload& w);

}  // namespace pipegrid
