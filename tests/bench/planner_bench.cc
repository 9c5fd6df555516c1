// Planning time of PipeDream's planner (core/partitioners/pipedream.h) on every profile of
// ../shared/reference/pipedream/, one level of 4 and of 8 workers at 1 GB/s with activation
// transfers, and gnmt_large on two-level hierarchies (4 GPUs per server x 8 servers, and 8 x 4).
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/models/pipedream_profile.h"
#include "core/partitioners/pipedream.h"

using namespace pipegrid;
namespace fs = std::filesystem;

namespace {

struct Loaded {
  Workload w;
  std::vector<double> time, act;
};

Loaded load(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  Loaded l{*parse_pipedream_profile(ss.str(), path.filename().string(), {}), {}, {}};
  for (size_t i = 0; i < l.w.layer_count(); ++i) {
    l.time.push_back(l.w.layer(i).measured->forward_s + l.w.layer(i).measured->backward_s);
    l.act.push_back(l.w.layer(i).output_bytes * 128);
  }
  return l;
}

void plan(benchmark::State& state, fs::path path, std::vector<PipeDreamLevel> levels) {
  Loaded l = load(path);
  PipeDreamOptions o;
  o.levels = std::move(levels);
  size_t states = 0;
  bool linear = false;
  for (auto _ : state) {
    Result<PipeDreamPlan> p = plan_pipedream(l.w, l.time, l.act, o);
    if (!p) {
      state.SkipWithError(p.error().message.c_str());
      return;
    }
    states = p->states;
    linear = p->linearized;
    benchmark::DoNotOptimize(p->time_per_stage);
  }
  state.counters["states"] = static_cast<double>(states);
  state.counters["linearised"] = linear ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path dir = fs::path(PIPEGRID_SHARED_DIR) / "reference/pipedream";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".txt") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files)
    for (int n : {4, 8})
      benchmark::RegisterBenchmark((f.stem().string() + "/" + std::to_string(n) + "x1GBps").c_str(), plan, f,
                                   std::vector<PipeDreamLevel>{{n, 1e9}})
          ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("gnmt_large/4gpus_x_8servers", plan, dir / "gnmt_large_graph.txt",
                               std::vector<PipeDreamLevel>{{4, 25e9}, {8, 3e9}})
      ->Unit(benchmark::kMillisecond)
      ->Iterations(2);
  benchmark::RegisterBenchmark("gnmt_large/8gpus_x_4servers", plan, dir / "gnmt_large_graph.txt",
                               std::vector<PipeDreamLevel>{{8, 25e9}, {4, 3e9}})
      ->Unit(benchmark::kMillisecond)
      ->Iterations(2);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
