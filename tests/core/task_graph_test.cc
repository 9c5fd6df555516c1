// TaskGraph's compressed successor rows: packing keeps the order depend() was called in.
#include "core/task_graph.h"

#include <doctest/doctest.h>

using namespace pipegrid;

TEST_CASE(
    "pack_dependencies: rows packed early keep their order, and later dependencies are merged after them") {
  // By hand: four tasks; 0 -> 2, 0 -> 1 packed first; then 0 -> 3 and 1 -> 3 added. Successors of 0
  // must read 2, 1, 3 (the order depend() was called), of 1 read 3, of 2 and 3 nothing.
  TaskGraph g;
  for (int i = 0; i < 4; ++i) g.add(Task{});
  g.depend(0, 2);
  g.depend(0, 1);
  g.pack_dependencies();
  CHECK(g.dependency_count() == 2);
  g.depend(0, 3);
  g.depend(1, 3);
  const auto s0 = g.successors(0);
  REQUIRE(s0.size() == 3);
  CHECK(s0[0] == 2);
  CHECK(s0[1] == 1);
  CHECK(s0[2] == 3);
  REQUIRE(g.successors(1).size() == 1);
  CHECK(g.successors(1)[0] == 3);
  CHECK(g.successors(2).empty());
  CHECK(g.successors(3).empty());
  CHECK(g.dependency_count() == 4);
  CHECK(g.predecessor_count == std::vector<int32_t>{0, 1, 1, 2});
  g.pack_dependencies();  // nothing left to pack: unchanged
  CHECK(g.successors(0).size() == 3);
}
