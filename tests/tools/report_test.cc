// The readable plan: exact layer lists, stage edges, plurals, and the fractional-sample warning.
#include "tools/output/report.h"

#include <doctest/doctest.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <set>

#include "core/models/chain.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

using pipegrid::testing::run_command;
using pipegrid::testing::TempDir;

TEST_CASE("layer_list names every layer of a stage: ranges only over consecutive layers") {
  pipegrid::ChainSpec c;
  c.layers = 40;
  const pipegrid::Workload w = pipegrid::make_chain(c);
  using pipegrid::output::layer_list;
  CHECK(layer_list(w, {9, 10, 11, 12, 20, 31, 32, 33}) ==
        "layer9..layer12, layer20, layer31..layer33 (8 layers)");
  CHECK(layer_list(w, {3, 4}) == "layer3, layer4 (2 layers)");
  CHECK(layer_list(w, {33, 31, 32}) == "layer31..layer33 (3 layers)");
  CHECK(layer_list(w, {7}) == "layer7");
  CHECK(pipegrid::output::plural(1, "stage", "stages") == "1 stage");
  CHECK(pipegrid::output::plural(1.5, "sample", "samples") == "1.5 samples");
}

TEST_CASE("the summary lists a branch stage's layers exactly and the stage graph's edges") {
  TempDir tmp;
  const std::string e = tmp.write("g.yaml", R"(
workload:
  name: two-branches
  layers:
    - {name: x, kind: input, shape: [1024]}
    - {name: a1, kind: linear, in_features: 1024, out_features: 1024, inputs: [x]}
    - {name: b1, kind: linear, in_features: 1024, out_features: 1024, inputs: [x]}
    - {name: a2, kind: linear, in_features: 1024, out_features: 1024, inputs: [a1]}
    - {name: b2, kind: linear, in_features: 1024, out_features: 1024, inputs: [b1]}
    - {name: a3, kind: linear, in_features: 1024, out_features: 1024, inputs: [a2]}
    - {name: b3, kind: linear, in_features: 1024, out_features: 1024, inputs: [b2]}
    - {name: join, kind: add, inputs: [a3, b3]}
    - {name: out, kind: linear, in_features: 1024, out_features: 1024}
cluster: {kind: switch, count: 4, device: {name: gpu, model: v100}, bandwidth: 100GBps, latency: 1us}
strategy: {partitioner: graphpipe, schedule: graph-1f1b, global_batch: 32, micro_batches: 8}
)");
  auto r = run_command({PIPEGRID_BINARY, "run", e});
  REQUIRE(r.exit_code == 0);
  // Layers are numbered in the file's order, so a1..a3 would include b1 and b2.
  CHECK(r.out.find("a1, a2, a3 (3 layers)") != std::string::npos);
  CHECK(r.out.find("b1, b2, b3 (3 layers)") != std::string::npos);
  CHECK(r.out.find("\nstage graph      4 stages, depth 3\nstage edges      0->1, 0->2, 1->3, 2->3\n") !=
        std::string::npos);
  auto plan = run_command({PIPEGRID_BINARY, "plan", e});
  REQUIRE(plan.exit_code == 0);
  CHECK(plan.out.find("\nstage edges 0->1, 0->2, 1->3, 2->3\n") != std::string::npos);
  CHECK(plan.out.find("| a1, a2, a3 (3 layers)") != std::string::npos);
}

TEST_CASE("the summary says 1 layer, 1 device, 1 micro-batch, 1 sample, 1 stage") {
  TempDir tmp;
  const std::string e = tmp.write("one.yaml", R"(
workload: {kind: chain, layers: 1, forward: 1ms, backward: 2ms, activation: 1KiB, parameters: 1MiB}
cluster: {kind: switch, count: 1, device: {name: gpu, memory: 16GiB}, bandwidth: 10GBps, latency: 1us}
strategy: {micro_batches: 1}
)");
  auto r = run_command({PIPEGRID_BINARY, "run", e});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("chain (1 layer, fp32)") != std::string::npos);
  CHECK(r.out.find("switch (1 device)") != std::string::npos);
  CHECK(r.out.find("uniform + 1f1b, 1 micro-batch of 1 sample\n") != std::string::npos);
  CHECK(r.out.find("stage graph      1 stage, depth 1") != std::string::npos);
  CHECK(r.out.find("(1 sample per iteration)") != std::string::npos);
  CHECK(r.out.find("stage edges") == std::string::npos);
}

// Refused unless allow_fractional_samples (issue 55, item 12; the refusal's message is
// bad_inputs/batch_fractional_samples.err): with it, the warning.
TEST_CASE(
    "replicas that split a micro-batch into fractional samples: opted in, a warning on standard error") {
  TempDir tmp;
  auto experiment = [&](int samples, int layers = 2) {
    return tmp.write(
        "r" + std::to_string(samples) + "-" + std::to_string(layers) + ".yaml",
        "workload: {kind: chain, layers: " + std::to_string(layers) +
            ", forward: 1ms, backward: 2ms, activation: 1KiB, parameters: 1MiB, "
            "samples_per_micro_batch: " +
            std::to_string(samples) +
            "}\n"
            "cluster: {kind: switch, count: 16, device: {name: gpu, memory: 16GiB}, bandwidth: "
            "10GBps, latency: 1us}\n"
            "strategy: {micro_batches: 4, replicas: 2, allow_fractional_samples: true, stages: " +
            std::to_string(layers) + "}\n");  // stages given: no idle-device warning
  };
  auto odd = run_command({PIPEGRID_BINARY, "run", experiment(3), "--json"});
  CHECK(odd.exit_code == 0);
  // One line for both stages (same replica count), not one per stage.
  CHECK(odd.err ==
        "pipegrid: warning: stages 0, 1 split each micro-batch of 3 samples between 2 replicas: 1.5 samples "
        "per replica (costs scale with the fraction); a micro-batch size divisible by 2 avoids this\n");
  auto even = run_command({PIPEGRID_BINARY, "run", experiment(4), "--json"});
  CHECK(even.exit_code == 0);
  CHECK(even.err.empty());
  // Eight stages of 2 replicas: one line, the stages as a range; one stage: "stage 0 splits".
  auto eight = run_command({PIPEGRID_BINARY, "run", experiment(3, 8), "--json"});
  CHECK(eight.exit_code == 0);
  CHECK(eight.err ==
        "pipegrid: warning: stages 0..7 split each micro-batch of 3 samples between 2 replicas: 1.5 samples "
        "per replica (costs scale with the fraction); a micro-batch size divisible by 2 avoids this\n");
  auto one = run_command({PIPEGRID_BINARY, "run", experiment(3, 1), "--json"});
  CHECK(one.exit_code == 0);
  CHECK(one.err ==
        "pipegrid: warning: stage 0 splits each micro-batch of 3 samples between 2 replicas: 1.5 samples "
        "per replica (costs scale with the fraction); a micro-batch size divisible by 2 avoids this\n");
}

TEST_CASE("GPU replicas that all-reduce every micro-batch: the scaling caveat on standard error") {
  TempDir tmp;
  const std::string caveat =
      " the gradients of every micro-batch between GPU replicas (1 micro-batch per iteration): published "
      "runs "
      "of this kind scale worse from 1 to 8 GPUs than pipegrid predicts, since per-step costs of synchronous "
      "training (input pipeline, stragglers, host synchronisation) are not modelled "
      "(experiments/validation/results.md, in-server pairs; docs/accuracy.md)\n";
  auto experiment = [&](const std::string& name, const std::string& device, int count,
                        const std::string& strategy) {
    return tmp.write(name + ".yaml",
                     "workload: {kind: chain, layers: 2, forward: 1ms, backward: 2ms, activation: 1KiB, "
                     "parameters: 1MiB, samples_per_micro_batch: 8}\n"
                     "cluster: {kind: switch, count: " +
                         std::to_string(count) + ", device: {name: d, " + device +
                         "}, bandwidth: 10GBps, latency: 1us}\n"
                         "strategy: " +
                         strategy + "\n");
  };
  // Data parallelism over 2 A100s, one micro-batch: the one stage is said.
  auto dp =
      run_command({PIPEGRID_BINARY, "run",
                   experiment("dp", "model: a100", 2, "{partitioner: dp, micro_batches: 1}"), "--json"});
  CHECK(dp.exit_code == 0);
  CHECK(dp.err == "pipegrid: warning: the stage all-reduces" + caveat);
  // Two stages of 2 replicas each: both stages, counted.
  auto pp = run_command({PIPEGRID_BINARY, "run",
                         experiment("pp", "model: a100", 4, "{micro_batches: 1, replicas: 2, stages: 2}"),
                         "--json"});
  CHECK(pp.exit_code == 0);
  CHECK(pp.err == "pipegrid: warning: 2 stages all-reduce" + caveat);
  // Accumulating (4 micro-batches per all-reduce), an FPGA, a device of no family, one GPU: nothing.
  struct Quiet {
    std::string name, device;
    int count;
    std::string strategy;
  };
  for (const Quiet& q : {Quiet{"acc", "model: a100", 2, "{partitioner: dp, micro_batches: 4}"},
                         Quiet{"fpga", "model: u280", 2, "{partitioner: dp, micro_batches: 1}"},
                         Quiet{"custom", "memory: 16GiB", 2, "{partitioner: dp, micro_batches: 1}"},
                         Quiet{"one", "model: a100", 1, "{partitioner: dp, micro_batches: 1}"}}) {
    auto r =
        run_command({PIPEGRID_BINARY, "run", experiment(q.name, q.device, q.count, q.strategy), "--json"});
    CHECK(r.exit_code == 0);
    CHECK_MESSAGE(r.err.empty(), q.name, ": ", r.err);
  }
}

namespace {

// experiments/validation/accuracy.yaml read here (the oracle for what `run` reports; the file itself
// is held to a fresh validation run by tests/tools/validation_runs.py).
YAML::Node accuracy_file() {
  return YAML::LoadFile(std::string(PIPEGRID_SOURCE_DIR) + "/experiments/validation/accuracy.yaml");
}

// `model`: the zoo model and its keys (BERT-Large's first two layers by default).
nlohmann::json run_json(TempDir& tmp, const std::string& device, const std::string& precision,
                        const std::string& model = "bert-large, layers: 2") {
  const std::string e = tmp.write(
      "c.yaml",
      "workload: {model: " + model + ", precision: " + precision + "}\n" +
          "cluster: {kind: switch, count: 2, bandwidth: 100GBps, latency: "
          "1us, device: " +
          device +
          "}\n"
          "strategy: {partitioner: uniform, schedule: 1f1b, micro_batch_size: 4, micro_batches: 4}\n");
  auto r = run_command({PIPEGRID_BINARY, "run", e, "--json"});
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.out)["cost_model_checks"];
}

}  // namespace

TEST_CASE("run reports the validation suite's check rows for the catalog GPU and precision it uses") {
  TempDir tmp;
  const YAML::Node acc = accuracy_file();
  // A catalog V100 in amp: the file's v100 amp entry, as it is.
  auto c = run_json(tmp, "{name: gpu, model: v100}", "amp");
  REQUIRE(c.size() == 1);
  CHECK(c[0]["device"] == "v100");
  CHECK(c[0]["status"] == "checked");
  CHECK(c[0]["check_rows"] == acc["v100"]["amp"]["check_rows"].as<int>());
  CHECK(c[0]["median_error"] == acc["v100"]["amp"]["median_error"].as<double>());
  CHECK(c[0]["max_error"] == acc["v100"]["amp"]["max_error"].as<double>());
  CHECK(c[0]["worst"] == acc["v100"]["amp"]["worst"].as<std::string>());
  CHECK(c[0]["spread_groups"] == acc["v100"]["amp"]["spread_groups"].as<int>());
  CHECK(c[0]["max_spread"] == acc["v100"]["amp"]["max_spread"].as<double>());
  // Plain fp16 takes amp's rows (the same fp16 math); the A100's 40 GB part its chip's rows.
  CHECK(run_json(tmp, "{name: gpu, model: v100}", "fp16")[0]["check_rows"] ==
        acc["v100"]["amp"]["check_rows"].as<int>());
  CHECK(c[0]["source"] == "validation");
  auto a = run_json(tmp, "{name: gpu, model: a100-40gb}", "tf32");
  REQUIRE(a.size() == 1);  // Megatron-LM's runs are amp only
  CHECK(a[0]["status"] == "checked");
  CHECK(a[0]["max_error"] == acc["a100"]["tf32"]["max_error"].as<double>());
  // The A100 in amp: measurements.yaml's rows, then Megatron-LM's 3D runs apart.
  auto m = run_json(tmp, "{name: gpu, model: a100}", "amp");
  REQUIRE(m.size() == 2);
  CHECK(m[0]["check_rows"] == acc["a100"]["amp"]["check_rows"].as<int>());
  CHECK(m[1]["source"] == "megatron-lm");
  CHECK(m[1]["check_rows"] == acc["a100"]["megatron-lm"]["amp"]["check_rows"].as<int>());
  CHECK(m[1]["worst"] == acc["a100"]["megatron-lm"]["amp"]["worst"].as<std::string>());
  // A memory size changes no time: still the catalog's figures.
  CHECK(run_json(tmp, "{name: gpu, model: v100, memory: 16GB}", "fp32")[0]["status"] == "checked");
  // Overridden cost figures: the rows do not apply, and the line says which figure.
  auto o = run_json(tmp, "{name: gpu, model: v100, compute_efficiency: {fp16: {gemm: 0.8}}}", "amp");
  CHECK(o[0]["status"] == "overridden");
  auto text = run_command({PIPEGRID_BINARY, "run", (tmp.path / "c.yaml").string()});
  auto plan = run_command({PIPEGRID_BINARY, "plan", (tmp.path / "c.yaml").string()});
  CHECK(plan.out.find("cost model                          v100 amp: compute_efficiency overridden") !=
        std::string::npos);
  CHECK(text.out.find("cost model       v100 amp: compute_efficiency overridden; the catalog's check rows") !=
        std::string::npos);
  // A precision or a GPU the suite has no rows for.
  CHECK(!acc["a100"]["fp32"]);
  CHECK(run_json(tmp, "{name: gpu, model: a100}", "fp32")[0]["status"] == "not checked");
  CHECK(!acc["h200"]);
  CHECK(run_json(tmp, "{name: gpu, model: h200}", "bf16")[0]["status"] == "not checked");
  // The H100: no row of measurements.yaml; Megatron-Core's runs in amp-bf16 and NeMo's in fp8.
  CHECK(!acc["h100"]["amp-bf16"]);
  auto h = run_json(tmp, "{name: gpu, model: h100}", "amp-bf16");
  REQUIRE(h.size() == 1);
  CHECK(h[0]["status"] == "checked");
  CHECK(h[0]["source"] == "megatron-lm");
  CHECK(h[0]["check_rows"] == acc["h100"]["megatron-lm"]["amp-bf16"]["check_rows"].as<int>());
  CHECK(h[0]["max_error"] == acc["h100"]["megatron-lm"]["amp-bf16"]["max_error"].as<double>());
  auto hb = run_json(tmp, "{name: gpu, model: h100}", "bf16");
  CHECK(hb[0]["status"] == "not checked");
  CHECK(run_command({PIPEGRID_BINARY, "run", (tmp.path / "c.yaml").string()})
            .out.find(
                "h100 bf16: not checked against published training runs in bf16 (checked: amp-bf16, fp8;") !=
        std::string::npos);
  // The worst row by name, beside its id (issue 55, item 19).
  CHECK(c[0]["worst_name"] == acc["v100"]["amp"]["worst_name"].as<std::string>());
  run_json(tmp, "{name: gpu, model: v100}", "amp");
  CHECK(run_command({PIPEGRID_BINARY, "run", (tmp.path / "c.yaml").string()})
            .out.find("(" + acc["v100"]["amp"]["worst_name"].as<std::string>() + "; row " +
                      acc["v100"]["amp"]["worst"].as<std::string>() + ")") != std::string::npos);
  // A CNN: Megatron-LM's transformer runs say nothing of it (they were quoted for VGG on A100 and H100).
  const nlohmann::json vgg_a100 = run_json(tmp, "{name: gpu, model: a100}", "amp", "vgg16");
  REQUIRE(vgg_a100.size() == 1);  // measurements.yaml's rows, not Megatron-LM's
  CHECK(vgg_a100[0]["source"] == "validation");
  const nlohmann::json vgg_h100 = run_json(tmp, "{name: gpu, model: h100}", "amp-bf16", "vgg16");
  REQUIRE(vgg_h100.size() == 1);
  CHECK(vgg_h100[0]["status"] == "not checked");
  CHECK(
      run_command({PIPEGRID_BINARY, "run", (tmp.path / "c.yaml").string()})
          .out.find("h100 amp-bf16: not checked against published training runs of this kind of model (only "
                    "transformer runs were)") != std::string::npos);
  // A custom device: its figures are the user's, and nothing is claimed for them.
  CHECK(run_json(tmp, "{name: gpu, flops: 100TFLOPS, memory: 16GB}", "fp32").empty());
  // A profile's measured layer times on the device they were measured on use no cost model.
  const std::string p =
      tmp.write("p.yaml", "workload: {profile: " + std::string(PIPEGRID_PROFILES_DIR) +
                              "/pipedream/vgg16_graph.txt, batch: 64, device: v100}\n"
                              "cluster: {kind: switch, count: 2, bandwidth: 100GBps, latency: "
                              "1us, device: {name: gpu, model: v100}}\n"
                              "strategy: {partitioner: uniform, schedule: 1f1b, micro_batches: 4}\n");
  auto r = run_command({PIPEGRID_BINARY, "run", p, "--json"});
  REQUIRE(r.exit_code == 0);
  CHECK(nlohmann::json::parse(r.out)["cost_model_checks"].empty());
}

TEST_CASE("device show lists the validation suite's check rows of a catalog device, or says there are none") {
  const YAML::Node acc = accuracy_file();
  auto r = run_command({PIPEGRID_BINARY, "device", "show", "a100-40gb", "--json"});
  REQUIRE(r.exit_code == 0);
  const nlohmann::json checks = nlohmann::json::parse(r.out)["checks"];
  // amp and tf32 from measurements.yaml, and Megatron-LM's amp runs.
  REQUIRE(checks.size() == 3);
  for (const auto& c : checks) {
    const std::string prec = c["precision"].get<std::string>();
    const YAML::Node f = c["source"] == "megatron-lm" ? acc["a100"]["megatron-lm"][prec] : acc["a100"][prec];
    REQUIRE(f);
    CHECK(c["check_rows"] == f["check_rows"].as<int>());
    CHECK(c["median_error"] == f["median_error"].as<double>());
  }
  auto h = run_command({PIPEGRID_BINARY, "device", "show", "h200"});
  REQUIRE(h.exit_code == 0);
  CHECK(h.out.find("checked          not against published training runs") != std::string::npos);
  // The compute table's header names every compute class its rows print (grouped-gemm was missing),
  // and the memory line prints every class (the H200's measured strided and compiled figures).
  const std::string head = h.out.substr(
      h.out.find("  precision"), h.out.find('\n', h.out.find("  precision")) - h.out.find("  precision"));
  for (const char* cls : {"gemm", "conv", "attention", "recurrent", "grouped-gemm"})
    CHECK(head.find(cls) != std::string::npos);
  const std::string fp16 =
      h.out.substr(h.out.find("  fp16 "), h.out.find('\n', h.out.find("  fp16 ")) - h.out.find("  fp16 "));
  CHECK(fp16.find("0.700        0.500        0.440        0.500        0.700") != std::string::npos);
  CHECK(h.out.find("strided 0.330 compiled 0.360") != std::string::npos);
  // A rate the device lacks is said as such (the A100 printed its bf16 rate, 312 TFLOP/s, as fp8's;
  // topologies/devices.yaml gives it no fp8 peak), a tf32 that runs as fp32 likewise.
  auto a100 = run_command({PIPEGRID_BINARY, "device", "show", "a100"});
  REQUIRE(a100.exit_code == 0);
  CHECK(a100.out.find("  fp8                        none") != std::string::npos);
  auto v100 = run_command({PIPEGRID_BINARY, "device", "show", "v100"});
  REQUIRE(v100.exit_code == 0);
  CHECK(v100.out.find("  tf32                    as fp32") != std::string::npos);
  // The H100: Megatron-Core's runs in amp-bf16 (experiments/megatron/h100.md) and NeMo 24.07's in
  // fp8 (nemo_h100.md).
  auto h100 = run_command({PIPEGRID_BINARY, "device", "show", "h100", "--json"});
  REQUIRE(h100.exit_code == 0);
  const nlohmann::json hc = nlohmann::json::parse(h100.out)["checks"];
  // ... Megatron-Bridge's dense runs in fp8 (experiments/blackwell-dense), and the published MoE runs
  // of experiments/moe, one entry per precision they ran in.
  const YAML::Node moe = YAML::LoadFile(std::string(PIPEGRID_SOURCE_DIR) + "/experiments/moe/accuracy.yaml");
  const YAML::Node dense =
      YAML::LoadFile(std::string(PIPEGRID_SOURCE_DIR) + "/experiments/blackwell-dense/accuracy.yaml");
  REQUIRE(hc.size() == 3 + moe["h100"].size());
  CHECK(hc[0]["precision"] == "amp-bf16");
  CHECK(hc[0]["check_rows"] == acc["h100"]["megatron-lm"]["amp-bf16"]["check_rows"].as<int>());
  CHECK(hc[1]["precision"] == "fp8");
  CHECK(hc[1]["source"] == "megatron-lm");
  CHECK(hc[1]["check_rows"] == acc["h100"]["megatron-lm"]["fp8"]["check_rows"].as<int>());
  CHECK(hc[1]["faster"] == acc["h100"]["megatron-lm"]["fp8"]["faster"].as<int>());
  CHECK(hc[2]["source"] == "blackwell-dense");
  CHECK(hc[2]["precision"] == "fp8");
  CHECK(hc[2]["check_rows"] == dense["h100"]["fp8"]["check_rows"].as<int>());
  CHECK(hc[2]["median_error"] == dense["h100"]["fp8"]["median_error"].as<double>());
  for (size_t i = 3; i < hc.size(); ++i) {
    CHECK(hc[i]["source"] == "moe");
    const YAML::Node f = moe["h100"][hc[i]["precision"].get<std::string>()];
    REQUIRE(f);
    CHECK(hc[i]["check_rows"] == f["check_rows"].as<int>());
  }
}

TEST_CASE("run states the expert gradients' buckets, and DualPipe's reductions in one piece") {
  // experiments/zoo/mixtral-8x7b-h100.yaml: p 4, v 8, 32 blocks, so stage 0 holds the embedding and one
  // block; d = 16, Megatron's bucket max(40 M, 16 M) = 40 M parameters. Dense: 32,000 x 4,096 (131.1 M)
  // + attention 2 x 4,096^2 + 2 x 4,096 x 1,024 (41.9 M) + the router and norms (0.04 M) = 173.1 M,
  // ceil(4.33) = 5 buckets; experts: ep 8, one per device, 3 x 4,096 x 14,336 = 176.2 M, ceil(4.40) = 5.
  const std::string file = std::string(PIPEGRID_SOURCE_DIR) + "/experiments/zoo/mixtral-8x7b-h100.yaml";
  auto run = run_command({PIPEGRID_BINARY, "run", file});
  REQUIRE(run.exit_code == 0);
  CHECK(run.out.find(
            "stage 0's in 5 buckets during its last backward (--overlap-grad-reduce), its experts' in 5 "
            "buckets of their own over the expert data-parallel group") != std::string::npos);
  auto json = run_command({PIPEGRID_BINARY, "run", file, "--json"});
  REQUIRE(json.exit_code == 0);
  const nlohmann::json par = nlohmann::json::parse(json.out)["parallelism"];
  CHECK(par["dp_buckets"] == 5);
  CHECK(par["expert_dp_buckets"] == 5);
  // DualPipe's stages reduce with their mirrors in one piece (the lowering buckets no mirrored stage);
  // the line said buckets until 2026-12-06.
  TempDir tmp;
  const std::string dual = tmp.write(
      "d.yaml",
      "workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, backward_weight: 1ms, activation: "
      "1MiB, "
      "parameters: 400MB}\n"
      "cluster: {preset: dgx-a100-16}\n"
      "strategy: {schedule: dualpipe, stages: 2, replicas: 2, micro_batch_size: 2, micro_batches: 4, "
      "dp_overlap: true}\n");
  auto d = run_command({PIPEGRID_BINARY, "run", dual});
  REQUIRE_MESSAGE(d.exit_code == 0, d.err);
  CHECK(d.out.find(
            "DualPipe: each stage's with its mirror's in one piece once both copies' last backwards ran") !=
        std::string::npos);
  auto dj = run_command({PIPEGRID_BINARY, "run", dual, "--json"});
  REQUIRE(dj.exit_code == 0);
  CHECK(nlohmann::json::parse(dj.out)["parallelism"]["dp_buckets"] == 1);
}

TEST_CASE("run and plan state how the data-parallel gradients are reduced, when the experiment says") {
  // experiments/megatron/h100-1.7b.yaml: GPT 1.7B untied (12 l h^2 + 13 l h + 2 V h + s h + 2 h =
  // 1.7538 B parameters), d = 48: Megatron's bucket max(40 M, 48 M) = 48 M, ceil(36.5) = 37 buckets.
  const std::string file = std::string(PIPEGRID_SOURCE_DIR) + "/experiments/megatron/h100-1.7b.yaml";
  const std::string line =
      "reduced at 4 bytes per parameter; stage 0's in 37 buckets during its last backward "
      "(--overlap-grad-reduce); ZeRO-1: a reduce-scatter, the parameter all-gather taken as hidden behind "
      "the forward\n";
  auto run = run_command({PIPEGRID_BINARY, "run", file});
  REQUIRE(run.exit_code == 0);
  CHECK(run.out.find("  gradients  " + line) != std::string::npos);
  auto plan = run_command({PIPEGRID_BINARY, "plan", file});
  REQUIRE(plan.exit_code == 0);
  CHECK(plan.out.find("gradients   " + line) != std::string::npos);
  auto json = run_command({PIPEGRID_BINARY, "run", file, "--json"});
  REQUIRE(json.exit_code == 0);
  const nlohmann::json par = nlohmann::json::parse(json.out)["parallelism"];
  CHECK(par["dp_overlap"] == true);
  CHECK(par["dp_buckets"] == 37);
  CHECK(par["gradient_reduce_bytes"] == 4.0);
  // Without either key: no line, one bucket.
  TempDir tmp;
  const std::string plain = tmp.write(
      "p.yaml",
      "workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 100MB}\n"
      "cluster: {preset: dgx-a100-16}\n"
      "strategy: {stages: 1, replicas: 2, micro_batch_size: 1, micro_batches: 2}\n");
  auto p = run_command({PIPEGRID_BINARY, "run", plain, "--json"});
  REQUIRE(p.exit_code == 0);
  CHECK(nlohmann::json::parse(p.out)["parallelism"]["dp_buckets"] == 1);
  // Without gradient_reduce the reduce moves the workload's fp32 gradients: 4 bytes per parameter, as
  // the assumptions say (the parallelism section said 0 until 2026-12-05).
  const nlohmann::json pj = nlohmann::json::parse(p.out);
  CHECK(pj["parallelism"]["gradient_reduce_bytes"] == 4.0);
  CHECK(pj["assumptions"]["gradient_reduce_bytes"] == 4.0);
  // No `gradients` line (the `assumes` line states the bytes of every run).
  CHECK(run_command({PIPEGRID_BINARY, "run", plain}).out.find("\n  gradients  ") == std::string::npos);
}

TEST_CASE("run reports the published dense runs (experiments/blackwell-dense) on a B200 or GB200") {
  TempDir tmp;
  // experiments/blackwell-dense/accuracy.yaml read here (the oracle; run.py --validate, a ctest, holds the
  // file to results.md's check rows).
  const YAML::Node dense =
      YAML::LoadFile(std::string(PIPEGRID_SOURCE_DIR) + "/experiments/blackwell-dense/accuracy.yaml");
  const std::string llama = "llama3-8b, layers: 2";
  REQUIRE(dense["b200"]["mxfp8"]);
  auto c = run_json(tmp, "{name: gpu, model: b200}", "mxfp8", llama);
  REQUIRE(c.size() == 1);  // the B200 has no validation-suite row: the dense runs alone
  CHECK(c[0]["source"] == "blackwell-dense");
  CHECK(c[0]["status"] == "checked");
  CHECK(c[0]["check_rows"] == dense["b200"]["mxfp8"]["check_rows"].as<int>());
  CHECK(c[0]["median_error"] == dense["b200"]["mxfp8"]["median_error"].as<double>());
  CHECK(c[0]["worst"] == dense["b200"]["mxfp8"]["worst"].as<std::string>());
  const std::string text = run_command({PIPEGRID_BINARY, "run", (tmp.path / "c.yaml").string()}).out;
  CHECK(text.find("b200 mxfp8, published dense runs: against " +
                  dense["b200"]["mxfp8"]["check_rows"].as<std::string>() + " published run") !=
        std::string::npos);
  // The assumes line states MXFP8's GEMM rate: 6.812 / 7.161 ms, Transformer Engine's measured kernels.
  CHECK(text.find("fp8 recipe: MXFP8, 32-element blocks, its GEMMs at 0.951 of the fp8 figure") !=
        std::string::npos);
  // An MoE workload on the same GPU gets the MoE runs, not the dense ones; a GPU without dense rows, none.
  for (const auto& x : run_json(tmp, "{name: gpu, model: b200}", "mxfp8", "qwen3-30b-a3b, layers: 2"))
    CHECK(x["source"] != "blackwell-dense");
  REQUIRE(!dense["h200"]);
  for (const auto& x : run_json(tmp, "{name: gpu, model: h200}", "fp8", llama))
    CHECK(x["source"] != "blackwell-dense");
  // The H100 in fp8 has both: Megatron-LM's 3D runs (experiments/validation) and the dense rows.
  REQUIRE(dense["h100"]["fp8"]);
  std::set<std::string> sources;
  for (const auto& x : run_json(tmp, "{name: gpu, model: h100}", "fp8", llama)) {
    sources.insert(x["source"].get<std::string>());
    if (x["source"] == "blackwell-dense")
      CHECK(x["check_rows"] == dense["h100"]["fp8"]["check_rows"].as<int>());
  }
  CHECK(sources == std::set<std::string>{"blackwell-dense", "megatron-lm"});
  // A precision without dense rows there: not checked, as before.
  REQUIRE(!dense["b200"]["amp-bf16"]);
  auto b = run_json(tmp, "{name: gpu, model: b200}", "amp-bf16", llama);
  REQUIRE(b.size() == 1);
  CHECK(b[0]["status"] == "not checked");
  // Overridden figures: the rows do not apply.
  auto o = run_json(tmp, "{name: gpu, model: b200, compute_efficiency: {fp8: {gemm: 0.6}}}", "mxfp8", llama);
  REQUIRE(o.size() == 1);
  CHECK(o[0]["status"] == "overridden");
}

TEST_CASE("run reports the published MoE runs (experiments/moe) for a workload with MoE blocks") {
  TempDir tmp;
  // experiments/moe/accuracy.yaml read here (the oracle; tests/tools/moe_rows.py holds the file to
  // results.md's check rows).
  const YAML::Node moe = YAML::LoadFile(std::string(PIPEGRID_SOURCE_DIR) + "/experiments/moe/accuracy.yaml");
  const std::string qwen = "qwen3-30b-a3b, layers: 2";
  REQUIRE(moe["gb200"]["mxfp8"]);
  auto c = run_json(tmp, "{name: gpu, model: gb200}", "mxfp8", qwen);
  REQUIRE(c.size() == 1);  // the GB200 has no dense row: the MoE runs alone
  CHECK(c[0]["source"] == "moe");
  CHECK(c[0]["status"] == "checked");
  CHECK(c[0]["check_rows"] == moe["gb200"]["mxfp8"]["check_rows"].as<int>());
  CHECK(c[0]["median_error"] == moe["gb200"]["mxfp8"]["median_error"].as<double>());
  CHECK(c[0]["max_error"] == moe["gb200"]["mxfp8"]["max_error"].as<double>());
  CHECK(c[0]["worst"] == moe["gb200"]["mxfp8"]["worst"].as<std::string>());
  CHECK(c[0]["faster"] == moe["gb200"]["mxfp8"]["faster"].as<int>());
  CHECK(run_command({PIPEGRID_BINARY, "run", (tmp.path / "c.yaml").string()})
            .out.find("gb200 mxfp8, published MoE runs: against " +
                      moe["gb200"]["mxfp8"]["check_rows"].as<std::string>() +
                      " published runs never fitted on") != std::string::npos);
  // A precision with no MoE row on that GPU: said, with the ones that have rows.
  REQUIRE(!moe["gb200"]["fp8"]);
  auto f = run_json(tmp, "{name: gpu, model: gb200}", "fp8", qwen);
  REQUIRE(f.size() == 2);
  CHECK(f[0]["source"] == "moe");
  CHECK(f[0]["status"] == "not checked");
  CHECK(f[1]["status"] == "not checked");
  // A GPU with no MoE row at all, and a dense model on a GPU with MoE rows: no MoE entry.
  REQUIRE(!moe["h200"]);
  // (The H200 in fp8: it has no microscaling for mxfp8, which is refused there.)
  for (const auto& x : run_json(tmp, "{name: gpu, model: h200}", "fp8", qwen)) CHECK(x["source"] != "moe");
  for (const auto& x : run_json(tmp, "{name: gpu, model: gb200}", "mxfp8")) CHECK(x["source"] != "moe");
  // Overridden figures: the MoE rows do not apply either.
  auto o = run_json(tmp, "{name: gpu, model: gb200, compute_efficiency: {fp8: {gemm: 0.5}}}", "mxfp8", qwen);
  REQUIRE(o.size() == 1);
  CHECK(o[0]["status"] == "overridden");
}
