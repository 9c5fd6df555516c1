// How the whole pipeline scales with the number of simulated activities (compute tasks + transfers):
// one iteration is prepare() (plan, validate, lower, deadlock freedom) in this process, then the
// SimGrid replay in a forked child (process::replay_isolated), timed end to end (manual time: the wall
// time of both, fork and result transfer included). Configurations:
//   Chain1F1B/p/m      1F1B over a p-layer chain on a p-GPU switch (1 ms F, 2 ms B, 8 MiB
//                      activations): 2 p m + p compute tasks and 2 (p - 1) m transfers; p = 64..1,024,
//                      m = 4p..8,192 (issue 14)
//   FatTree1024        128 stages x 8 replicas on the fat-tree-1024 preset, 128 micro-batches
//   GraphPipeMMT32     GraphPipe's MMT on 32 Summit GPUs (graphpipe + graph-1f1b, mini-batch 64: the
//                      planner explores every micro-batch size, as experiments/graphpipe does)
//   DGX4096            dgx-a100-4096: 512 stages x 8 replicas (one DGX node per stage), 64 micro-batches
//   Chain1F1BExecs/p/m   the same with ReplayOptions::simgrid_execs (compute tasks as SimGrid Execs)
// Counters: activities, activities/s (end to end), prepare_s, replay_s (the child's simulation loop),
// cpu_s (CPU time of both processes: user + system; the figure to trust on a loaded machine),
// peak_rss_MB (this process or its children, whichever is larger: run one benchmark per process for a
// figure of that configuration alone; tools/scale_series.py does) and bytes/activity.
// tools/scale_series.py runs the series and fits the growth exponent.
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <sys/resource.h>

#include <chrono>

#include "core/experiment.h"
#include "sim/replay.h"
#include "tools/input/experiment_yaml.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;

namespace {

double cpu_seconds(int who) {
  rusage u{};
  getrusage(who, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double peak_rss_bytes() {
  rusage self{}, children{};
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_CHILDREN, &children);
  return 1024.0 * static_cast<double>(std::max(self.ru_maxrss, children.ru_maxrss));
}

void run(benchmark::State& state, const std::string& yaml, bool simgrid_execs = false) {
  Result<Experiment> e = input::load_experiment_text(yaml, "bench.yaml");
  if (!e) {
    state.SkipWithError(e.error().message.c_str());
    return;
  }
  size_t activities = 0;
  double prepare_s = 0, replay_s = 0, cpu_s = 0;
  sim::ReplayOptions options;
  options.simgrid_execs = simgrid_execs;
  for (auto _ : state) {
    const double self0 = cpu_seconds(RUSAGE_SELF), children0 = cpu_seconds(RUSAGE_CHILDREN);
    const auto t0 = std::chrono::steady_clock::now();
    Result<PreparedRun> run = prepare(*e);
    if (!run) {
      state.SkipWithError(run.error().message.c_str());
      return;
    }
    const auto t1 = std::chrono::steady_clock::now();
    Result<sim::Replay> r = process::replay_isolated(e->cluster, run->graph, options);
    if (!r) {
      state.SkipWithError(r.error().message.c_str());
      return;
    }
    const auto t2 = std::chrono::steady_clock::now();
    activities = run->graph.tasks.size();
    prepare_s = std::chrono::duration<double>(t1 - t0).count();
    replay_s = r->wall_seconds;
    cpu_s = cpu_seconds(RUSAGE_SELF) - self0 + cpu_seconds(RUSAGE_CHILDREN) - children0;
    state.SetIterationTime(std::chrono::duration<double>(t2 - t0).count());
  }
  const double n = static_cast<double>(activities);
  state.counters["activities"] = n;
  state.counters["activities/s"] = benchmark::Counter(n, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["prepare_s"] = prepare_s;
  state.counters["replay_s"] = replay_s;
  state.counters["cpu_s"] = cpu_s;
  state.counters["peak_rss_MB"] = peak_rss_bytes() / (1 << 20);
  state.counters["bytes/activity"] = n > 0 ? peak_rss_bytes() / n : 0;
}

std::string chain_yaml(int m, int layers, const std::string& cluster, int replicas) {
  return fmt::format(R"(name: scale
workload: {{kind: chain, layers: {}, forward: 1ms, backward: 2ms, activation: 8MiB, parameters: 64MiB}}
cluster: {}
strategy: {{partitioner: uniform, schedule: 1f1b, micro_batches: {}, replicas: {}}}
)",
                     layers, cluster, m, replicas);
}

// 1F1B over a p-layer chain on a p-GPU switch.
std::string switch_chain(const benchmark::State& state) {
  const int p = static_cast<int>(state.range(0)), m = static_cast<int>(state.range(1));
  return chain_yaml(m, p,
                    fmt::format("{{kind: switch, count: {}, device: {{name: gpu, memory: 80GiB}}, "
                                "bandwidth: 25GBps, latency: 1us}}",
                                p),
                    1);
}

void Chain1F1B(benchmark::State& state) {
  run(state, switch_chain(state));
}

// The same with compute tasks as SimGrid Execs (ReplayOptions::simgrid_execs): the cost of the device clocks
// saved.
void Chain1F1BExecs(benchmark::State& state) {
  run(state, switch_chain(state), true);
}

void FatTree1024(benchmark::State& state) {
  run(state, chain_yaml(128, 128, "{preset: fat-tree-1024}", 8));
}

void DGX4096(benchmark::State& state) {
  run(state, chain_yaml(64, 512, "{preset: dgx-a100-4096}", 8));
}

void GraphPipeMMT32(benchmark::State& state) {
  run(state, R"(name: scale
workload: {model: mmt, precision: fp16}
cluster: {kind: summit, nodes: 8}
strategy: {partitioner: graphpipe, schedule: graph-1f1b, global_batch: 64}
memory: {optimizer: mixed-adam}
)");
}

}  // namespace

// The series of tools/scale_series.py: 65 k to 16.8 M activities.
BENCHMARK(Chain1F1B)
    ->Args({64, 256})
    ->Args({128, 512})
    ->Args({128, 1024})
    ->Args({256, 1024})
    ->Args({128, 4096})
    ->Args({128, 8192})
    ->Args({512, 2048})
    ->Args({1024, 2048})
    ->Args({1024, 4096})
    ->UseManualTime()
    ->Unit(benchmark::kSecond)
    ->Iterations(1);
BENCHMARK(Chain1F1BExecs)
    ->Args({128, 1024})
    ->Args({512, 2048})
    ->UseManualTime()
    ->Unit(benchmark::kSecond)
    ->Iterations(1);
BENCHMARK(FatTree1024)->UseManualTime()->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK(GraphPipeMMT32)->UseManualTime()->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK(DGX4096)->UseManualTime()->Unit(benchmark::kSecond)->Iterations(1);

BENCHMARK_MAIN();
