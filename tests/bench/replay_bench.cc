// Replay speed: simulated tasks per second of wall time, 1F1B on a switch cluster, p stages,
// m = 4p micro-batches. Each replay runs in a forked child (SimGrid allows one simulation per
// process); the child's own timing of the simulation loop is reported (manual time), so fork,
// platform build and result transfer are excluded. Counters:
//   compute_tasks/s  forward + backward + optimizer tasks per second
//   activities/s     compute tasks + transfers (everything SimGrid runs) per second
#include <benchmark/benchmark.h>

#include "core/experiment.h"
#include "core/models/chain.h"
#include "core/topologies/generators.h"
#include "sim/replay.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;

static void BM_Replay1F1B(benchmark::State& state) {
  const int p = static_cast<int>(state.range(0));
  const int m = 4 * p;
  ChainSpec c;
  c.layers = p;
  c.forward_s = 1e-3;
  c.backward_s = 2e-3;
  c.activation_bytes = 8 << 20;
  c.parameter_bytes = 64 << 20;
  DeviceSpec d;
  d.memory_bytes = 80e9;
  Experiment e;
  e.workload = make_chain(c);
  e.cluster = make_switch_cluster(p, "gpu", d, 25e9, 1e-6);
  e.strategy.schedule = "1f1b";
  e.strategy.micro_batches = m;
  Result<PreparedRun> run = prepare(e);
  if (!run) {
    state.SkipWithError(run.error().message.c_str());
    return;
  }
  size_t compute = 0;
  for (const Task& t : run->graph.tasks) compute += t.is_compute();
  const size_t all = run->graph.tasks.size();
  for (auto _ : state) {
    Result<sim::Replay> r = process::replay_isolated(e.cluster, run->graph);
    if (!r) {
      state.SkipWithError(r.error().message.c_str());
      return;
    }
    state.SetIterationTime(r->wall_seconds);
  }
  state.counters["compute_tasks"] = static_cast<double>(compute);
  state.counters["activities"] = static_cast<double>(all);
  state.counters["compute_tasks/s"] = benchmark::Counter(static_cast<double>(compute), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["activities/s"] = benchmark::Counter(static_cast<double>(all), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Replay1F1B)->Arg(8)->Arg(64)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);

BENCHMARK_MAIN();
