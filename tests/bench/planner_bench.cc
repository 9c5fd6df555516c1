// Planning time of PipeDream's planner (core/partitioners/pipedream.h) on every profile of
// workloads/profiles/pipedream/, one level of 4 and of 8 workers at 1 GB/s with activation
// transfers, and gnmt_large on two-level hierarchies (4 GPUs per server x 8 servers, and 8 x 4);
// and of the graphpipe partitioner (one call: one micro-batch size) on GraphPipe's models on 4 to
// 32 Summit GPUs, at the micro-batch sizes experiments/graphpipe chose; and of the luo planner (one
// call of plan_luo, analytic only) on DAPPLE's largest profile (gnmt-32-pbs-64.txt, 192 layers) and
// others over 16 V100s (two 8-GPU NVSwitch nodes joined by InfiniBand) and 8 and 32 Summit GPUs.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/models/pipedream_profile.h"
#include "core/partitioners/pipedream.h"
#include "core/planner.h"
#include "core/strategy.h"
#include "tools/input/experiment_yaml.h"

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

// graphpipe on `model` over `gpus` Summit GPUs, micro-batches of `b` out of a mini-batch.
void graphpipe(benchmark::State& state, std::string model, int gpus, int b, int mini_batch) {
  const std::string text = "name: bench\nworkload: {model: " + model +
                           ", precision: fp16}\ncluster: {kind: summit, nodes: " + std::to_string(gpus / 4) +
                           "}\nstrategy: {partitioner: graphpipe, schedule: graph-1f1b, micro_batches: "
                           "1}\nmemory: {optimizer: mixed-adam}\n";
  Result<Experiment> e = input::load_experiment_text(text, "bench");
  if (!e) {
    state.SkipWithError(e.error().message.c_str());
    return;
  }
  size_t stages = 0;
  for (auto _ : state) {
    Result<Partition> p = partition_graphpipe({e->workload, e->cluster, gpus, static_cast<double>(b), 1,
                                               mini_batch / b, e->memory, "graph-1f1b", 1});
    if (!p) {
      state.SkipWithError(p.error().message.c_str());
      return;
    }
    stages = p->stage_count();
    benchmark::DoNotOptimize(p->plan.predicted_time_per_stage_s);
  }
  state.counters["stages"] = static_cast<double>(stages);
}

// luo on a DAPPLE profile: one plan_luo call per iteration (no judge: analytic ranking only), alone
// (baselines: false, the default) or also running every other planner (baselines: true).
void luo(benchmark::State& state, fs::path profile, int batch, std::string cluster, int mini_batch,
         bool baselines) {
  const std::string text = "name: bench\nworkload: {profile: " + profile.string() +
                           ", batch: " + std::to_string(batch) + "}\ncluster: " + cluster +
                           "\nstrategy: {planner: luo, global_batch: " + std::to_string(mini_batch) +
                           ", baselines: " + (baselines ? "true" : "false") + "}\n";
  Result<Experiment> e = input::load_experiment_text(text, "bench");
  if (!e) {
    state.SkipWithError(e.error().message.c_str());
    return;
  }
  std::vector<MicroBatching> mbs;
  for (int b = 1; b <= mini_batch; ++b)
    if (mini_batch % b == 0) mbs.push_back({static_cast<double>(b), mini_batch / b});
  const PlanRequest request{e->workload, e->cluster, e->strategy, e->memory, mbs, nullptr};
  size_t stages = 0;
  double search = 0;
  for (auto _ : state) {
    Result<Plan> p = plan_luo(request);
    if (!p) {
      state.SkipWithError(p.error().message.c_str());
      return;
    }
    stages = p->partition.stage_count();
    search = p->planning_seconds;
    benchmark::DoNotOptimize(p->micro_batches);
  }
  state.counters["layers"] = static_cast<double>(e->workload.layer_count());
  state.counters["stages"] = static_cast<double>(stages);
  state.counters["luo_search_s"] = search;
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path dir = fs::path(PIPEGRID_PROFILES_DIR) / "pipedream";
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
  struct GraphPipeCase {
    const char* model;
    int b, mini_batch;
  };
  for (GraphPipeCase c :
       {GraphPipeCase{"mmt", 1, 64}, GraphPipeCase{"dlrm", 256, 1024}, GraphPipeCase{"candle-uno", 64, 1024}})
    for (int gpus : {4, 8, 16, 32})
      benchmark::RegisterBenchmark(
          (std::string("graphpipe/") + c.model + "/" + std::to_string(gpus) + "gpus/mb" + std::to_string(c.b))
              .c_str(),
          graphpipe, c.model, gpus, c.b, c.mini_batch)
          ->Unit(benchmark::kMillisecond);
  const fs::path dapple = fs::path(PIPEGRID_PROFILES_DIR) / "dapple";
  const std::string v100x16 =
      "{kind: dgx, nodes: 2, gpu: v100, nvlink: {bandwidth: 25GBps, latency: 1us}, infiniband: {bandwidth: "
      "12.5GBps, latency: 2us}}";
  struct LuoCase {
    const char* file;
    int batch;
    const char* cluster_name;
    std::string cluster;
    int mini_batch;
  };
  for (const LuoCase& c : {LuoCase{"gnmt-32-pbs-64.txt", 64, "16xV100", v100x16, 256},
                           LuoCase{"bert-48-pbs-2.txt", 2, "16xV100", v100x16, 64},
                           LuoCase{"amoeba-36-pbs-1.txt", 1, "16xV100", v100x16, 32},
                           LuoCase{"gnmt-32-pbs-64.txt", 64, "summit-8x4", "{preset: summit-32}", 256},
                           LuoCase{"vgg-19-pbs-32.txt", 32, "summit-2x4", "{kind: summit, nodes: 2}", 256}})
    for (bool baselines : {false, true})
      benchmark::RegisterBenchmark((std::string("luo/") + c.file + "/" + c.cluster_name + "/mini" +
                                    std::to_string(c.mini_batch) + (baselines ? "/with-baselines" : "/alone"))
                                       .c_str(),
                                   luo, dapple / c.file, c.batch, c.cluster, c.mini_batch, baselines)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(baselines ? 1 : 3);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
