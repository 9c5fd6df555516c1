// The batch in Megatron-LM's vocabulary (docs/experiment-files.md, "Batch"): strategy.global_batch G,
// strategy.micro_batch_size b per replica, strategy.micro_batches m, with G = b d m. The refusals
// (disagreement, a result that is not whole, the older workload.micro_batch_size where d > 1, a
// per-replica size where the planner chooses the replicas) are bad_inputs/batch_*.yaml, exact text.
#include <doctest/doctest.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include "core/experiment.h"
#include "core/models/chain.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"
#include "tools/input/experiment_yaml.h"
#include "tools/output/report.h"

using namespace pipegrid;
using pipegrid::testing::run_command;
using pipegrid::testing::TempDir;

namespace {

// A small GPT on two DGX A100 (16 GPUs): t 2, p 2, d 4 with the megatron partitioner.
const std::string kBase =
    "workload: {model: gpt, layers: 4, hidden: 256, heads: 8, sequence: 128, vocabulary: 1024, precision: "
    "amp}\n"
    "cluster: {preset: dgx-a100-16}\n";
const std::string k3d = "strategy: {partitioner: megatron, tensor_parallel: 2, stages: 2, replicas: 4, ";

Experiment load(const std::string& strategy) {
  Result<Experiment> e = input::load_experiment_text(kBase + strategy, "x.yaml");
  REQUIRE_MESSAGE(e.ok(), e.error().message);
  return *e;
}

}  // namespace

TEST_CASE("batch: any two of global_batch, micro_batch_size (per replica) and micro_batches give the third") {
  struct Case {
    std::string strategy;
    int micro_batches;      // m
    double pipeline_batch;  // b d: the samples of a micro-batch over a stage's replicas
  };
  const Case cases[] = {
      // t 2, p 2, d 4: b 1 and m 8 are G = 32, whichever two are given.
      {k3d + "micro_batch_size: 1, micro_batches: 8}\n", 8, 4},
      {k3d + "global_batch: 32, micro_batches: 8}\n", 8, 4},
      {k3d + "global_batch: 32, micro_batch_size: 1}\n", 8, 4},
      {k3d + "global_batch: 32, micro_batch_size: 1, micro_batches: 8}\n", 8, 4},
      // dp: d is every device (16), so b 2 and G 64 are m = 2.
      {"strategy: {partitioner: dp, micro_batch_size: 2, global_batch: 64}\n", 2, 32},
      // A planner that chooses the replicas: G and m give the pipeline's micro-batch, G / m.
      {"strategy: {planner: luo, global_batch: 32, micro_batches: 8}\n", 8, 4},
  };
  for (const Case& c : cases) {
    INFO(c.strategy);
    const Experiment e = load(c.strategy);
    CHECK(e.strategy.micro_batches == c.micro_batches);
    CHECK(e.micro_batch_size == c.pipeline_batch);
    CHECK(e.strategy.mini_batch == 0);
  }
}

TEST_CASE("batch: global_batch alone explores every micro-batch size, mini_batch is its older name") {
  const Experiment g = load("strategy: {planner: luo, global_batch: 32}\n");
  CHECK(g.strategy.mini_batch == 32);
  CHECK(g.micro_batch_size == 0);
  const Experiment mini = load("strategy: {planner: luo, mini_batch: 32}\n");
  CHECK(mini.strategy.mini_batch == 32);
}

TEST_CASE("batch: global_batch alone under t > 1 refuses a size only where a replica gets part of a sample") {
  // t 2, p 2, d 4: the t devices of a replica share its samples, so a micro-batch of 4 is one sample
  // per replica (whole) and 1 or 2 are not; until 2026-12-05 the sizes were divided by t x d = 8.
  TempDir dir;
  const std::string path = dir.write("g.yaml", kBase + k3d + "global_batch: 32}\n");
  auto r = run_command({PIPEGRID_BINARY, "run", path});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("1: splits samples between 4 replicas; 2: splits samples between 4 replicas; 4: 0.") !=
        std::string::npos);
  CHECK(r.out.find("between 8 replicas") == std::string::npos);
  // With context parallelism the batch line names cp beside t, p and d (t cp p d = the 16 devices).
  const std::string cp = dir.write(
      "cp.yaml", kBase +
                     "strategy: {partitioner: megatron, tensor_parallel: 2, context_parallel: 2, stages: 2, "
                     "replicas: 2, micro_batch_size: 1, micro_batches: 4}\n");
  auto c = run_command({PIPEGRID_BINARY, "run", cp});
  REQUIRE_MESSAGE(c.exit_code == 0, c.err);
  CHECK(c.out.find(
            "global batch 8 = 4 micro-batches x 2 replicas x 1 sample per replica; t = 2, cp = 2, p = 2, "
            "d = 2") != std::string::npos);
}

TEST_CASE("batch: the older workload.micro_batch_size keeps its meaning where d = 1 or replicas are chosen") {
  Result<Experiment> d1 = input::load_experiment_text(
      "workload: {model: gpt, layers: 4, hidden: 256, heads: 8, sequence: 128, vocabulary: 1024, "
      "micro_batch_size: 4}\ncluster: {preset: dgx-a100-16}\nstrategy: {partitioner: uniform, micro_batches: "
      "8}\n",
      "x.yaml");
  REQUIRE(d1.ok());
  CHECK(d1->workload.micro_batch_size == 4);
  CHECK(d1->micro_batch_size == 0);
  Result<Experiment> chosen = input::load_experiment_text(
      "workload: {model: gpt, layers: 4, hidden: 256, heads: 8, sequence: 128, vocabulary: 1024, "
      "micro_batch_size: 4}\ncluster: {preset: dgx-a100-16}\nstrategy: {planner: dapple, global_batch: 32, "
      "micro_batches: 8}\n",
      "x.yaml");
  REQUIRE_MESSAGE(chosen.ok(), chosen.error().message);
  CHECK(chosen->workload.micro_batch_size == 4);
  CHECK(chosen->strategy.micro_batches == 8);
}

TEST_CASE("batch: a Megatron configuration (t 2, p 2, d 4, micro-batch 1, global batch 32) is m = 8") {
  const Experiment megatron = load(k3d + "micro_batch_size: 1, global_batch: 32}\n");
  CHECK(megatron.strategy.micro_batches == 8);
  // The same run in core's terms, by hand: micro-batches of b d = 1 x 4 = 4 samples over a stage's
  // replicas, m = 32 / 4 = 8.
  // (Opted in: the gpt's default micro-batch, 1 sample, over 4 replicas is refused; it is replaced here.)
  Experiment by_hand = load(k3d + "micro_batches: 8, allow_fractional_samples: true}\n");
  by_hand.workload.micro_batch_size = 4;
  const Result<PreparedRun> a = prepare(megatron);
  const Result<PreparedRun> b = prepare(by_hand);
  REQUIRE_MESSAGE(a.ok(), a.error().message);
  REQUIRE_MESSAGE(b.ok(), b.error().message);
  CHECK(a->micro_batches == 8);
  CHECK(a->micro_batch_size == 4);
  REQUIRE(a->graph.tasks.size() == b->graph.tasks.size());
  size_t differing = 0;
  for (size_t t = 0; t < a->graph.tasks.size(); ++t) {
    const Task &x = a->graph.tasks[t], &y = b->graph.tasks[t];
    if (x.kind != y.kind || x.device != y.device || x.peer != y.peer || x.micro_batch != y.micro_batch ||
        x.duration != y.duration || x.bytes != y.bytes)
      ++differing;
  }
  CHECK(differing == 0);
  CHECK(a->graph.samples_per_iteration == 32);
}

TEST_CASE("batch: run and plan state the global batch, the micro-batch per replica, m, t, p and d") {
  TempDir tmp;
  const std::string f = tmp.write("m.yaml", kBase + k3d + "micro_batch_size: 1, global_batch: 32}\n");
  const std::string line =
      "global batch 32 = 8 micro-batches x 4 replicas x 1 sample per replica; t = 2, p = 2, d = 4\n";
  auto run = run_command({PIPEGRID_BINARY, "run", f});
  REQUIRE(run.exit_code == 0);
  CHECK(run.out.find("\n  batch      " + line) != std::string::npos);
  auto plan = run_command({PIPEGRID_BINARY, "plan", f});
  REQUIRE(plan.exit_code == 0);
  CHECK(plan.out.find("\nbatch       " + line) != std::string::npos);
  for (const char* command : {"run", "plan"}) {
    auto json = run_command({PIPEGRID_BINARY, command, f, "--json"});
    REQUIRE(json.exit_code == 0);
    const nlohmann::json batch = nlohmann::json::parse(json.out)["batch"];
    CHECK(batch == nlohmann::json{{"global_batch", 32},
                                  {"micro_batch_size_per_replica", 1},
                                  {"micro_batches", 8},
                                  {"tensor_parallel", 2},
                                  {"pipeline_parallel", 2},
                                  {"data_parallel", 4},
                                  {"replica_mode", "split"}});
  }
}

TEST_CASE("batch: where stages have different replica counts, the micro-batch their replicas split") {
  ChainSpec c;
  c.layers = 2;
  const Workload w = make_chain(c);
  PreparedRun run;
  run.partition = *make_partition(w, {0, 1}, {{0}, {1, 2}}, 3);
  run.micro_batch_size = 6;
  run.micro_batches = 4;
  CHECK(output::batch_note(run) ==
        "global batch 24 = 4 micro-batches x 6 samples, split between each stage's replicas; t = 1, p = 2, "
        "d = 1 to 2 by stage");
  const nlohmann::json j = output::batch_json(run);
  CHECK(j["global_batch"] == 24);
  CHECK(j["micro_batch_size_per_replica"].is_null());
  CHECK(j["data_parallel"].is_null());
  CHECK(j["tensor_parallel"] == 1);
  CHECK(j["pipeline_parallel"] == 2);
}

TEST_CASE("batch: search --sweep writes each candidate's micro-batch per replica, as Megatron does") {
  TempDir tmp;
  const std::string exp = tmp.write(
      "gpt.yaml",
      "workload: {model: gpt, layers: 8, hidden: 1024, heads: 16, sequence: 1024, vocabulary: 51200, "
      "precision: amp}\ncluster: {preset: dgx-a100-16}\nmemory: {optimizer: mixed-adam}\n"
      "strategy: {partitioner: megatron, micro_batches: 1}\n");
  const std::string sweep = (tmp.path / "s.yaml").string();
  auto r = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "32", "--top", "0",
                        "--tensor-parallel", "2", "--pipeline", "2", "--sweep", sweep, "--json"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const nlohmann::json first = nlohmann::json::parse(r.out)["analytic_ranking"][0];
  const YAML::Node zip = YAML::LoadFile(sweep)["zip"];
  REQUIRE(zip["strategy.micro_batch_size"]);
  CHECK(!zip["workload.micro_batch_size"]);
  // The first point of the sweep, as `pipegrid sweep` would set it, is the search's first candidate.
  std::vector<std::string> argv = {PIPEGRID_BINARY, "run", exp, "--json"};
  for (const auto& kv : zip)
    argv.insert(argv.end(), {"--set", kv.first.as<std::string>() + "=" + kv.second[0].as<std::string>()});
  auto run = run_command(argv);
  REQUIRE_MESSAGE(run.exit_code == 0, run.err);
  const nlohmann::json batch = nlohmann::json::parse(run.out)["batch"];
  CHECK(batch["global_batch"] == 32);
  CHECK(batch["micro_batch_size_per_replica"] == first["micro_batch_size"]);
  CHECK(batch["micro_batches"] == first["micro_batches"]);
  CHECK(batch["data_parallel"] == first["d"]);
  CHECK(batch["tensor_parallel"] == 2);
  CHECK(batch["pipeline_parallel"] == 2);
}
