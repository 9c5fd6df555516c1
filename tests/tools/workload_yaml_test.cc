// Workloads from experiment files: zoo models on catalog devices end to end, model files.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/models/zoo.h"
#include "core/partitioners/megatron.h"
#include "tests/support/approx.h"
#include "tests/support/process.h"
#include "tools/input/device_yaml.h"
#include "tools/input/model_yaml.h"

using namespace pipegrid;
using nlohmann::json;
using testing::CommandResult;
using testing::run_command;

TEST_CASE("a zoo model on catalog devices runs end to end - compute is conserved") {
  auto r = run_command({PIPEGRID_BINARY, "run",
                        std::string(PIPEGRID_SOURCE_DIR) + "/experiments/zoo/resnet50-v100.yaml", "--json"});
  REQUIRE(r.exit_code == 0);
  json j = json::parse(r.out);
  // Independently: every layer's F + B on a V100 (catalog) for 32 images, 8 micro-batches.
  Workload w = *build_model(**find_model("resnet50"), {}, Precision::FP16);
  const DeviceSpec& v100 = input::find_catalog_device("v100")->spec;
  double per_micro_batch = 0;
  for (size_t l = 0; l < w.layer_count(); ++l) {
    PassTimes t = *layer_times(w.layer(l), w.precision, v100, 32);
    per_micro_batch += t.forward + t.backward();
  }
  double busy = 0, busiest = 0;
  REQUIRE(j["devices"].size() == 4);
  for (const json& d : j["devices"]) {
    CHECK(d["used"] == true);
    busy += d["busy_s"].get<double>();
    busiest = std::max(busiest, d["busy_s"].get<double>());
  }
  // Plus one optimizer step per device, memory-bound and linear in the parameters it holds (every
  // layer on one device): mixed-precision Adam reads and writes 28 bytes per parameter at the V100's
  // 900 GB/s x 0.83 (catalog) - 25.56 M parameters: about 0.96 ms in all.
  const double step = total_parameters(w) * 28 / (900e9 * 0.83);
  CHECK(optimizer_step_time(total_parameters(w), Optimizer::MixedAdam, Precision::FP16, v100) ==
        pipegrid::testing::approx(step));
  CHECK(busy == pipegrid::testing::approx(8 * per_micro_batch + step).epsilon(1e-9));
  CHECK(j["iteration_time_s"].get<double>() >= busiest);
  CHECK(j["feasible"] == true);
  CHECK(j["throughput_samples_per_s"].get<double>() ==
        pipegrid::testing::approx(256 / j["iteration_time_s"].get<double>()));
}

TEST_CASE("model files: shapes give the costs - inputs may name any layer - custom layers") {
  const char* text = R"(
layers:
  - {name: image, kind: input, shape: [3, 32, 32]}
  - {name: conv, kind: conv2d, in_channels: 3, out_channels: 16, kernel: 3, padding: 1, bias: false, batchnorm: true, relu: true}
  - {name: pool, kind: maxpool, kernel: 2}
  - {name: flat, kind: flatten}
  - {name: fc, kind: linear, in_features: 4096, out_features: 10}
  - {name: side, kind: linear, in_features: 4096, out_features: 10, inputs: [flat]}
  - {name: sum, kind: add, inputs: [fc, side]}
  - {name: head, kind: custom, forward: 1ms, backward: 2ms, batch: 4, parameters: 100, output: 40B, inputs: [sum]}
)";
  input::Document doc = input::load_document_text(text, "m.yaml");
  Workload w = input::parse_layers(*input::Node::root(doc).get("layers"), "m", Precision::FP32);
  REQUIRE(w.layer_count() == 8);
  // conv: 16 x 3 x 9 weights + 2 x 16 BatchNorm; 32 x 32 outputs per channel, 2 FLOP per MAC.
  CHECK(w.layer(1).parameters == 16 * 3 * 9 + 32);
  CHECK(w.layer(1).forward_flops == 2.0 * 16 * 3 * 9 * 32 * 32);
  CHECK(w.layer(4).parameters == 4096 * 10 + 10);  // pool halves 32 x 32 to 16 x 16: 16 x 256 = 4096
  CHECK(boost::in_degree(6, w.graph) == 2);
  CHECK(w.layer(7).measured->forward_s == 1e-3);
  CHECK(w.layer(7).measured->batch == 4);
  CHECK(w.layer(7).output_bytes == 40);
  CHECK(w.input_bytes_per_sample == 3 * 32 * 32 * 4);
}

TEST_CASE("pipegrid workload show --json: the documented keys - times on a catalog device") {
  auto r = run_command({PIPEGRID_BINARY, "workload", "show", "vgg16", "--device", "v100",
                        "--micro-batch-size", "32", "--json"});
  REQUIRE(r.exit_code == 0);
  json j = json::parse(r.out);
  CHECK(j["parameters"].get<double>() == 138357544);
  CHECK(j["parameter_bytes"].get<double>() == 4.0 * 138357544);
  CHECK(j["forward_flops_per_sample"].get<double>() == pipegrid::testing::approx(30.94e9).epsilon(0.001));
  REQUIRE(j["layers"].size() == 24);
  double sum = 0;
  for (const json& l : j["layers"]) {
    for (const char* key :
         {"name", "forward_flops", "parameters", "activation_bytes", "forward_s", "backward_s"})
      CHECK(l.contains(key));
    sum += l["forward_s"].get<double>();
  }
  CHECK(sum == pipegrid::testing::approx(j["forward_s"].get<double>()));
  // fc7 is one GEMM of 2 x 4096^2 x 32 FLOP whose time is the cost model's (core/device.h,
  // topologies/devices.yaml): the layer overhead plus max(kernel dispatch, kernel startup +
  // max(FLOPs / (peak x the fp32 gemm efficiency), bytes / (bandwidth x the gemm memory
  // efficiency))), the bytes being its fp32 weights and bias, its input and its output. The figures
  // are the catalog's, as `device show` prints them.
  auto dev = run_command({PIPEGRID_BINARY, "device", "show", "v100", "--json"});
  REQUIRE(dev.exit_code == 0);
  const json v100 = json::parse(dev.out);
  const double compute =
      2.0 * 4096 * 4096 * 32 /
      (v100["peak_flops"]["fp32"].get<double>() * v100["compute_efficiency"]["fp32"]["gemm"].get<double>());
  const double memory =
      ((4096.0 * 4096 + 4096) * 4 + 2 * 4096.0 * 4 * 32) /
      (v100["memory_bandwidth_Bps"].get<double>() * v100["memory_efficiency"]["gemm"].get<double>());
  // The catalog's V100 sets no host dispatch (a host never the limit): a call is start-up + work.
  REQUIRE(v100["kernel_dispatch_s"].get<double>() == 0);
  const double call = v100["kernel_startup_s"].get<double>() + std::max(compute, memory);
  bool seen = false;
  for (const json& l : j["layers"])
    if (l["name"] == "fc7") {
      seen = true;
      CHECK(l["forward_s"].get<double>() ==
            pipegrid::testing::approx(v100["layer_overhead_s"].get<double>() + call));
    }
  CHECK(seen);
  // conv2 (64 -> 64 channels, 3x3, stride 1, on 224 x 224, bias, ReLU) is costed as Winograd
  // F(2x2, 3x3) where the device lists fp32 (`winograd`, as the catalog's V100 does): its direct
  // FLOPs / 2.25 (Lavin and Gray, CVPR 2016). Then its ReLU reads and writes the output.
  REQUIRE(v100["winograd"] == json::array({"fp32"}));
  const double out = 64.0 * 224 * 224 * 4 * 32, in = out;
  const double conv_compute =
      2.0 * 64 * 64 * 9 * 224 * 224 * 32 / 2.25 /
      (v100["peak_flops"]["fp32"].get<double>() * v100["compute_efficiency"]["fp32"]["conv"].get<double>());
  const double conv_memory =
      (in + out + (64.0 * 64 * 9 + 64) * 4) /
      (v100["memory_bandwidth_Bps"].get<double>() * v100["memory_efficiency"]["conv"].get<double>());
  const double relu =
      2 * out /
      (v100["memory_bandwidth_Bps"].get<double>() * v100["memory_efficiency"]["elementwise"].get<double>());
  auto kernel = [&](double work) { return v100["kernel_startup_s"].get<double>() + work; };
  seen = false;
  for (const json& l : j["layers"])
    if (l["name"] == "conv2") {
      seen = true;
      CHECK(l["forward_s"].get<double>() ==
            pipegrid::testing::approx(v100["layer_overhead_s"].get<double>() +
                                      kernel(std::max(conv_compute, conv_memory)) + kernel(relu)));
    }
  CHECK(seen);
  auto profile = run_command({PIPEGRID_BINARY, "workload", "show",
                              std::string(PIPEGRID_PROFILES_DIR) + "/pipedream/gnmt_graph.txt", "--json"});
  if (profile.exit_code == 0) CHECK(json::parse(profile.out)["layers"].size() == 48);
  auto bad = run_command({PIPEGRID_BINARY, "workload", "show", "resnet"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.rfind("pipegrid: unknown model \"resnet\" (valid: vgg16, resnet50,", 0) == 0);
}

TEST_CASE("pipegrid device list and show") {
  auto list = run_command({PIPEGRID_BINARY, "device", "list"});
  CHECK(list.exit_code == 0);
  for (const char* name :
       {"v100", "a100", "h100", "vu9p", "u200", "u250", "u280", "u55c", "stratix10-gx", "stratix10-mx"})
    CHECK(list.out.find(name) != std::string::npos);
  auto show = run_command({PIPEGRID_BINARY, "device", "show", "u280", "--json"});
  REQUIRE(show.exit_code == 0);
  json j = json::parse(show.out);
  CHECK(j["fpga"]["dsps"] == 9024);
  CHECK(j["peak_flops"]["fp16"].get<double>() == pipegrid::testing::approx(9024 * 300e6 * 2));
  CHECK(j["memory_bandwidth_Bps"].get<double>() == 460e9);
  // The U280 has no fp8 or tf32 DSP mode (macs_per_dsp 0): fp8 none, tf32 run as fp32, as the text
  // says ("fp8 none", "tf32 as fp32"); until 2026-12-05 the JSON gave the fall-back rates as its own.
  CHECK(j["peak_flops"]["fp8"].is_null());
  CHECK(j["peak_flops"]["tf32"] == j["peak_flops"]["fp32"]);
  CHECK(j["peak_runs_as"] == json{{"tf32", "fp32"}});
  json a100 = json::parse(run_command({PIPEGRID_BINARY, "device", "show", "a100", "--json"}).out);
  CHECK(a100["peak_flops"]["fp8"].is_null());
  CHECK(a100["peak_flops"]["tf32"].get<double>() == 156e12);
  CHECK(a100["peak_runs_as"].empty());
  CHECK(run_command({PIPEGRID_BINARY, "device", "show", "u2800"}).exit_code == 2);
}

TEST_CASE("precision: amp and tf32 in workload files and workload show, amp keeps fp32 master weights") {
  char tmpl[] = "/tmp/pipegrid-test-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  // A 1024 x 1024 linear layer (1,049,600 parameters) on one device, Adam, one micro-batch.
  auto experiment = [&](const std::string& precision) {
    const std::string path = dir + "/" + precision + ".yaml";
    std::ofstream(path) << "workload:\n  layers:\n    - {name: x, kind: input, shape: [1024]}\n"
                           "    - {name: fc, kind: linear, in_features: 1024, out_features: 1024}\n"
                           "  precision: "
                        << precision
                        << "\ncluster: {kind: switch, count: 1, device: {name: g, model: a100}, bandwidth: "
                           "100GBps, latency: 1us}\n"
                           "strategy: {partitioner: uniform, schedule: gpipe, micro_batches: 1}\n"
                           "memory: {optimizer: adam}\n";
    return run_command({PIPEGRID_BINARY, "run", path, "--json"});
  };
  const double n = 1024.0 * 1024 + 1024;
  auto static_bytes = [](const CommandResult& r) {
    return json::parse(r.out)["devices"][0]["static_memory_bytes"].get<double>();
  };
  CommandResult amp = experiment("amp"), tf32 = experiment("tf32"), fp16 = experiment("fp16");
  REQUIRE(amp.exit_code == 0);
  REQUIRE(tf32.exit_code == 0);
  REQUIRE(fp16.exit_code == 0);
  CHECK(static_bytes(amp) == pipegrid::testing::approx(16 * n));   // 2 + 2 + fp32 master 4 + m 4 + v 4
  CHECK(static_bytes(tf32) == pipegrid::testing::approx(16 * n));  // all fp32: 4 + 4 + 8
  CHECK(static_bytes(fp16) == pipegrid::testing::approx(8 * n));   // pure fp16 Adam
  std::filesystem::remove_all(dir);

  CommandResult show =
      run_command({PIPEGRID_BINARY, "workload", "show", "bert-large", "--precision", "amp", "--json"});
  REQUIRE(show.exit_code == 0);
  json j = json::parse(show.out);
  CHECK(j["precision"] == "amp");
  CHECK(j["parameter_bytes"].get<double>() == pipegrid::testing::approx(2 * j["parameters"].get<double>()));
  CommandResult t =
      run_command({PIPEGRID_BINARY, "workload", "show", "resnet50", "--precision", "tf32", "--json"});
  REQUIRE(t.exit_code == 0);
  CHECK(json::parse(t.out)["parameter_bytes"].get<double>() == pipegrid::testing::approx(4 * 25557032.0));
  CommandResult bad = run_command({PIPEGRID_BINARY, "workload", "show", "resnet50", "--precision", "fp4"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("expected fp32, tf32, fp16, bf16, int8, amp, amp-bf16, fp8, fp8-blockwise or mxfp8, got "
                     "\"fp4\"") != std::string::npos);
}

TEST_CASE("a zoo model's documented layers parameter is a count, not a layer list (gpt, mmt)") {
  char tmpl[] = "/tmp/pipegrid-test-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  auto run = [&](const std::string& workload) {
    const std::string path = dir + "/e.yaml";
    std::ofstream(path)
        << "workload: " << workload
        << "\ncluster: {kind: switch, count: 1, device: {name: g, model: a100}, bandwidth: 100GBps, "
           "latency: 1us}\nstrategy: {partitioner: uniform, schedule: gpipe, micro_batches: 1}\n";
    return run_command({PIPEGRID_BINARY, "run", path, "--json"});
  };
  CommandResult two = run("{model: gpt, layers: 2, hidden: 512, heads: 8, sequence: 128}");
  CommandResult four = run("{model: gpt, layers: 4, hidden: 512, heads: 8, sequence: 128}");
  REQUIRE(two.exit_code == 0);
  REQUIRE(four.exit_code == 0);
  CHECK(json::parse(two.out)["iteration_time_s"].get<double>() <
        json::parse(four.out)["iteration_time_s"].get<double>());
  CHECK(run("{model: mmt, layers: 2, branches: 2}").exit_code == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "a model file's tied_to: the weight counts once at its source, the tied layer holds h x V to copy") {
  // A GPT-like file: an embedding of 1,000 x 64, a linear head 64 -> 1,000 tied to it (no bias), a
  // decoder embedding tied to the first table, a custom layer sharing it, and an embedding tied to a
  // linear with a bias. By hand: the tied layers hold no parameters of their own (the head's bias
  // aside), each 64,000 to copy.
  const std::string text = R"(layers:
  - {name: tokens, kind: input, shape: [128]}
  - {name: words, kind: embedding, vocabulary: 1000, dim: 64}
  - {name: head, kind: linear, in_features: 64, out_features: 1000, bias: true, tied_to: words}
  - {name: target, kind: input, shape: [32]}
  - {name: decoder_words, kind: embedding, vocabulary: 1000, dim: 64, tied_to: words, inputs: [target]}
  - {name: other, kind: custom, forward_flops: 1MFLOP, output_shape: [64], tied_to: words, inputs: [head]}
  - {name: proj, kind: linear, in_features: 64, out_features: 1000, bias: true, inputs: [words]}
  - {name: ids, kind: input, shape: [16]}
  - {name: back, kind: embedding, vocabulary: 1000, dim: 64, tied_to: proj, inputs: [ids]}
)";
  Result<Workload> w = input::load_model_text(text, "tied.yaml", std::nullopt);
  REQUIRE_MESSAGE(w.ok(), w.error().message);
  auto named = [&](const std::string& n) -> const Layer& {
    for (size_t i = 0; i < w->layer_count(); ++i)
      if (w->layer(i).name == n) return w->layer(i);
    FAIL("no layer " << n);
    return w->layer(0);
  };
  int words = -1;
  for (size_t i = 0; i < w->layer_count(); ++i)
    if (w->layer(i).name == "words") words = static_cast<int>(i);
  CHECK(named("words").parameters == 64000);
  CHECK(named("words").tied_to == -1);
  for (const char* n : {"head", "decoder_words", "other"}) {
    CAPTURE(n);
    CHECK(named(n).tied_to == words);
    CHECK(named(n).tied_parameters == 64000);
  }
  CHECK(named("head").parameters == 1000);  // its bias
  CHECK(named("head").parameter_bytes == 4000);
  CHECK(named("decoder_words").parameters == 0);
  CHECK(named("other").parameters == 0);
  // Tied to a linear with a bias: the embedding shares its 64 x 1,000 matrix, not the bias.
  CHECK(named("proj").parameters == 65000);
  CHECK(named("back").tied_parameters == 64000);
  CHECK(named("back").parameters == 0);
}

TEST_CASE(
    "a model file's multi_token_prediction: the module's layers are marked, its block outside the model's") {
  // Four blocks, a head, then one MTP module as DeepSeek-V3 draws it (its norms, eh_proj from 2h to h, a
  // block, a final norm and the shared head): by hand, 4 main blocks and 1 module block; a layout places it.
  const std::string text = R"(layers:
  - {name: tokens, kind: input, shape: [128]}
  - {name: words, kind: embedding, vocabulary: 1000, dim: 64}
  - {name: b0, kind: transformer_block, heads: 4}
  - {name: b1, kind: transformer_block, heads: 4}
  - {name: b2, kind: transformer_block, heads: 4}
  - {name: b3, kind: transformer_block, heads: 4}
  - {name: norm, kind: layernorm}
  - {name: head, kind: linear, in_features: 64, out_features: 1000, bias: false}
  - {name: mtp_norm, kind: layernorm, inputs: [b3], multi_token_prediction: true}
  - {name: mtp_proj, kind: linear, in_features: 64, out_features: 64, bias: false, multi_token_prediction: true}
  - {name: mtp_block, kind: transformer_block, heads: 4, multi_token_prediction: true}
  - {name: mtp_head, kind: linear, in_features: 64, out_features: 1000, bias: false, tied_to: head,
     multi_token_prediction: true}
)";
  Result<Workload> w = input::load_model_text(text, "mtp.yaml", std::nullopt);
  REQUIRE_MESSAGE(w.ok(), w.error().message);
  int main_blocks = 0, modules = 0, marked = 0;
  for (size_t i = 0; i < w->layer_count(); ++i) {
    const Layer& l = w->layer(i);
    main_blocks += is_layout_block(l);
    modules += is_block(l.split.kind) && l.multi_token_prediction;
    marked += l.multi_token_prediction;
    CHECK(l.multi_token_prediction == (l.name.rfind("mtp_", 0) == 0));
  }
  CHECK(main_blocks == 4);
  CHECK(modules == 1);
  CHECK(marked == 4);
  MegatronSplit split;
  split.layout = "Ett|ttmL";
  CHECK(megatron_layout(main_blocks, 2, 1, "1f1b", split, modules).blocks == std::vector<int>{2, 2});
  // A block outside the module that depends on a marked layer: refused at the mark.
  std::string early = text;
  early.replace(early.find("{name: b3, kind: transformer_block, heads: 4}"), 45,
                "{name: b3, kind: transformer_block, heads: 4, inputs: [mtp_norm]}");
  early.replace(early.find("inputs: [b3], multi_token_prediction"), 12, "inputs: [b2]");
  Result<Workload> bad = input::load_model_text(early, "mtp.yaml", std::nullopt);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find(
            "expected a layer after the model's transformer blocks (Megatron-Core runs the "
            "multi-token-prediction modules after the last), got one that block \"b3\" "
            "depends on") != std::string::npos);
}
