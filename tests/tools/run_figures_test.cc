// run's tokens/s, model FLOP/s, MFU and time to train against Megatron-Core's own formula; the memory
// reserve (default, --memory-margin, errors); the assumptions line; timeline rows and windows.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tests/support/approx.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"
#include "tools/output/report.h"

using nlohmann::json;
using pipegrid::testing::read_file;
using pipegrid::testing::run_command;
using pipegrid::testing::TempDir;

namespace {

bool close(double a, double b, double rel) {
  return std::abs(a - b) <= rel * std::abs(b);
}

json run_json(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {PIPEGRID_BINARY, "run"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--json");
  auto r = run_command(argv);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  return json::parse(r.out);
}

// A column of a CSV (header included), as a set of values.
std::set<std::string> column(const std::string& csv, size_t index) {
  std::set<std::string> out;
  std::stringstream in(csv);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::stringstream l(line);
    std::string cell;
    for (size_t i = 0; i <= index && std::getline(l, cell, ','); ++i) {
    }
    out.insert(cell);
  }
  return out;
}

// A chain on four H100s, two stages of two replicas: the catalog GPU gets the default reserve.
const char* kChain = R"(
workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 1GiB, parameters: 1GiB,
           samples_per_micro_batch: 2}
cluster: {kind: switch, count: 4, device: {name: gpu, model: h100}, bandwidth: 100GBps, latency: 1us}
strategy: {micro_batches: 4, replicas: 2, stages: 2}
)";

// A chain of `layers` layers (F 1 ms, B 2 ms, 8 MiB activations, 64 MiB parameters each) on four
// hand-described GPUs (no memory bandwidth) behind one switch, 1F1B over 8 micro-batches, with the
// `memory` mapping's keys.
std::string chain_on_switch(const TempDir& tmp, const std::string& name, int layers,
                            const std::string& memory) {
  return tmp.write(
      name, fmt::format("workload: {{kind: chain, layers: {}, forward: 1ms, backward: 2ms, activation: "
                        "8MiB, parameters: 64MiB}}\ncluster: {{kind: switch, count: 4, device: {{name: "
                        "gpu, memory: 16GiB}}, bandwidth: 25GBps, latency: 1us}}\nstrategy: {{schedule: "
                        "1f1b, micro_batches: 8}}\nmemory: {{{}}}\n",
                        layers, memory));
}

}  // namespace

TEST_CASE("run: tokens/s, model FLOP/s per GPU, MFU and time to train equal Megatron-Core's count") {
  // GPT 1.7B on 48 H100s (experiments/megatron): h100.py's flops_per_iteration, Megatron-Core r0.8.0's
  // num_floating_point_operations, 12 B s l h^2 (6 + s/h + V/(2 l h)), written out here again.
  const std::string e = std::string(PIPEGRID_SOURCE_DIR) + "/experiments/megatron/h100-1.7b.yaml";
  const json j = run_json({e, "--tokens", "1e12"});
  const double B = 192, s = 4096, l = 24, h = 2048, V = 131072, gpus = 48;
  const double flops = 12 * B * s * l * h * h * (6 + s / h + V / (2 * l * h));
  const double time = j["iteration_time_s"].get<double>();
  const json& f = j["model_flops"];
  CHECK(f["moe"] == false);
  CHECK(f["devices"].get<double>() == gpus);
  CHECK(close(f["tokens_per_s"].get<double>(), B * s / time, 1e-12));
  CHECK(close(f["tokens_per_s_per_device"].get<double>(), B * s / time / gpus, 1e-12));
  // Megatron's count leaves out the biases and norms: 13 h per block of 12 h^2 + 13 h (5e-4 here).
  CHECK(close(f["model_flops_per_s_per_device"].get<double>(), flops / time / gpus, 1e-3));
  CHECK_FALSE(close(f["model_flops_per_s_per_device"].get<double>(), flops / time / gpus, 1e-6));
  CHECK(f["peak_precision"] == "bf16");
  CHECK(f["peak_flops_per_device"].get<double>() == 989e12);
  CHECK(close(f["mfu"].get<double>(), flops / time / gpus / 989e12, 1e-3));
  CHECK(close(f["time_to_train_s"].get<double>(), 1e12 / (B * s / time), 1e-12));
  // The text: the same figures, the formula, the budget.
  auto text = run_command({PIPEGRID_BINARY, "run", e, "--tokens", "15e12"});
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("\ntokens           ") != std::string::npos);
  CHECK(text.out.find("\nmodel FLOP/s     ") != std::string::npos);
  CHECK(text.out.find("6 N + 12 L h s = ") != std::string::npos);
  CHECK(text.out.find("\ntime to train    1.5e+13 tokens in ") != std::string::npos);
  CHECK(text.out.find(
            "  assumes    FlashAttention, Megatron's fused element-wise kernels, multi-ring data-parallel "
            "all-reduce, memory reserve 4.982 GiB per device (default: 1 GiB + 5% per GPU; "
            "--memory-margin), gradients reduced at 4 bytes per parameter and kept at that size "
            "(Megatron-Core's "
            "gradient buffer in the reduce's precision), micro-batches' weight gradients "
            "accumulated inside the weight-gradient GEMMs (grad_accumulation: fused), host 13.48 us per "
            "kernel launch, "
            "issued ahead of the GPU (kernel_dispatch; 0 for a run under a CUDA graph)\n") !=
        std::string::npos);
  // The H100's host time per launch (the catalog's, from NVIDIA/TransformerEngine#2053).
  REQUIRE(j["assumptions"]["kernel_dispatch_s"].size() == 1);
  CHECK(j["assumptions"]["kernel_dispatch_s"][0].get<double>() == pipegrid::testing::approx(13.48e-6));
  CHECK(j["assumptions"]["fused_attention"] == "all");
  CHECK(j["assumptions"]["allreduce"] == "multi-ring");
  CHECK(j["assumptions"]["gradient_reduce_bytes"] == 4);
  CHECK(j["assumptions"]["grad_accumulation"] == "fused");
  CHECK(j["assumptions"]["optimizer_moment_bytes"].is_null());
  CHECK(j["assumptions"]["master_weight_bytes"].is_null());
  CHECK(j["assumptions"]["activation_fp8_input_store"] == false);
  // GPT's GELU MLP is not gated: Megatron-Core's fp8 input store has nothing to store, and says so.
  auto store = run_command({PIPEGRID_BINARY, "run", e, "--set", "memory.activation_fp8_input_store=true"});
  REQUIRE(store.exit_code == 0);
  CHECK(store.out.find("activation_fp8_input_store changes nothing: no gated MLP") != std::string::npos);
}

TEST_CASE("run: a workload without transformer blocks has no token figures") {
  TempDir tmp;
  const json j = run_json({tmp.write("c.yaml", kChain)});
  CHECK(j["model_flops"].is_null());
  auto text = run_command({PIPEGRID_BINARY, "run", tmp.write("c2.yaml", kChain)});
  CHECK(text.out.find("model FLOP/s") == std::string::npos);
  CHECK(
      text.out.find("  assumes    data-parallel all-reduce as NCCL 2.21.5's model picks it (tree or ring per "
                    "NIC, per call; reduce-scatter: ring per NIC), memory reserve") != std::string::npos);
}

TEST_CASE("memory reserve: 1 GiB + 5% of a GPU by default, --memory-margin, applied to feasibility") {
  TempDir tmp;
  const std::string e = tmp.write("c.yaml", kChain);
  const json by_default = run_json({e});
  // The H100's memory: nvidia-smi's total, 81,559 MiB (topologies/devices.yaml, its sources).
  const double memory = 81559.0 * 1024 * 1024, reserve = 1024.0 * 1024 * 1024 + 0.05 * memory;
  for (const json& d : by_default["devices"]) {
    CHECK(d["memory_reserve_bytes"].get<double>() == reserve);
    CHECK(d["capacity_bytes"].get<double>() == memory - reserve);
  }
  CHECK(by_default["assumptions"]["memory_reserve_default"] == true);
  const json none = run_json({e, "--memory-margin", "0"});
  CHECK(none["devices"][0]["capacity_bytes"].get<double>() == memory);
  CHECK(none["assumptions"]["memory_reserve_default"] == false);
  // The same run, so the same peak; a margin that leaves 1 MiB less than the peak makes it infeasible.
  const double peak = none["peak_memory_bytes"].get<double>();
  CHECK(by_default["peak_memory_bytes"].get<double>() == peak);
  const double mib = 1024.0 * 1024;
  const std::string tight = std::to_string(static_cast<long long>(memory - peak + mib)) + "B";
  const std::string loose = std::to_string(static_cast<long long>(memory - peak - mib)) + "B";
  CHECK(run_json({e, "--memory-margin", tight})["feasible"] == false);
  CHECK(run_json({e, "--memory-margin", loose})["feasible"] == true);
  CHECK(run_json({e, "--set", "memory.reserve=" + tight})["feasible"] == false);
  // A custom device (no family) has no default reserve.
  const json custom = run_json({tmp.write("u.yaml", R"(
workload: {kind: chain, layers: 2, forward: 1ms, backward: 2ms, activation: 1KiB, parameters: 1MiB}
cluster: {kind: switch, count: 2, device: {name: gpu, memory: 16GiB}, bandwidth: 10GBps, latency: 1us}
strategy: {micro_batches: 2}
)")});
  CHECK(custom["devices"][0]["capacity_bytes"].get<double>() == 16.0 * 1024 * mib);
  // A reserve above a device's memory: located error, exit 2.
  auto bad = run_command({PIPEGRID_BINARY, "run", e, "--memory-margin", "100GB"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("leaves nothing of device \"gpu0\"") != std::string::npos);
  // It names the option given, not the --set it stands for (until 2026-12-05: "--set memory.reserve=").
  CHECK(bad.err.rfind("pipegrid: --memory-margin 100GB: memory.reserve: ", 0) == 0);
  auto plan = run_command({PIPEGRID_BINARY, "plan", e, "--memory-margin", tight});
  CHECK(plan.exit_code == 0);
  CHECK(plan.out.find("INFEASIBLE") != std::string::npos);
  // The summary names the group over capacity as a range: stage 0 (gpu0-1) holds the peak.
  auto text = run_command({PIPEGRID_BINARY, "run", e, "--memory-margin", tight});
  CHECK(text.out.find("\nINFEASIBLE: 2 devices over capacity: gpu0-1 (stage 0) need up to ") !=
        std::string::npos);
  auto each = run_command({PIPEGRID_BINARY, "run", e, "--memory-margin", tight, "--devices", "all"});
  CHECK(each.out.find("\nINFEASIBLE: gpu0 needs ") != std::string::npos);
}

TEST_CASE(
    "timelines: --timeline-rows ranks keeps one device per stage, --timeline-window the micro-batches") {
  TempDir tmp;
  const std::string e = tmp.write("c.yaml", kChain);
  const std::string tasks = (tmp.path / "t.csv").string(), memory = (tmp.path / "m.csv").string();
  auto all = run_command({PIPEGRID_BINARY, "run", e, "--tasks", tasks, "--memory", memory});
  REQUIRE(all.exit_code == 0);
  CHECK(column(read_file(tasks), 0) == std::set<std::string>{"gpu0", "gpu1", "gpu2", "gpu3"});
  CHECK(column(read_file(tasks), 3) == std::set<std::string>{"-1", "0", "1", "2", "3"});
  // Stage 0 on gpu0-1, stage 1 on gpu2-3: ranks are gpu0 and gpu2.
  auto ranks = run_command({PIPEGRID_BINARY, "run", e, "--tasks", tasks, "--memory", memory,
                            "--timeline-rows", "ranks", "--timeline-window", "1:2"});
  REQUIRE(ranks.exit_code == 0);
  CHECK(column(read_file(tasks), 0) == std::set<std::string>{"gpu0", "gpu2"});
  CHECK(column(read_file(tasks), 3) == std::set<std::string>{"1", "2"});
  CHECK(column(read_file(memory), 0) == std::set<std::string>{"gpu0", "gpu2"});
  // The window reaching the last micro-batch keeps the per-iteration tasks.
  REQUIRE(run_command({PIPEGRID_BINARY, "run", e, "--tasks", tasks, "--timeline-window", "3:3"}).exit_code ==
          0);
  CHECK(column(read_file(tasks), 3) == std::set<std::string>{"-1", "3"});
  for (const char* bad : {"2:1", "x", "1:", "-1:2"}) {
    auto r = run_command({PIPEGRID_BINARY, "run", e, "--timeline-window", bad});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--timeline-window") != std::string::npos);
  }
  // A window past the plan's 4 micro-batches held none of them, and either option without a per-task
  // output shaped nothing: both ran silently until 2026-12-05.
  auto past = run_command({PIPEGRID_BINARY, "run", e, "--tasks", tasks, "--timeline-window", "4:9"});
  CHECK(past.exit_code == 2);
  CHECK(past.err.find("the plan runs micro-batches 0 to 3") != std::string::npos);
  for (const std::vector<std::string>& alone : {std::vector<std::string>{"--timeline-window", "0:1"},
                                                std::vector<std::string>{"--timeline-rows", "ranks"}}) {
    auto r = run_command({PIPEGRID_BINARY, "run", e, alone[0], alone[1]});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(alone[0] + " shapes the outputs of --trace, --tasks, --memory and --plot") !=
          std::string::npos);
  }
}

TEST_CASE("the tasks and memory CSVs quote a device name holding a comma, as RFC 4180 does") {
  // A cluster may name its devices "g,pu0": unquoted, every row of those files had a column too many.
  TempDir tmp;
  const std::string e = tmp.write(
      "comma.yaml",
      "workload: {kind: chain, layers: 2, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 1MiB}\n"
      "cluster: {kind: switch, count: 2, device: {name: \"g,pu\", memory: 16GiB}, bandwidth: 10GBps, "
      "latency: 1us}\nstrategy: {stages: 2, micro_batches: 2}\n");
  const std::string tasks = (tmp.path / "t.csv").string(), memory = (tmp.path / "m.csv").string();
  REQUIRE(run_command({PIPEGRID_BINARY, "run", e, "--tasks", tasks, "--memory", memory}).exit_code == 0);
  const std::string t = read_file(tasks), m = read_file(memory);
  CHECK(t.find("\n\"g,pu0\",0,forward,0,0,0.001,,\n") != std::string::npos);
  CHECK(t.find(",\"g,pu1\",1048576\n") != std::string::npos);  // a transfer's peer
  CHECK(m.find("\n\"g,pu0\",0,") != std::string::npos);
  CHECK(pipegrid::output::csv_field("plain") == "plain");
  CHECK(pipegrid::output::csv_field("say \"hi\"") == "\"say \"\"hi\"\"\"");
}

TEST_CASE("search: its 6 N MFU and Megatron's model-FLOPs MFU beside it, both counted by hand") {
  TempDir tmp;
  const std::string e = tmp.write("gpt.yaml", R"(
workload: {model: gpt, layers: 8, hidden: 1024, heads: 16, sequence: 2048, vocabulary: 32768, precision: amp-bf16}
cluster: {preset: dgx-h100-16}
strategy: {partitioner: megatron, schedule: 1f1b, micro_batch_size: 1, global_batch: 32}
memory: {optimizer: mixed-adam}
)");
  auto r = run_command({PIPEGRID_BINARY, "search", e, "--global-batch", "32", "--top", "1",
                        "--tensor-parallel", "1", "--pipeline", "2", "--json"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const json best = json::parse(r.out)["simgrid_ranking"][0];
  const double L = 8, h = 1024, s = 2048, V = 32768, n = 16, peak = 989e12, tokens = 32 * s;
  const double time = best["simulated_iteration_time_s"].get<double>();
  // GPT blocks 12 h^2 + 13 h, the tied head V h; every parameter adds the positions s h and the final
  // LayerNorm 2 h (the head has none of its own).
  const double active = L * (12 * h * h + 13 * h) + V * h, total = active + s * h + 2 * h;
  CHECK(close(best["simulated_mfu"].get<double>(), 6 * total * tokens / (time * n * peak), 1e-12));
  CHECK(close(best["simulated_model_flops_mfu"].get<double>(),
              (6 * active + 12 * L * h * s) * tokens / (time * n * peak), 1e-12));
  auto text = run_command({PIPEGRID_BINARY, "search", e, "--global-batch", "32", "--top", "1",
                           "--tensor-parallel", "1", "--pipeline", "2"});
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("\nMFU       6 N x tokens / (time x devices x peak)") != std::string::npos);
  CHECK(text.out.find("\nMFU(Meg)  (6 N + 12 L h s) x tokens / (time x devices x peak)") !=
        std::string::npos);
}

TEST_CASE("run: under allreduce nccl the output says which algorithm NCCL's model picked, per size") {
  // 16 DGX A100 nodes, one replica per GPU (d = 128 across 16 machines, 8 rings per NIC): 4 KiB of
  // gradients are latency-bound, where NCCL's model has the tree at 2 (7 x 0.6 + 4 x 5.0) + 6.8 = 55.2
  // us against the ring's 315 us (hand arithmetic, tests/core/collectives_test.cc), and it picks the
  // tree; 4 GiB are bandwidth-bound, past the tree's correction table, and it picks the ring.
  TempDir tmp;
  auto yaml = [](const char* parameters) {
    return fmt::format(R"(
workload: {{kind: chain, layers: 1, forward: 1ms, backward: 2ms, activation: 1KiB, parameters: {},
           samples_per_micro_batch: 128}}
cluster: {{preset: dgx-a100-1024}}
strategy: {{micro_batches: 1, replicas: 128, stages: 1}}
)",
                       parameters);
  };
  auto small = run_command({PIPEGRID_BINARY, "run", tmp.write("small.yaml", yaml("4KiB"))});
  CHECK(
      small.out.find("  nccl       the tree for 1 of 1 data-parallel all-reduces, the ring per NIC for 0") !=
      std::string::npos);
  auto large = run_command({PIPEGRID_BINARY, "run", tmp.write("large.yaml", yaml("4GiB"))});
  CHECK(
      large.out.find("  nccl       the tree for 0 of 1 data-parallel all-reduces, the ring per NIC for 1") !=
      std::string::npos);
  const json j = run_json({tmp.write("j.yaml", yaml("4KiB"))});
  CHECK(j["nccl_allreduces"]["tree"] == 1);
}

TEST_CASE("recompute_modules: moe_act takes the experts' activation output out of the stash, by hand") {
  // Two Mixtral-like MoE blocks (top-2 of 8 experts of FFN 512, sequence 256) on 8 GPUs at ep 8, amp:
  // a device's experts receive top_k x s = 512 token copies per sample; moe_act discards the
  // activation's output, 512 copies x 512 x 2 bytes per block. The stash after the forward falls by
  // both blocks' share; the backward re-materialises one block's at a time, so the peak falls by one.
  TempDir tmp;
  auto experiment = [&](const std::string& name, const std::string& modules) {
    return tmp.write(name, R"(
workload: {model: mixtral-8x7b, layers: 2, hidden: 512, heads: 8, kv_heads: 4, ffn: 1024, expert_ffn: 512,
           sequence: 256, vocabulary: 1024, precision: amp}
cluster: {preset: dgx-h100-8}
strategy: {partitioner: megatron, replicas: 8, expert_parallel: 8, micro_batch_size: 1, micro_batches: 2}
memory: {recompute: selective, recompute_modules: )" +
                               modules + "}\n");
  };
  const json none = run_json({experiment("none.yaml", "[]")});
  const json act = run_json({experiment("act.yaml", "[moe_act]")});
  const double block = 2 * 256 * 512 * 2.0;
  CHECK(none["devices"][0]["peak_activation_bytes"].get<double>() -
            act["devices"][0]["peak_activation_bytes"].get<double>() ==
        block);
  CHECK(act["iteration_time_s"].get<double>() > none["iteration_time_s"].get<double>());  // the re-run
  CHECK(act["assumptions"]["recompute_modules"] == "moe_act");
  CHECK(none["assumptions"]["recompute_modules"] == "none");
  auto text = run_command({PIPEGRID_BINARY, "run", experiment("text.yaml", "[moe_act, layernorm]")});
  CHECK(text.out.find("selective recomputation of moe_act, layernorm (Megatron-Core's recompute_modules)") !=
        std::string::npos);
  // A planner with its own memory model searches with core_attn alone, and says so.
  auto luo = run_command({PIPEGRID_BINARY, "run", tmp.write("luo.yaml", R"(
workload: {model: gpt, layers: 8, hidden: 1024, heads: 16, sequence: 1024, vocabulary: 51200, precision: amp}
cluster: {preset: dgx-a100-16}
strategy: {planner: luo, mini_batch: 16}
memory: {optimizer: mixed-adam, recompute: selective, recompute_modules: [core_attn, mlp]}
)")});
  CHECK(luo.exit_code == 0);
  CHECK(luo.err.find("planner luo searches with selective recomputation of core_attn alone") !=
        std::string::npos);
}

TEST_CASE("run: the host's share of the stages' compute is stated where a host bounds launches") {
  // A small GPT on one H100 (its catalog host: 13.48 us per launch). With a host that takes 1 s per
  // launch, every launch after a pass's first waits for it: nearly all of the compute is the host's.
  // Under a CUDA graph (kernel_dispatch 0) no host bounds a launch and nothing is stated.
  TempDir tmp;
  auto exp = [&](const std::string& name, const std::string& dispatch) {
    return tmp.write(
        name,
        "workload: {model: gpt, layers: 2, hidden: 1024, heads: 16, sequence: 1024, vocabulary: "
        "51200, precision: amp-bf16}\ncluster: {kind: switch, count: 1, device: {name: gpu, model: h100" +
            dispatch + "}, bandwidth: 100GBps, latency: 1us}\nstrategy: {stages: 1, micro_batches: 2}\n");
  };
  const json slow = run_json({exp("slow.yaml", ", kernel_dispatch: 1s")});
  const json catalog = run_json({exp("catalog.yaml", "")});
  const json graph = run_json({exp("graph.yaml", ", kernel_dispatch: 0us")});
  REQUIRE(slow.contains("host_bound_fraction"));
  CHECK(slow["host_bound_fraction"].get<double>() > 0.999);
  CHECK(slow["host_bound_fraction"].get<double>() < 1);
  REQUIRE(catalog.contains("host_bound_fraction"));
  CHECK(catalog["host_bound_fraction"].get<double>() > 0);
  CHECK(catalog["host_bound_fraction"].get<double>() < slow["host_bound_fraction"].get<double>());
  CHECK_FALSE(graph.contains("host_bound_fraction"));
  auto text = run_command({PIPEGRID_BINARY, "run", exp("text.yaml", ", kernel_dispatch: 1s")});
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("\nhost bound       ") != std::string::npos);
  auto none = run_command({PIPEGRID_BINARY, "run", exp("none.yaml", ", kernel_dispatch: 0us")});
  CHECK(none.out.find("host bound") == std::string::npos);
}

TEST_CASE("run: an MoE zoo model's fused defaults can be turned off, and the assumes line says so") {
  // The MoE zoo builds its blocks as Megatron-Core runs them (FlashAttention, Megatron's fusions);
  // `attention: unfused` and `kernel_fusion: none` rebuild them, and a host time for one kernel class
  // is stated beside the others'.
  TempDir tmp;
  const std::string base =
      "cluster: {kind: dgx, nodes: 1, gpus_per_node: 8, gpu: {model: b200, kernel_dispatch: {grouped-gemm: "
      "60us}}}\nstrategy: {stages: 1, replicas: 8, expert_parallel: 8, micro_batch_size: 1, micro_batches: "
      "2}\n";
  const std::string plain =
      tmp.write("plain.yaml",
                "workload: {model: qwen3-30b-a3b, sequence: 1024, precision: amp-bf16, layers: 2, "
                "attention: unfused, kernel_fusion: none}\n" +
                    base);
  const std::string zoo =
      tmp.write("zoo.yaml",
                "workload: {model: qwen3-30b-a3b, sequence: 1024, precision: amp-bf16, layers: 2}\n" + base);
  const json p = run_json({plain});
  const json z = run_json({zoo});
  CHECK(p["assumptions"]["fused_attention"] == "none");
  CHECK(p["assumptions"]["megatron_fusion"] == "none");
  CHECK(z["assumptions"]["fused_attention"] == "all");
  CHECK(z["assumptions"]["megatron_fusion"] == "all");
  CHECK(z["assumptions"]["kernel_dispatch_classes"] == json::array({"grouped-gemm 60 us"}));
  CHECK(p["iteration_time_s"].get<double>() > z["iteration_time_s"].get<double>());
  auto text = run_command({PIPEGRID_BINARY, "run", plain});
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("unfused attention (workload attention: fused for FlashAttention), no kernel fusion") !=
        std::string::npos);
  CHECK(text.out.find("host 13.48 us per kernel launch (grouped-gemm 60 us), issued ahead") !=
        std::string::npos);
}

TEST_CASE("run: GPT-OSS's experts fused by Transformer Engine's op fuser drop the eager bias and clamp") {
  // moe: {fused_grouped_mlp: true} takes the eager kernels of fc2's bias and the clamped GLU away
  // (core/block_kernels.cc): faster, and the experts line and JSON say so.
  TempDir tmp;
  const std::string base =
      "workload: {model: gpt-oss-120b, sequence: 1024, precision: amp-bf16, layers: 2}\n"
      "cluster: {kind: dgx, nodes: 1, gpus_per_node: 8, gpu: b200}\n"
      "strategy: {stages: 1, replicas: 8, expert_parallel: 8, micro_batch_size: 1, micro_batches: 2";
  const std::string eager = tmp.write("eager.yaml", base + "}\n");
  const std::string fused = tmp.write("fused.yaml", base + ", moe: {fused_grouped_mlp: true}}\n");
  const json e = run_json({eager});
  const json f = run_json({fused});
  CHECK(e["parallelism"]["experts"]["fused_grouped_mlp"] == false);
  CHECK(f["parallelism"]["experts"]["fused_grouped_mlp"] == true);
  CHECK(e["parallelism"]["experts"]["eager_expert_work"] == "fc2's bias and the GLU's clamp");
  CHECK(f["parallelism"]["experts"]["eager_expert_work"] == "");
  CHECK(f["iteration_time_s"].get<double>() < e["iteration_time_s"].get<double>());
  auto text = run_command({PIPEGRID_BINARY, "run", fused});
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("experts' MLP fused by Transformer Engine's op fuser (no eager bias or clamp)") !=
        std::string::npos);
  // The op fuser's activation is Transformer Engine's kernel, not torch.compile's.
  CHECK(text.out.find("kernel class compiled") == std::string::npos);
  // Without it the experts line says what runs eagerly, also at ep 1 (no expert parallelism to report).
  const std::string one =
      tmp.write("one.yaml",
                "workload: {model: gpt-oss-120b, sequence: 1024, precision: amp-bf16, layers: 2}\n"
                "cluster: {kind: dgx, nodes: 1, gpus_per_node: 8, gpu: b200}\n"
                "strategy: {stages: 1, replicas: 8, micro_batch_size: 1, micro_batches: 2}\n");
  auto eager_text = run_command({PIPEGRID_BINARY, "run", one});
  REQUIRE(eager_text.exit_code == 0);
  CHECK(
      eager_text.out.find("fc2's bias and the GLU's clamp in eager PyTorch kernels as Megatron-Core's "
                          "TEGroupedMLP runs them, those off its vectorised path of kernel class strided") !=
      std::string::npos);
  CHECK(eager_text.out.find("weighted activation by torch.compile (kernel class compiled)") !=
        std::string::npos);
  // At ep 1 (no expert-parallel stage) the options still reach the blocks' kernels: the op fuser
  // is faster, an unfused router slower (they were silently ignored there).
  const std::string one_base =
      "workload: {model: gpt-oss-120b, sequence: 1024, precision: amp-bf16, layers: 2}\n"
      "cluster: {kind: dgx, nodes: 1, gpus_per_node: 8, gpu: b200}\n"
      "strategy: {stages: 1, replicas: 8, micro_batch_size: 1, micro_batches: 2";
  const double plain = run_json({one})["iteration_time_s"].get<double>();
  CHECK(run_json({tmp.write("one_fused.yaml",
                            one_base + ", moe: {fused_grouped_mlp: true}}\n")})["iteration_time_s"]
            .get<double>() < plain);
  CHECK(run_json(
            {tmp.write("one_router.yaml", one_base + ", moe: {router_fusion: false}}\n")})["iteration_time_s"]
            .get<double>() > plain);
}

TEST_CASE(
    "run: expert tensor parallelism without expert parallelism, and copies dropped at ep 1, are reported") {
  // ep 1, etp 2 under t 2: the expert tensor-parallel collectives are the expert groups' own flows, so
  // the breakdown carries them (it is a partition of the iteration: its terms sum to it) and the
  // experts line appears; until 2026-12-05 they were in neither.
  TempDir tmp;
  const std::string etp =
      tmp.write("etp.yaml",
                "workload: {model: mixtral-8x7b, layers: 2, sequence: 1024, precision: amp-bf16}\n"
                "cluster: {preset: dgx-h100-8}\n"
                "strategy: {partitioner: megatron, tensor_parallel: 2, sequence_parallel: true, "
                "expert_tensor_parallel: 2, "
                "stages: 1, replicas: 4, micro_batch_size: 1, micro_batches: 2}\n");
  const json j = run_json({etp});
  const json& b = j["breakdown"];
  REQUIRE(b.contains("expert_parallel_s"));
  CHECK(b["expert_parallel_s"].get<double>() > 0);
  double sum = 0;
  for (const auto& [k, v] : b.items()) sum += v.get<double>();
  CHECK(sum == pipegrid::testing::approx(j["iteration_time_s"].get<double>()));
  auto text = run_command({PIPEGRID_BINARY, "run", etp});
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("exposed expert-TP collectives") != std::string::npos);
  CHECK(text.out.find("experts          8 per device (ep 1, etp 2)") != std::string::npos);
  // A capacity factor of 0.5 under balanced routing drops half of the copies (each expert keeps cf x
  // its share): stated on the experts line and beside the model FLOPs, whose N still counts them.
  const std::string cf = tmp.write(
      "cf.yaml",
      "workload: {model: mixtral-8x7b, layers: 2, sequence: 1024, precision: amp-bf16}\n"
      "cluster: {preset: dgx-h100-8}\n"
      "strategy: {partitioner: megatron, stages: 1, replicas: 8, micro_batch_size: 1, micro_batches: 2, "
      "moe: {capacity_factor: 0.5}}\n");
  const json c = run_json({cf});
  CHECK(c["model_flops"]["dropped_copies"].get<double>() == pipegrid::testing::approx(0.5));
  auto cf_text = run_command({PIPEGRID_BINARY, "run", cf});
  REQUIRE(cf_text.exit_code == 0);
  CHECK(cf_text.out.find("capacity factor 0.5 (50.00% of the token copies dropped)") != std::string::npos);
  CHECK(cf_text.out.find("N counts every routed copy, the 50.00% a capacity factor drops included") !=
        std::string::npos);
}

TEST_CASE("run: the experts line at ep 1, a skew that moves no work, and the allgather dispatcher's label") {
  // Every MoE workload gets the experts line. At ep 1 every device runs every expert, so a skewed
  // routing without a capacity factor gives exactly the balanced run's time, and the line says so.
  TempDir tmp;
  const std::string base =
      "workload: {model: mixtral-8x7b, layers: 2, sequence: 1024, precision: amp-bf16}\n"
      "cluster: {preset: dgx-h100-8}\n"
      "strategy: {partitioner: megatron, stages: 1, replicas: 8, micro_batch_size: 1, micro_batches: 2";
  const std::string balanced = tmp.write("b.yaml", base + "}\n");
  const std::string skewed = tmp.write("s.yaml", base + ", moe: {routing: {zipf: 1.2}}}\n");
  CHECK(run_json({skewed})["iteration_time_s"] == run_json({balanced})["iteration_time_s"]);
  auto b = run_command({PIPEGRID_BINARY, "run", balanced});
  REQUIRE(b.exit_code == 0);
  CHECK(b.out.find("experts          8 per device (ep 1, etp 1), alltoall dispatcher") != std::string::npos);
  auto s = run_command({PIPEGRID_BINARY, "run", skewed});
  REQUIRE(s.exit_code == 0);
  CHECK(s.out.find("routing as given (at ep 1 every device runs every expert: the skew moves no work, and "
                   "without a capacity factor drops nothing)") != std::string::npos);
  // The allgather dispatcher's exchanges are an all-gather and a reduce-scatter, and the breakdown
  // names them so (it called them an all-to-all).
  const std::string ag = tmp.write("ag.yaml", base + ", expert_parallel: 8, moe: {dispatcher: allgather}}\n");
  auto a = run_command({PIPEGRID_BINARY, "run", ag});
  REQUIRE(a.exit_code == 0);
  CHECK(a.out.find("exposed EP all-gather and reduce-scatter") != std::string::npos);
  CHECK(a.out.find("EP all-to-all") == std::string::npos);
}

TEST_CASE("run: a hand-described device without a memory bandwidth is said to run memory-bound work free") {
  // {name, memory, flops} computes at flops with efficiency 1 and, without memory_bandwidth, costs no
  // memory traffic: a GPT's element-wise kernels and norms took no time, with nothing said.
  TempDir tmp;
  const std::string gpt =
      "workload: {model: gpt, layers: 2, hidden: 512, heads: 8, sequence: 256, vocabulary: 1024}\n"
      "strategy: {micro_batches: 2}\n";
  auto bare = run_command(
      {PIPEGRID_BINARY, "run",
       tmp.write("bare.yaml", gpt + "cluster: {kind: switch, count: 1, device: {name: g, memory: "
                                    "16GiB, flops: 100TFLOPS}, bandwidth: 10GBps, latency: 1us}\n")});
  REQUIRE(bare.exit_code == 0);
  CHECK(bare.out.find(
            "memory-bound work (element-wise kernels, norms, a layer's memory traffic) in no time on the "
            "1 device without a memory_bandwidth (g0;") != std::string::npos);
  auto with = run_command(
      {PIPEGRID_BINARY, "run",
       tmp.write("with.yaml",
                 gpt + "cluster: {kind: switch, count: 1, device: {name: g, memory: 16GiB, flops: "
                       "100TFLOPS, memory_bandwidth: 1TBps}, bandwidth: 10GBps, latency: 1us}\n")});
  REQUIRE(with.exit_code == 0);
  CHECK(with.out.find("memory-bound work") == std::string::npos);
}

TEST_CASE("run: a split-backward schedule on a workload without a weight-gradient part is warned about") {
  // zb-h1 on a chain without backward_weight ran 1F1B's time under zb-h1's name, W actions of 0 s.
  TempDir tmp;
  const std::string e = tmp.write(
      "zb.yaml",
      "workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 1MiB}\n"
      "cluster: {kind: switch, count: 4, device: {name: gpu, memory: 16GiB}, bandwidth: 10GBps, latency: "
      "1us}\n"
      "strategy: {stages: 4, micro_batches: 8, schedule: zb-h1}\n");
  auto r = run_command({PIPEGRID_BINARY, "run", e});
  REQUIRE(r.exit_code == 0);
  CHECK(
      r.err.find("warning: schedule zb-h1 splits each backward into input and weight gradients, and no layer "
                 "of the workload has a weight-gradient part") != std::string::npos);
  auto w = run_command({PIPEGRID_BINARY, "run", e, "--set", "workload.backward_weight=1ms"});
  REQUIRE(w.exit_code == 0);
  CHECK(w.err.find("weight-gradient part") == std::string::npos);
}

TEST_CASE("run: planners cost a fault's slow device, a partitioner that plans without it says so") {
  // dapple cut 8 layers into 4 stages of 2, one on gpu3 at 4x (210.6 ms): its estimate had no slow
  // device. Now each device's pass times are times its slowdown (device_layer_times), as replayed.
  TempDir tmp;
  const std::string base =
      "workload: {kind: chain, layers: 8, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 1MiB}\n"
      "cluster: {kind: switch, count: 4, device: {name: gpu, memory: 16GiB}, bandwidth: 10GBps, latency: "
      "1us}\n"
      "faults: {slow_devices: [{device: gpu3, factor: 4}]}\n";
  // balanced, 4 stages of a chain of 3 ms layers (1 + 2) with gpu3 at 12 ms a layer: the least slowest
  // stage is 12 ms (gpu3 must hold a layer), and the earliest cuts reaching it are 2, 3, 2 and 1 layers.
  const json b = run_json(
      {tmp.write("b.yaml", base + "strategy: {partitioner: balanced, stages: 4, micro_batches: 8}\n")});
  REQUIRE(b["stages"].size() == 4);
  std::vector<size_t> layers;
  for (const json& st : b["stages"]) layers.push_back(st["layers"].size());
  CHECK(layers == std::vector<size_t>{2, 3, 2, 1});
  CHECK(b["stages"][3]["devices"][0] == "gpu3");
  CHECK(b["warnings"].empty());
  // The stage table gives gpu3's one layer as replayed: 4 x (1 + 2) ms (it showed 1 and 2 ms until
  // 2026-12-05).
  auto bt = run_command({PIPEGRID_BINARY, "run", tmp.path.string() + "/b.yaml"});
  REQUIRE(bt.exit_code == 0);
  CHECK(bt.out.find("3      layer7                    gpu3          4 ms       8 ms") != std::string::npos);
  // dapple fills the devices from the last, so gpu3 holds its last stage: one layer, 12 ms, where it
  // had two (24 ms) without the slowdown in its estimate.
  const json d = run_json(
      {tmp.write("d.yaml", base + "strategy: {planner: dapple, global_batch: 8, micro_batches: 8}\n")});
  const json& last = d["stages"].back();
  CHECK(last["devices"][0] == "gpu3");
  CHECK(last["layers"].size() == 1);
  CHECK(d["warnings"].empty());
  // pipedream plans with gpu0's costs for every device: the warning, on stderr and in run --json.
  const std::string pd = tmp.write("p.yaml", base + "strategy: {partitioner: pipedream, micro_batches: 8}\n");
  auto p = run_command({PIPEGRID_BINARY, "run", pd});
  REQUIRE(p.exit_code == 0);
  CHECK(p.err.find("warning: partitioner pipedream searches with every device at the first device's model "
                   "speed: the fault's slow devices (gpu3 4x)") != std::string::npos);
  const json pj = run_json({pd});
  REQUIRE(pj["warnings"].size() == 1);
  CHECK(pj["warnings"][0].get<std::string>().rfind("partitioner pipedream searches with every device", 0) ==
        0);
  auto u =
      run_command({PIPEGRID_BINARY, "run", tmp.write("u.yaml", base + "strategy: {micro_batches: 8}\n")});
  REQUIRE(u.exit_code == 0);
  CHECK(u.err.find("slow devices") == std::string::npos);  // uniform's equal split uses no speeds
  // 3 stages on 4 devices leave gpu3 idle: its fault changes nothing (the same time as without the
  // fault, to the bit), and the run says so (it said nothing until 2026-12-05).
  const std::string three =
      tmp.write("three.yaml", base + "strategy: {partitioner: uniform, stages: 3, micro_batches: 8}\n");
  auto idle = run_command({PIPEGRID_BINARY, "run", three});
  REQUIRE(idle.exit_code == 0);
  CHECK(idle.err.find(
            "warning: the fault slows a device (gpu3 4x) that no stage runs on: it changes nothing in "
            "this run") != std::string::npos);
  const json healthy =
      run_json({tmp.write("h.yaml", base.substr(0, base.find("faults:")) +
                                        "strategy: {partitioner: uniform, stages: 3, micro_batches: 8}\n")});
  CHECK(run_json({three})["iteration_time_s"] == healthy["iteration_time_s"]);
}

TEST_CASE("run: mixed-adam on an fp32 workload keeps its gradients at the 4 bytes they are reduced in") {
  // docs/model.md: the gradient buffer is kept in the reduce's precision, never narrower. By default
  // the reduce is the workload's precision (4 bytes here), and the buffer was mixed-adam's 2 bytes.
  // A stage of 2 layers of 1 MiB of fp32 weights: 524,288 parameters, 2 MiB of gradients by hand.
  TempDir tmp;
  const std::string e = tmp.write(
      "ma.yaml",
      "workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 1B, parameters: 1MiB, "
      "samples_per_micro_batch: 2}\n"
      "cluster: {kind: switch, count: 4, device: {name: gpu, memory: 16GiB}, bandwidth: 1GBps, latency: "
      "1us}\n"
      "strategy: {stages: 2, replicas: 2, micro_batches: 4, schedule: 1f1b}\nmemory: {optimizer: "
      "mixed-adam}\n");
  const std::string memory = (tmp.path / "m.csv").string();
  REQUIRE(run_command({PIPEGRID_BINARY, "run", e, "--memory", memory}).exit_code == 0);
  CHECK(read_file(memory).find("\ngpu0,0,1048576,2097152,") != std::string::npos);
  const std::string explicit_fp32 = (tmp.path / "m32.csv").string();
  REQUIRE(run_command({PIPEGRID_BINARY, "run", e, "--set", "strategy.gradient_reduce=fp32", "--memory",
                       explicit_fp32})
              .exit_code == 0);
  CHECK(read_file(explicit_fp32) == read_file(memory));
  // The set-up itself is stated: a 16-bit training's weights counted for an fp32 workload (until
  // 2026-12-05 nothing said so), and not for the same workload in amp or with adam.
  CHECK(run_json({e})["assumptions"]["mixed_adam_on_fp32"] == true);
  CHECK(run_json({e, "--set", "workload.precision=amp"})["assumptions"]["mixed_adam_on_fp32"] == false);
  CHECK(run_json({e, "--set", "memory.optimizer=adam"})["assumptions"]["mixed_adam_on_fp32"] == false);
  auto text = run_command({PIPEGRID_BINARY, "run", e});
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("mixed-adam on fp32 weights: memory counts 2-byte working weights") !=
        std::string::npos);
}

TEST_CASE("run: a tf32 workload on devices without a tf32 rate says they run it as fp32") {
  // The U280 has no tf32 MACs (topologies/devices.yaml) and ran tf32 at its fp32 rate with nothing
  // said until 2026-12-05: the same time as fp32.
  TempDir tmp;
  const std::string exp = tmp.write(
      "t.yaml",
      "workload: {model: gpt, layers: 2, hidden: 512, heads: 8, sequence: 256, vocabulary: 1024, precision: "
      "tf32}\ncluster: {preset: fpga-ring-u280-8}\nstrategy: {partitioner: uniform, micro_batches: 2}\n");
  const json t = run_json({exp});
  CHECK(t["assumptions"]["tf32_as_fp32"] == json::array({"u280"}));
  const json f = run_json({exp, "--set", "workload.precision=fp32"});
  CHECK(f["assumptions"]["tf32_as_fp32"] == json::array());
  CHECK(t["iteration_time_s"] == f["iteration_time_s"]);
  auto text = run_command({PIPEGRID_BINARY, "run", exp});
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("tf32 run as fp32 on u280 (no tf32 rate)") != std::string::npos);
  // An A100 has the rate: nothing said.
  const json a = run_json({exp, "--set",
                           "cluster={kind: switch, count: 8, device: {name: gpu, model: a100}, "
                           "bandwidth: 25GBps, latency: 1us}"});
  CHECK(a["assumptions"]["tf32_as_fp32"] == json::array());
}

TEST_CASE(
    "run: unfused gradient accumulation on devices without a memory bandwidth says it costs nothing there") {
  // Its kernels move bytes at the memory bandwidth; a hand-described device has none, and the
  // assumes line claimed a cost the time did not have (38.4 ms either way; 40.27 ms on A100s).
  TempDir tmp;
  const std::string exp = chain_on_switch(tmp, "g.yaml", 4, "grad_accumulation: main-grad");
  auto text = run_command({PIPEGRID_BINARY, "run", exp});
  REQUIRE(text.exit_code == 0);
  CHECK(
      text.out.find("(grad_accumulation: main-grad), not costed on the 4 devices without a memory_bandwidth "
                    "(gpu0, ...)") != std::string::npos);
  const json fused = run_json({exp, "--set", "memory.grad_accumulation=fused"});
  CHECK(run_json({exp})["iteration_time_s"] == fused["iteration_time_s"]);
  auto a100 = run_command({PIPEGRID_BINARY, "run", exp, "--set", "cluster.device={name: gpu, model: a100}"});
  REQUIRE(a100.exit_code == 0);
  CHECK(a100.out.find("not costed") == std::string::npos);
}

TEST_CASE("run: under recomputation the stage table's backward includes the forward it re-runs") {
  // Two chain layers per stage, F 1 ms and B 2 ms each: B = 4 ms, and full recomputation re-runs the
  // stage's 2 ms forward first, 6 ms as replayed. The column showed 4 ms until 2026-12-05.
  TempDir tmp;
  const std::string exp = chain_on_switch(tmp, "r.yaml", 8, "recompute: full");
  auto text = run_command({PIPEGRID_BINARY, "run", exp});
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("forward bwd+recomp  stash/micro-b\n") != std::string::npos);
  CHECK(text.out.find("gpu0          2 ms       6 ms") != std::string::npos);
  auto none = run_command({PIPEGRID_BINARY, "run", exp, "--set", "memory.recompute=none"});
  REQUIRE(none.exit_code == 0);
  CHECK(none.out.find("gpu0          2 ms       4 ms") != std::string::npos);
}

TEST_CASE("run: a cluster written without a name, and of unlike devices, is said as it is") {
  // The header printed a blank name, and the assumes line the largest reserve (a V100's) as every
  // device's, though the FPGAs get none by default (found 2026-12-05).
  TempDir tmp;
  const std::string exp = tmp.write(
      "h.yaml",
      "workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 8MiB, parameters: 64MiB}\n"
      "cluster:\n  devices: [{name: gpu, count: 2, model: v100}, {name: fpga, count: 2, model: u280}]\n"
      "  switches: [sw]\n  links:\n"
      "    - {between: [gpu0, sw], bandwidth: 25GBps, latency: 1us}\n"
      "    - {between: [gpu1, sw], bandwidth: 25GBps, latency: 1us}\n"
      "    - {between: [fpga0, sw], bandwidth: 100Gbps, latency: 1us}\n"
      "    - {between: [fpga1, sw], bandwidth: 100Gbps, latency: 1us}\n"
      "strategy: {micro_batches: 4}\n");
  auto text = run_command({PIPEGRID_BINARY, "run", exp});
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("  cluster    unnamed (4 devices)\n") != std::string::npos);
  // The V100's default: 1,024 MiB + 5% of its 16,160 MiB (topologies/devices.yaml) = 1,832 MiB =
  // 1.789 GiB; the U280's: none.
  CHECK(text.out.find("memory reserve 0 B to 1.789 GiB per device (default: 1 GiB + 5% per GPU") !=
        std::string::npos);
}

TEST_CASE("run: recompute: selective on a workload that defines no selective stash says it changes nothing") {
  // docs/model.md: without transformer blocks, layers that define no selective_stash_bytes behave as
  // with none; the run was none's (38.4 ms) and said nothing until 2026-12-05.
  TempDir tmp;
  const std::string exp = chain_on_switch(tmp, "s.yaml", 4, "recompute: selective");
  auto text = run_command({PIPEGRID_BINARY, "run", exp});
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("recompute: selective changes nothing (no transformer blocks") != std::string::npos);
  const json sel = run_json({exp});
  CHECK(sel["iteration_time_s"] == run_json({exp, "--set", "memory.recompute=none"})["iteration_time_s"]);
  CHECK(sel["assumptions"]["settings_without_effect"] == json::array({"recompute: selective"}));
  // The chain fixes its optimizer step (0 s unless given): unfused kernels change nothing either.
  auto unfused = run_command({PIPEGRID_BINARY, "run", exp, "--set", "memory.optimizer_kernels=unfused",
                              "--set", "workload.optimizer_step=500us"});
  REQUIRE(unfused.exit_code == 0);
  CHECK(
      unfused.out.find("optimizer_kernels: unfused changes nothing (the workload fixes the optimizer step at "
                       "500 us)") != std::string::npos);
  // A GPT has blocks: its modules are named instead.
  const std::string gpt = tmp.write(
      "g.yaml",
      "workload: {model: gpt, layers: 2, hidden: 512, heads: 8, sequence: 256, vocabulary: 1024, precision: "
      "amp}\ncluster: {kind: switch, count: 2, device: {name: gpu, model: a100}, bandwidth: 25GBps, latency: "
      "1us}\nstrategy: {micro_batches: 2}\nmemory: {recompute: selective}\n");
  auto blocks = run_command({PIPEGRID_BINARY, "run", gpt});
  REQUIRE(blocks.exit_code == 0);
  CHECK(blocks.out.find("changes nothing") == std::string::npos);
  CHECK(blocks.out.find("selective recomputation of core_attn") != std::string::npos);
  // bytes_per_parameter replaces the memory, not the modelled step's optimizer.
  auto bytes = run_command({PIPEGRID_BINARY, "run", gpt, "--set", "memory.bytes_per_parameter=4"});
  REQUIRE(bytes.exit_code == 0);
  CHECK(bytes.out.find("memory.bytes_per_parameter sets the memory only: the optimizer step is adam's") !=
        std::string::npos);
}

TEST_CASE("run: a multi-token-prediction module sits on the last stage with a copy of the embedding") {
  // DeepSeek-V2-Lite's shapes cut to 4 blocks (1 dense), mtp_layers 1, the megatron partitioner on 2
  // stages: the 4 blocks split 2 + 2 (the module's block is not one of them, as Megatron's
  // --num-layers leaves it out), the module after the head on the last stage, where it keeps a copy of
  // the token table it looks its tokens up in (V x h = 102,400 x 2,048). Oracle for the model FLOPs:
  // the same model with a fifth block and no module, whose extra block is the module's, less the
  // module's eh_proj (2 h x h) and its pass through the shared head (V x h).
  TempDir tmp;
  const std::string base =
      "workload: {model: deepseek-v2-lite, layers: 4, dense_layers: 1, sequence: 1024, precision: amp-bf16, "
      "mtp_layers: 1}\ncluster: {preset: dgx-h100-16}\nstrategy: {partitioner: megatron, stages: 2, "
      "global_batch: 16, micro_batch_size: 1, replicas: 8, expert_parallel: 8}\n";
  const json r = run_json({tmp.write("mtp.yaml", base)});
  REQUIRE(r["stages"].size() == 2);
  CHECK(r["stages"][0]["layers"] == json::array({"tokens", "embedding.words", "layer0", "layer1"}));
  const json& last = r["stages"][1]["layers"];
  REQUIRE(last.size() == 11);
  CHECK(last[0] == "layer2");
  CHECK(last[3] == "lm_head");
  CHECK(last[10] == "mtp1.lm_head");
  REQUIRE(r["tied_weights"].size() == 1);
  CHECK(r["tied_weights"][0]["layer"] == "mtp1.embedding");
  CHECK(r["tied_weights"][0]["parameters_per_device"] == 102400.0 * 2048);
  const json none = run_json({tmp.write("none.yaml", base), "--set", "workload.mtp_layers=0"});
  const json five = run_json({tmp.write("five.yaml", base), "--set", "workload.mtp_layers=0", "--set",
                              "workload.layers=5", "--set", "strategy.partitioner=balanced"});
  const double block = five["model_flops"]["active_parameters"].get<double>() -
                       none["model_flops"]["active_parameters"].get<double>();
  CHECK(r["model_flops"]["active_parameters"].get<double>() -
            none["model_flops"]["active_parameters"].get<double>() ==
        block + 2.0 * 2048 * 2048 + 102400.0 * 2048);
  CHECK(r["model_flops"]["blocks"] == 5);
  CHECK(r["model_flops"]["attention_flops_per_token"] == five["model_flops"]["attention_flops_per_token"]);
  CHECK(none["tied_weights"].empty());
}
