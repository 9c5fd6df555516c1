// Cluster scale: route computation and SimGrid platform construction for the fat-tree and dgx
// presets of about 1k, 4k and 16k devices, and for generated clusters of 16k devices routed by
// search (`switch`: one switch; `ring`). The pairs routed are those a 1F1B pipeline of 16 stages
// with D/16 data-parallel replicas per stage talks over: replica j of stage s to replica j of
// stages s - 1 and s + 1, and to its ring neighbour inside the stage (about 3 D ordered pairs).
//   BM_Routes    Router construction and every pair's route (no SimGrid)
//   BM_Platform  SimGrid engine, hosts, links and routes (build_platform), timed inside a forked child
// Presets are loaded once per benchmark, outside the timed region.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <map>
#include <set>

#include "core/topologies/generators.h"
#include "sim/platform.h"
#include "tools/input/cluster_yaml.h"
#include "tools/process/process.h"

using namespace pipegrid;

namespace {

const char* const kPresets[] = {"fat-tree-1024", "fat-tree-4096",  "fat-tree-16384", "dgx-a100-1024",
                                "dgx-a100-4096", "dgx-a100-16384", "switch-16384",   "ring-16384"};

const Cluster& preset(int index) {
  static std::map<int, Cluster> loaded;
  auto it = loaded.find(index);
  if (it == loaded.end()) {
    const std::string name = kPresets[index];
    DeviceSpec gpu;
    gpu.memory_bytes = 80e9;
    Cluster c;
    if (name == "switch-16384")
      c = make_switch_cluster(16384, "gpu", gpu, 25e9, 1e-6);
    else if (name == "ring-16384")
      c = *make_ring_cluster(16384, "gpu", gpu, LinkSpec{25e9, 1e-6});
    else
      c = *input::load_cluster(name, std::nullopt);
    it = loaded.emplace(index, std::move(c)).first;
  }
  return it->second;
}

std::vector<std::pair<int, int>> pipeline_pairs(int devices) {
  const int stages = 16, r = devices / stages;
  std::set<std::pair<int, int>> pairs;
  for (int s = 0; s < stages; ++s)
    for (int j = 0; j < r; ++j) {
      const int d = s * r + j;
      if (s + 1 < stages) {
        pairs.insert({d, d + r});
        pairs.insert({d + r, d});
      }
      if (r > 1) pairs.insert({d, s * r + (j + 1) % r});
    }
  return {pairs.begin(), pairs.end()};
}

void BM_Routes(benchmark::State& state) {
  const Cluster& c = preset(static_cast<int>(state.range(0)));
  const auto pairs = pipeline_pairs(static_cast<int>(c.devices.size()));
  for (auto _ : state) {
    Router router(c);
    size_t hops = 0;
    for (const auto& [a, b] : pairs) hops += router.route(a, b)->hops.size();
    benchmark::DoNotOptimize(hops);
  }
  state.SetLabel(kPresets[state.range(0)]);
  state.counters["devices"] = static_cast<double>(c.devices.size());
  state.counters["pairs"] = static_cast<double>(pairs.size());
}

// Seconds build_platform took in a child process (SimGrid allows one engine per process).
double platform_seconds(const Cluster& c, const std::vector<std::pair<int, int>>& pairs) {
  const process::ChildResult child = process::run_child([&](int fd) {
    int argc = 2;
    char arg0[] = "bench", arg1[] = "--log=root.thres:critical";
    char* argv[] = {arg0, arg1, nullptr};
    const auto t0 = std::chrono::steady_clock::now();
    simgrid::s4u::Engine engine(&argc, argv);
    Result<sim::Platform> p = sim::build_platform(c, pairs);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!p) seconds = -1;
    return process::write_all(fd, &seconds, sizeof seconds) ? 0 : 1;
  });
  double seconds = -1;
  if (child.answer.size() == sizeof seconds) std::memcpy(&seconds, child.answer.data(), sizeof seconds);
  return seconds;
}

void BM_Platform(benchmark::State& state) {
  const Cluster& c = preset(static_cast<int>(state.range(0)));
  const auto pairs = pipeline_pairs(static_cast<int>(c.devices.size()));
  for (auto _ : state) {
    const double s = platform_seconds(c, pairs);
    if (s < 0) {
      state.SkipWithError("the platform could not be built");
      return;
    }
    state.SetIterationTime(s);
  }
  state.SetLabel(kPresets[state.range(0)]);
  state.counters["devices"] = static_cast<double>(c.devices.size());
  state.counters["links"] = static_cast<double>(c.links.size());
}

}  // namespace

BENCHMARK(BM_Routes)->DenseRange(0, 7)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Platform)->DenseRange(0, 7)->UseManualTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
