// Backend catalogs (tools/input/backends_yaml): the format, the shipped catalogs, located errors.
#include "tools/input/backends_yaml.h"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "core/backends.h"
#include "core/experiment.h"
#include "tests/support/approx.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"
#include "tools/input/experiment_yaml.h"

using namespace pipegrid;
using namespace pipegrid::input;
using pipegrid::testing::approx;

namespace {

std::string error_of(const std::string& yaml) {
  auto c = load_backend_catalog_text(yaml, "b.yaml");
  return c ? "" : c.error().message;
}

}  // namespace

TEST_CASE("a catalog: backends with defaults that patterns refine, and conversions") {
  auto c = load_backend_catalog_text(R"(backends:
  lib:
    device: a100
    efficiency: {conv: 0.5}
    launch: 3us
    patterns:
      - conv2d
      - [conv2d, add, relu]
      - {ops: [class:gemm], efficiency: {gemm: 0.7}, launch: 1us, source: "a paper, table 2"}
      - {ops: attention, measured: {forward: 1ms, backward: 2ms, batch: 8}}
  any:
    device: u280
    patterns: ["*"]
conversions:
  - {from: lib, to: "*", latency: 2us, bandwidth: 1TBps}
)",
                                     "b.yaml");
  REQUIRE(c);
  REQUIRE(c->backends.size() == 2);
  const Backend& lib = c->backends[0];
  CHECK(lib.name == "lib");
  CHECK(lib.device_kind == "a100");
  REQUIRE(lib.patterns.size() == 4);
  CHECK(lib.patterns[0].cost.compute_efficiency[static_cast<int>(KernelClass::Conv)] == approx(0.5));
  CHECK(lib.patterns[0].cost.launch_s == approx(3e-6));
  CHECK(lib.patterns[1].ops.size() == 3);
  CHECK(lib.patterns[1].ops[2].text == "relu");
  CHECK(lib.patterns[2].ops[0].kind == PatternOp::Kind::Class);
  CHECK(lib.patterns[2].ops[0].cls == KernelClass::Gemm);
  CHECK(lib.patterns[2].cost.compute_efficiency[static_cast<int>(KernelClass::Gemm)] == approx(0.7));
  CHECK(lib.patterns[2].cost.compute_efficiency[static_cast<int>(KernelClass::Conv)] ==
        approx(0.5));  // inherited
  CHECK(lib.patterns[2].cost.launch_s == approx(1e-6));
  CHECK(lib.patterns[2].source == "a paper, table 2");
  REQUIRE(lib.patterns[3].cost.measured);
  CHECK(lib.patterns[3].cost.measured->backward_s == approx(2e-3));
  CHECK(lib.patterns[3].cost.measured->batch == approx(8));
  CHECK(c->backends[1].patterns[0].ops[0].kind == PatternOp::Kind::Any);
  // 2 us + 1 MB at 1 TB/s = 3 us from lib to any; nothing listed the other way.
  CHECK(c->conversion_time(0, 1, 1e6) == approx(3e-6));
  CHECK(c->conversion_time(1, 0, 1e6) == 0);
  CHECK(c->conversion_time(0, 0, 1e6) == 0);
}

TEST_CASE("the shipped catalogs parse") {
  for (const char* f : {"a100.yaml", "u280.yaml"}) {
    auto c = load_backend_catalog_file(std::string(PIPEGRID_SOURCE_DIR) + "/topologies/backends/" + f);
    INFO(f);
    REQUIRE(c);
    CHECK(c->backends.size() >= 4);
  }
}

TEST_CASE("catalog errors name file:line:column, the key path, what was expected and what was found") {
  CHECK(
      error_of("backends:\n  x:\n    device: a100\n    patterns: [class:gemmm]\n") ==
      "b.yaml:4:16: backends.x.patterns[0]: expected a kernel class after \"class:\" (gemm, conv, attention, "
      "recurrent, gather, elementwise, norm, grouped-gemm, strided, compiled), got \"gemmm\"");
  CHECK(error_of("backends:\n  x:\n    device: a101\n    patterns: [conv2d]\n")
            .starts_with("b.yaml:3:13: backends.x.device: expected a device of the catalog ("));
  CHECK(
      error_of("backends:\n  x:\n    device: a100\n    efficiency: {conv: 1.5}\n    patterns: [conv2d]\n") ==
      "b.yaml:4:24: backends.x.efficiency.conv: expected a number in (0, 1], got \"1.5\"");
  CHECK(error_of("backends:\n  x:\n    device: a100\n    patterns: []\n") ==
        "b.yaml:4:15: backends.x.patterns: expected a non-empty list of patterns, got a list []");
  CHECK(
      error_of("backends:\n  x:\n    device: a100\n    patterns: [conv2d]\nconversions:\n  - {from: y}\n") ==
      "b.yaml:6:12: conversions[0].from: expected a backend of this catalog or \"*\" (*, x), got \"y\" (did "
      "you mean "
      "\"*\"?)");
  CHECK(error_of("backends:\n  x:\n    device: a100\n    launch: fast\n    patterns: [conv2d]\n")
            .starts_with("b.yaml:4:13: backends.x.launch: expected a time like"));
  CHECK(error_of("backends:\n  x:\n    device: a100\n    patterns: [conv2d]\n    colour: red\n")
            .starts_with("b.yaml:5:5: backends.x.colour: unknown key"));
  // A layer kind no model has matched nothing, and the backend was silently never used (until
  // 2026-12-05); inside a chain too.
  CHECK(error_of("backends:\n  x:\n    device: a100\n    patterns: [lienar]\n")
            .starts_with("b.yaml:4:16: backends.x.patterns[0]: unknown layer kind \"lienar\" (did you mean "
                         "\"linear\"? expected a layer kind of the model format or the zoo: input, linear,"));
  CHECK(error_of("backends:\n  x:\n    device: a100\n    patterns: [[linear, rleu]]\n")
            .starts_with("b.yaml:4:25: backends.x.patterns[0][1]: unknown layer kind \"rleu\" (did you mean "
                         "\"relu\"?"));
  // Kinds only the zoo builds are patterns too.
  CHECK(error_of("backends:\n  x:\n    device: a100\n    patterns: [decoder_block, moe_block, rmsnorm]\n") ==
        "");
}

TEST_CASE("backends and device aliases: a100's catalog on a100-80gb, and `use` of another kind refused") {
  const std::string catalog = std::string(PIPEGRID_SOURCE_DIR) + "/topologies/backends/a100.yaml";
  // a100 is the catalog's alias of a100-80gb: the same device, refused under its canonical name until
  // 2026-12-05.
  auto canonical = pipegrid::testing::run_command(
      {PIPEGRID_BINARY, "place", "resnet50", "--backends", catalog, "--device", "a100-80gb", "--json"});
  auto alias = pipegrid::testing::run_command(
      {PIPEGRID_BINARY, "place", "resnet50", "--backends", catalog, "--device", "a100", "--json"});
  REQUIRE(canonical.exit_code == 0);
  REQUIRE(alias.exit_code == 0);
  CHECK(nlohmann::json::parse(canonical.out)["total_s"] == nlohmann::json::parse(alias.out)["total_s"]);
  // A backend of the U280's in `use` on an A100 cluster was dropped without a word.
  pipegrid::testing::TempDir dir;
  dir.write("mixed.yaml",
            "backends:\n  g: {device: a100, patterns: [\"*\"]}\n  f: {device: u280, patterns: [linear]}\n");
  const std::string e = dir.write("e.yaml", R"(workload: {model: resnet50, precision: amp}
cluster: {kind: switch, count: 2, device: {name: gpu, model: a100}, bandwidth: 300GBps, latency: 1us}
strategy: {micro_batch_size: 8, micro_batches: 4}
backends: {catalog: mixed.yaml, use: [g, f]}
)");
  auto r = pipegrid::testing::run_command({PIPEGRID_BINARY, "run", e});
  CHECK(r.exit_code == 2);
  CHECK(r.err == "pipegrid: " + e +
                     ":4:11: backends: use: backend \"f\" runs on device kind \"u280\", not on the "
                     "cluster's \"a100\"\n");
  auto placed = pipegrid::testing::run_command({PIPEGRID_BINARY, "place", "resnet50", "--backends",
                                                (dir.path / "mixed.yaml").string(), "--use", "g,f"});
  CHECK(placed.exit_code == 2);
  CHECK(placed.err.find("backend \"f\" runs on device kind \"u280\", not \"a100\"") != std::string::npos);
}

namespace {

nlohmann::json plan_json(const std::string& path) {
  auto r = pipegrid::testing::run_command({PIPEGRID_BINARY, "plan", path, "--json"});
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.out);
}

}  // namespace

TEST_CASE("an experiment with backends: planners plan on placed costs, outputs name each layer's backend") {
  pipegrid::testing::TempDir dir;
  const std::string base = R"(workload: {model: resnet50, precision: amp}
cluster: {kind: switch, count: 2, device: {name: gpu, model: a100}, bandwidth: 300GBps, latency: 1us}
strategy: {partitioner: balanced, schedule: 1f1b, stages: 2, micro_batch_size: 8, micro_batches: 4}
)";
  const std::string catalog = std::string(PIPEGRID_SOURCE_DIR) + "/topologies/backends/a100.yaml";
  const nlohmann::json plain = plan_json(dir.write("plain.yaml", base));
  // The `framework` backend has no figures of its own: the device catalog's cost model, so the same
  // plan and times as no backends at all.
  const nlohmann::json fw =
      plan_json(dir.write("fw.yaml", base + "backends: {catalog: " + catalog + ", use: [framework]}\n"));
  CHECK(fw["iteration_time_s"].get<double>() == approx(plain["iteration_time_s"].get<double>()));
  CHECK(fw["stages"][0]["layers"] == plain["stages"][0]["layers"]);
  CHECK(!plain["stages"][0].contains("backends"));  // outputs without placement are unchanged
  for (const auto& s : fw["stages"]) {
    REQUIRE(s["backends"].size() == s["layers"].size());
    for (const auto& b : s["backends"]) CHECK(b == "framework");
  }
  // TVM-like alone: every layer on tvm.
  const nlohmann::json tvm =
      plan_json(dir.write("tvm.yaml", base + "backends: {catalog: " + catalog + ", use: [tvm]}\n"));
  for (const auto& s : tvm["stages"])
    for (const auto& b : s["backends"]) CHECK(b == "tvm");
  // The trace names each stage's backends on its compute tasks.
  auto r = pipegrid::testing::run_command(
      {PIPEGRID_BINARY, "run", (dir.path / "tvm.yaml").string(), "--trace", (dir.path / "t.json").string()});
  REQUIRE(r.exit_code == 0);
  const nlohmann::json trace =
      nlohmann::json::parse(pipegrid::testing::read_file((dir.path / "t.json").string()));
  int named = 0;
  for (const auto& e : trace["traceEvents"])
    if (e.contains("args") && e["args"].contains("backends")) {
      CHECK(e["args"]["backends"].get<std::string>().starts_with("tvm "));
      ++named;
    }
  CHECK(named > 0);
}

TEST_CASE("prepare runs a backend placement the experiment still carries, as the loader does") {
  const std::string base = R"(workload: {model: resnet50, precision: amp}
cluster: {kind: switch, count: 2, device: {name: gpu, model: a100}, bandwidth: 300GBps, latency: 1us}
strategy: {partitioner: balanced, schedule: 1f1b, stages: 2, micro_batch_size: 8, micro_batches: 4}
)";
  const std::string catalog = std::string(PIPEGRID_SOURCE_DIR) + "/topologies/backends/a100.yaml";
  // The loader places up front: its experiment carries no request any more.
  Result<Experiment> loaded =
      load_experiment_text(base + "backends: {catalog: " + catalog + ", use: [tvm]}\n", "x.yaml");
  REQUIRE(loaded);
  CHECK(loaded->backends == nullptr);
  // An experiment built in code with the request: prepare places a copy and says so.
  Result<Experiment> plain = load_experiment_text(base, "p.yaml");
  REQUIRE(plain);
  Result<BackendCatalog> c = load_backend_catalog_file(catalog);
  REQUIRE(c);
  BackendRequest request{*c, {}, "a100.yaml", "here: backends"};
  for (size_t b = 0; b < c->backends.size(); ++b)
    if (c->backends[b].name == "tvm") request.allowed.push_back(static_cast<int>(b));
  REQUIRE(request.allowed.size() == 1);
  Experiment e = *plain;
  e.backends = std::make_shared<const BackendRequest>(request);
  Result<PreparedRun> by_prepare = prepare(e);
  Result<PreparedRun> by_loader = prepare(*loaded);
  REQUIRE(by_prepare);
  REQUIRE(by_loader);
  CHECK(by_loader->placed_workload == nullptr);
  REQUIRE(by_prepare->placed_workload != nullptr);
  for (size_t l = 0; l < by_prepare->placed_workload->layer_count(); ++l)
    CHECK(placed_backend(by_prepare->placed_workload->layer(l)) == "tvm");
  // The same task graph, task by task.
  REQUIRE(by_prepare->graph.tasks.size() == by_loader->graph.tasks.size());
  bool same = true;
  for (size_t t = 0; t < by_loader->graph.tasks.size(); ++t)
    same = same && by_prepare->graph.tasks[t].duration == by_loader->graph.tasks[t].duration &&
           by_prepare->graph.tasks[t].bytes == by_loader->graph.tasks[t].bytes;
  CHECK(same);
  // Its errors begin with where the request was made.
  BackendRequest none = request;
  none.allowed.clear();
  for (size_t b = 0; b < c->backends.size(); ++b)
    if (c->backends[b].name == "cudnn") none.allowed.push_back(static_cast<int>(b));
  e.backends = std::make_shared<const BackendRequest>(none);
  Result<PreparedRun> uncovered = prepare(e);
  REQUIRE(!uncovered);
  CHECK(uncovered.error().message ==
        "here: backends: no allowed backend implements layer \"input\" (kind \"input\") on device "
        "kind \"a100\"");
}
