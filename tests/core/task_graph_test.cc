// TaskGraph's compressed successor rows (packing keeps the order depend() was called in), and the
// numbering lower() gives transfers.
#include "core/task_graph.h"

#include <doctest/doctest.h>

#include <algorithm>

#include "core/experiment.h"
#include "tests/support/experiments.h"

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

namespace {

// Every activation and gradient transfer is numbered right after the compute task that produces it
// (after the other transfers of that task), that task is its predecessor, and no reserved place is
// left empty (a task without a device).
void check_transfers_follow_producers(const pipegrid::Experiment& e) {
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), run.error().message);
  const TaskGraph& g = run->graph;
  size_t transfers = 0;
  for (size_t x = 0; x < g.tasks.size(); ++x) {
    const Task& t = g.tasks[x];
    CHECK(t.device >= 0);
    if (t.transfer != TransferKind::Activation && t.transfer != TransferKind::Gradient) continue;
    ++transfers;
    size_t c = x;
    while (c > 0 && (g.tasks[c - 1].transfer == TransferKind::Activation ||
                     g.tasks[c - 1].transfer == TransferKind::Gradient))
      --c;
    REQUIRE(c > 0);
    const Task& producer = g.tasks[c - 1];
    CHECK(producer.kind == (t.transfer == TransferKind::Activation ? TaskKind::Forward : TaskKind::Backward));
    CHECK(producer.stage == t.stage);
    CHECK(producer.micro_batch == t.micro_batch);
    CHECK(producer.device == t.device);
    const auto next = g.successors(static_cast<int32_t>(c - 1));
    CHECK(std::find(next.begin(), next.end(), static_cast<int32_t>(x)) != next.end());
  }
  CHECK(transfers > 0);
}

}  // namespace

TEST_CASE("lowering: each transfer follows the compute task that produces it") {
  for (const char* schedule : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h2"}) {
    INFO(schedule);
    check_transfers_follow_producers(pipegrid::testing::schedule_experiment(
        schedule, 4, 6, pipegrid::testing::line_cluster(4, 1e10, 1e-6)));
  }
  pipegrid::Experiment replicated = pipegrid::testing::chain_experiment(
      3, 5, 1.3e-3, 2.9e-3, "1f1b", pipegrid::testing::line_cluster(6, 1e10, 1e-6), 3e6);
  replicated.strategy.replicas = 2;
  check_transfers_follow_producers(replicated);
}
