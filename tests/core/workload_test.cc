#include <doctest/doctest.h>

#include "core/models/chain.h"
#include "core/workload.h"

using namespace pipegrid;

TEST_CASE("the chain workload holds what its spec says, per sample") {
  ChainSpec s;
  s.layers = 3;
  s.forward_s = 1e-3;
  s.backward_s = 2e-3;
  s.activation_bytes = 8 << 20;
  s.parameter_bytes = 64 << 20;
  s.samples_per_micro_batch = 4;
  Workload w = make_chain(s);
  REQUIRE(w.layer_count() == 3);
  CHECK(w.micro_batch_size == 4);
  CHECK(w.layer(1).name == "layer1");
  CHECK(w.layer(1).output_bytes == (8 << 20) / 4.0);
  CHECK(w.layer(1).parameters == (64 << 20) / 4.0);  // fp32
  CHECK(boost::num_edges(w.graph) == 2);
  CHECK(topological_order(w) == std::vector<int>{0, 1, 2});
  CHECK(check_acyclic(w).ok());
}

TEST_CASE("a cycle in the layer graph is named") {
  Workload w;
  for (const char* n : {"a", "b", "c", "d"}) w.add_layer(Layer{.name = n});
  w.add_edge(0, 1);
  w.add_edge(1, 2);
  w.add_edge(2, 3);
  w.add_edge(3, 1);
  Status s = check_acyclic(w);
  REQUIRE(!s.ok());
  CHECK(s.error().message == "the layer graph has a cycle: b -> c -> d -> b");
  Workload self;
  self.add_layer(Layer{.name = "x"});
  self.add_edge(0, 0);
  CHECK(check_acyclic(self).error().message == "the layer graph has a cycle: x -> x");
}

TEST_CASE("topological order breaks ties by index") {
  Workload w;
  for (const char* n : {"in", "b1", "a1", "out"}) w.add_layer(Layer{.name = n});
  w.add_edge(0, 2);
  w.add_edge(0, 1);
  w.add_edge(1, 3);
  w.add_edge(2, 3);
  CHECK(topological_order(w) == std::vector<int>{0, 1, 2, 3});
}
