// TaskGraph::renumber against its definition (new task i is old task order[i]: tasks, predecessor
// counts, successor lists in order, device orders and memory changes follow), and the analytic
// evaluator's timeline, which must be the same permuted; lower_plan renumbers wide pipelines only.
#include <doctest/doctest.h>

#include "core/evaluate.h"
#include "core/experiment.h"
#include "core/metrics.h"
#include "core/planner.h"
#include "core/validate.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

bool same_task(const Task& a, const Task& b) {
  return a.kind == b.kind && a.transfer == b.transfer && a.stage == b.stage && a.peer_stage == b.peer_stage &&
         a.micro_batch == b.micro_batch && a.device == b.device && a.peer == b.peer &&
         a.duration == b.duration && a.bytes == b.bytes;
}

void check_renumber(const Experiment& e) {
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), run.error().message);
  const TaskGraph& g = run->graph;
  const std::vector<int32_t> order = execution_order(g);
  REQUIRE(order.size() == g.tasks.size());
  std::vector<int32_t> id(order.size());
  for (size_t i = 0; i < order.size(); ++i) id[order[i]] = static_cast<int32_t>(i);
  TaskGraph r = g;
  r.renumber(order);
  REQUIRE(r.tasks.size() == g.tasks.size());
  size_t bad = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto old = order[i];
    bool ok = same_task(r.tasks[i], g.tasks[old]) && r.predecessor_count[i] == g.predecessor_count[old];
    const auto ns = r.successors(static_cast<int32_t>(i));
    const auto os = g.successors(old);
    ok = ok && ns.size() == os.size();
    for (size_t k = 0; ok && k < ns.size(); ++k) ok = ns[k] == id[os[k]];
    bad += !ok;
  }
  CHECK(bad == 0);
  REQUIRE(r.device_order.size() == g.device_order.size());
  for (size_t d = 0; d < g.device_order.size(); ++d) {
    REQUIRE(r.device_order[d].size() == g.device_order[d].size());
    for (size_t k = 0; k < g.device_order[d].size(); ++k)
      CHECK(r.device_order[d][k] == id[g.device_order[d][k]]);
  }
  REQUIRE(r.memory_changes.size() == g.memory_changes.size());
  for (size_t k = 0; k < g.memory_changes.size(); ++k) {
    CHECK(r.memory_changes[k].task == id[g.memory_changes[k].task]);
    CHECK(r.memory_changes[k].bytes == g.memory_changes[k].bytes);
  }
  // The same run, permuted: every start and end, and the metrics, identical.
  Result<Timeline> a = evaluate(g, e.cluster), b = evaluate(r, e.cluster);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  size_t moved = 0;
  for (size_t i = 0; i < order.size(); ++i)
    moved += b->start[i] != a->start[order[i]] || b->end[i] != a->end[order[i]];
  CHECK(moved == 0);
  const Metrics ma = compute_metrics(e.cluster, g, *a), mb = compute_metrics(e.cluster, r, *b);
  CHECK(ma.iteration_time_s == mb.iteration_time_s);
  for (size_t d = 0; d < ma.devices.size(); ++d) {
    CHECK(ma.devices[d].peak_memory_bytes == mb.devices[d].peak_memory_bytes);
    CHECK(ma.devices[d].busy_s == mb.devices[d].busy_s);
  }
  // Not the identity (else the checks above prove nothing).
  size_t fixed = 0;
  for (size_t i = 0; i < order.size(); ++i) fixed += order[i] == static_cast<int32_t>(i);
  CHECK(fixed < order.size());
}

}  // namespace

TEST_CASE(
    "renumber: tasks, dependencies, device orders, memory changes and timelines follow the permutation") {
  for (const char* schedule : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h2"}) {
    INFO(schedule);
    check_renumber(schedule_experiment(schedule, 4, 6, line_cluster(4, 1e10, 1e-6)));
  }
  Experiment replicated = chain_experiment(3, 5, 1.3e-3, 2.9e-3, "1f1b", line_cluster(6, 1e10, 1e-6), 3e6);
  replicated.strategy.replicas = 2;
  check_renumber(replicated);
}

TEST_CASE("renumber: lower_plan renumbers pipelines wider than kRenumberAboveDevices only") {
  for (int p : {static_cast<int>(kRenumberAboveDevices), static_cast<int>(kRenumberAboveDevices) + 4}) {
    Experiment e = chain_experiment(p, 2, 1e-3, 2e-3, "1f1b", line_cluster(p, 1e10, 1e-6));
    Result<PreparedRun> run = prepare(e);
    REQUIRE(run.ok());
    const std::vector<int32_t> order = execution_order(run->graph);
    size_t fixed = 0;
    for (size_t i = 0; i < order.size(); ++i) fixed += order[i] == static_cast<int32_t>(i);
    INFO(p << " devices");
    // Renumbered, a graph's breadth-first order is its own numbering.
    if (p > static_cast<int>(kRenumberAboveDevices))
      CHECK(fixed == order.size());
    else
      CHECK(fixed < order.size());
  }
}

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
