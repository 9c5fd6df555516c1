// The command line end to end: summary, --json, --trace.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "tests/support/approx.h"
#include "tests/support/process.h"

using nlohmann::json;
using pipegrid::testing::read_file;
using pipegrid::testing::run_command;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/pipegrid-test-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

// The issue's example with communication made negligible and zero latency (valid).
const char* kNoComm = R"(
workload:
  kind: chain
  layers: 8
  forward: 1ms
  backward: 2ms
  activation: 1KiB
  parameters: 64MiB
  samples_per_micro_batch: 4
cluster:
  kind: switch
  count: 4
  device: {name: gpu, memory: 16GiB}
  bandwidth: 1000TBps
  latency: 0s
strategy:
  partitioner: uniform
  schedule: 1f1b
  micro_batches: 8
)";

}  // namespace

TEST_CASE("pipegrid run without a file prints the built-in example's summary") {
  auto r = run_command({PIPEGRID_BINARY, "run"});
  CHECK(r.exit_code == 0);
  CHECK(r.err.empty());
  CHECK(r.out.find("built-in example") != std::string::npos);
  CHECK(r.out.find("iteration time") != std::string::npos);
  CHECK(r.out.find("bubble ratio") != std::string::npos);
  CHECK(r.out.find("gpu3") != std::string::npos);
}

TEST_CASE("--json: the documented keys, values from the closed form") {
  TempDir tmp;
  auto r = run_command({PIPEGRID_BINARY, "run", tmp.write("e.yaml", kNoComm), "--json"});
  REQUIRE(r.exit_code == 0);
  json j = json::parse(r.out);
  // Stage = 2 layers: T_F = 2 ms, T_BW = 4 ms; p = 4, m = 8.
  const double iter = (8 + 4 - 1) * 6e-3;
  CHECK(j["iteration_time_s"].get<double>() == pipegrid::testing::approx(iter).epsilon(1e-6));
  CHECK(j["throughput_samples_per_s"].get<double>() == pipegrid::testing::approx(32 / iter).epsilon(1e-6));
  CHECK(j["bubble_ratio"].get<double>() == pipegrid::testing::approx(3.0 / 11).epsilon(1e-6));
  REQUIRE(j["devices"].size() == 4);
  for (int i = 0; i < 4; ++i) {
    const json& d = j["devices"][i];
    CHECK(d["name"] == "gpu" + std::to_string(i));
    CHECK(d["busy_s"].get<double>() == pipegrid::testing::approx(8 * 6e-3).epsilon(1e-6));
    CHECK(d["idle_s"].get<double>() == pipegrid::testing::approx(iter - 8 * 6e-3).epsilon(1e-5));
    CHECK(d["bubble_ratio"].get<double>() == pipegrid::testing::approx(3.0 / 11).epsilon(1e-5));
    // Stash per micro-batch: 2 layers x 1 KiB; in flight: min(p - i, m).
    CHECK(d["peak_activation_bytes"].get<double>() == pipegrid::testing::approx((4 - i) * 2 * 1024.0));
    // Adam in fp32: 4 copies of 2 x 64 MiB of weights, the stash, and the backward's workspace
    // (one layer output, 1 KiB).
    CHECK(d["peak_memory_bytes"].get<double>() ==
          pipegrid::testing::approx(4 * 2 * 64.0 * (1 << 20) + (4 - i) * 2048.0 + 1024).epsilon(1e-12));
  }
}

TEST_CASE("--trace writes a Chrome trace: one process per device, compute and send tracks, memory counters") {
  TempDir tmp;
  const std::string trace = (tmp.path / "t.json").string();
  auto r = run_command({PIPEGRID_BINARY, "run", "--trace", trace});
  REQUIRE(r.exit_code == 0);
  json j = json::parse(read_file(trace));
  std::set<int> processes, compute_pids, send_pids, counter_pids;
  std::map<int, int> compute_slices;
  for (const json& ev : j["traceEvents"]) {
    if (ev["ph"] == "M" && ev["name"] == "process_name") {
      processes.insert(ev["pid"].get<int>());
      CHECK(ev["args"]["name"] == "gpu" + std::to_string(ev["pid"].get<int>() - 1));
    }
    if (ev["ph"] == "X" && ev["tid"] == 1) {
      compute_pids.insert(ev["pid"].get<int>());
      ++compute_slices[ev["pid"].get<int>()];
    }
    if (ev["ph"] == "X" && ev["tid"].get<int>() >= 2) send_pids.insert(ev["pid"].get<int>());
    if (ev["ph"] == "C") counter_pids.insert(ev["pid"].get<int>());
  }
  CHECK(processes == std::set<int>{1, 2, 3, 4});
  CHECK(compute_pids == processes);
  CHECK(counter_pids == processes);
  CHECK(send_pids == processes);  // the first and last send only one way, the middle both
  for (auto [pid, n] : compute_slices) CHECK(n == 16);  // 8 forwards + 8 backwards each
}

TEST_CASE("pipegrid list names every partitioner and schedule") {
  auto r = run_command({PIPEGRID_BINARY, "list"});
  CHECK(r.exit_code == 0);
  for (const char* name : {"uniform", "balanced", "gpipe", "1f1b"})
    CHECK(r.out.find(name) != std::string::npos);
}

TEST_CASE("pipegrid list has three sections, one line per entry, bapipe among the planners") {
  auto r = run_command({PIPEGRID_BINARY, "list"});
  REQUIRE(r.exit_code == 0);
  const size_t partitioners = r.out.find("partitioners:\n"), schedules = r.out.find("\nschedules:\n"),
               planners = r.out.find("\nplanners:\n");
  REQUIRE(partitioners == 0);
  REQUIRE(schedules != std::string::npos);
  REQUIRE(planners != std::string::npos);
  CHECK(partitioners < schedules);
  CHECK(schedules < planners);
  const std::string planner_lines = r.out.substr(planners + 1);
  CHECK(planner_lines.find("\n  partitioner ") != std::string::npos);
  CHECK(planner_lines.find("\n  bapipe ") != std::string::npos);
  CHECK(r.out.substr(schedules, planners - schedules).find("  1f1b ") != std::string::npos);
}

TEST_CASE("strategy.planner: bapipe plans like the older partitioner: bapipe") {
  TempDir tmp;
  const std::string base = R"(
workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 1KiB, parameters: 1MiB}
cluster: {kind: switch, count: 4, device: {name: gpu, memory: 16GiB}, bandwidth: 100GBps, latency: 1us}
)";
  auto old =
      run_command({PIPEGRID_BINARY, "plan", "--json",
                   tmp.write("old.yaml", base + "strategy: {partitioner: bapipe, global_batch: 8}\n")});
  auto now = run_command({PIPEGRID_BINARY, "plan", "--json",
                          tmp.write("new.yaml", base + "strategy: {planner: bapipe, global_batch: 8}\n")});
  REQUIRE(old.exit_code == 0);
  REQUIRE(now.exit_code == 0);
  json a = json::parse(old.out), b = json::parse(now.out);
  CHECK(a["planner"] == "bapipe");
  CHECK(b["planner"] == "bapipe");
  CHECK(a["stages"] == b["stages"]);
  CHECK(a["schedule"] == b["schedule"]);
  CHECK(a["micro_batches"] == b["micro_batches"]);
  CHECK(a["exploration"] == b["exploration"]);
  CHECK(a["iteration_time_s"] == b["iteration_time_s"]);
}

TEST_CASE("pipegrid list shows luo, and run plans a DAPPLE profile with it on a cluster generator") {
  auto list = run_command({PIPEGRID_BINARY, "list", "planners"});
  REQUIRE(list.exit_code == 0);
  CHECK(list.out.find("  luo ") != std::string::npos);
  CHECK(list.out.find("Luo-style (INFOCOM'22, our interpretation)") != std::string::npos);

  const fs::path profile = fs::path(PIPEGRID_PROFILES_DIR) / "dapple/vgg-19-pbs-32.txt";
  REQUIRE_MESSAGE(fs::exists(profile), profile << " is missing: the profiles are part of the repository");
  TempDir tmp;
  // VGG-19 as DAPPLE profiled it (32 samples) on 8 Summit V100s (2 nodes), mini-batch 64.
  const std::string base =
      "workload: {profile: " + profile.string() + ", batch: 32}\ncluster: {kind: summit, nodes: 2}\n";
  auto luo = run_command(
      {PIPEGRID_BINARY, "run", "--json",
       tmp.write("luo.yaml", base + "strategy: {planner: luo, global_batch: 64, baselines: true}\n")});
  auto plain =
      run_command({PIPEGRID_BINARY, "run", "--json",
                   tmp.write("plain.yaml", base + "strategy: {planner: partitioner, global_batch: 64}\n")});
  REQUIRE(luo.exit_code == 0);
  REQUIRE(plain.exit_code == 0);
  json a = json::parse(luo.out), b = json::parse(plain.out);
  CHECK(a["schedule"] == "luo");
  CHECK(a["feasible"] == true);
  CHECK(a["samples_per_iteration"].get<double>() == 64);
  // With baselines, luo also judges the default planner's plan (uniform stages, 1F1B, the best micro-batch
  // size) in SimGrid and keeps the faster: never slower than it.
  CHECK(a["iteration_time_s"].get<double>() <= b["iteration_time_s"].get<double>() * (1 + 1e-9));

  // `baselines` belongs to luo.
  auto bad = run_command(
      {PIPEGRID_BINARY, "run",
       tmp.write("bad.yaml", base + "strategy: {planner: bapipe, global_batch: 64, baselines: false}\n")});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("used by the luo planner only") != std::string::npos);
}

// A small GPT on two DGX A100 nodes (16 GPUs, 8 blocks), for the `search` tests.
constexpr const char* kSmallGptOnTwoDgx = R"(name: small GPT on two DGX A100
workload: {model: gpt, layers: 8, hidden: 1024, heads: 16, sequence: 1024, vocabulary: 51200, precision: amp}
cluster: {preset: dgx-a100-16}
memory: {optimizer: mixed-adam}
strategy: {partitioner: megatron, micro_batches: 1}
)";

// `pipegrid search --top K` replays its best K in SimGrid, as whole graphs or TP-folded: with t = 8
// filling each DGX node, the two replays agree to rounding (the whole graph is the oracle; the core
// test compares every candidate), and the output says which replay ran.
TEST_CASE("cli: search --top 3, whole graphs and --tp-folded, agree where a TP group fills its node") {
  TempDir tmp;
  const std::string exp = tmp.write("gpt.yaml", kSmallGptOnTwoDgx);
  std::map<std::string, double> times[2];
  for (int folded = 0; folded < 2; ++folded) {
    std::vector<std::string> argv = {
        PIPEGRID_BINARY, "search", exp,     "--global-batch", "16", "--top", "3", "--tensor-parallel", "8",
        "--micro-batch", "1",      "--json"};
    if (folded) argv.push_back("--tp-folded");
    auto r = run_command(argv);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const json j = json::parse(r.out);
    CHECK(j["simgrid_replays"] == (folded ? "tp-folded" : "whole graph"));
    // The cost model's check rows for the cluster's GPU, as run reports them (report_test): the
    // A100 in the workload's precision, measurements.yaml's rows and Megatron-LM's 3D runs.
    REQUIRE(j["cost_model_checks"].size() == 2);
    CHECK(j["cost_model_checks"][0]["device"] == "a100");
    CHECK(j["cost_model_checks"][1]["source"] == "megatron-lm");
    REQUIRE(j["simgrid_ranking"].size() == 3);
    for (const json& c : j["simgrid_ranking"]) {
      CHECK(c["t"] == 8);
      const std::string key = c["schedule"].get<std::string>() + "/" + std::to_string(c["p"].get<int>()) +
                              "/" + c["recompute"].get<std::string>() + "/" +
                              std::to_string(c["sequence_parallel"].get<bool>()) + "/" +
                              std::to_string(c["distributed_optimizer"].get<bool>()) + "/" +
                              std::to_string(c["chunks"].get<int>());
      times[folded][key] = c["simulated_iteration_time_s"].get<double>();
    }
  }
  REQUIRE(times[0].size() == 3);
  for (const auto& [key, whole] : times[0]) {
    REQUIRE(times[1].count(key) == 1);
    CHECK(times[1][key] == pipegrid::testing::approx(whole).epsilon(1e-9));
  }
  auto text = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--top", "2",
                           "--tensor-parallel", "8", "--micro-batch", "1", "--tp-folded"});
  REQUIRE_MESSAGE(text.exit_code == 0, text.err);
  CHECK(text.out.find("SimGrid replays TP-folded") != std::string::npos);
  CHECK(text.out.find("\ncost model  a100 amp: against ") != std::string::npos);
}

// `--chunks` restricts v of interleaved-1f1b like the other axes: with t, p, b, the schedule and the
// recomputation fixed, only SP stays free (16 GPUs = t 8 x p 2 leaves d = 1, where the distributed
// optimizer is the same run), so 2 candidates, both with v = 2 (8 blocks, p = 2: v = 4 would also
// divide them and is left out by the option alone).
TEST_CASE("cli: search --chunks keeps only those v of interleaved-1f1b, and refuses 0") {
  TempDir tmp;
  const std::string exp = tmp.write("gpt.yaml", kSmallGptOnTwoDgx);
  const std::vector<std::string> axes = {PIPEGRID_BINARY,
                                         "search",
                                         exp,
                                         "--global-batch",
                                         "16",
                                         "--top",
                                         "0",
                                         "--tensor-parallel",
                                         "8",
                                         "--pipeline",
                                         "2",
                                         "--micro-batch",
                                         "1",
                                         "--schedules",
                                         "interleaved-1f1b",
                                         "--recompute",
                                         "none",
                                         "--json"};
  std::vector<std::string> only2 = axes;
  only2.insert(only2.end(), {"--chunks", "2"});
  auto r = run_command(only2);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const json j = json::parse(r.out);
  REQUIRE(j["analytic_ranking"].size() == 2);
  for (const json& c : j["analytic_ranking"]) CHECK(c["chunks"] == 2);
  auto all = run_command(axes);
  REQUIRE_MESSAGE(all.exit_code == 0, all.err);
  // v = 2 and v = 4, and v = 3 with a layout (8 blocks in 6 stages: 0, 2, 2, 2, 2, 0; since 2026-12-06).
  const json ranked = json::parse(all.out)["analytic_ranking"];
  CHECK(ranked.size() == 6);
  for (const json& c : ranked) CHECK((c["layout"] == "") == (c["chunks"] != 3));
  for (const json& c : ranked)
    if (c["chunks"] == 3) CHECK(c["layout"] == "E|t*2|t*2|t*2|t*2|L");
  auto bad = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--chunks", "0"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--chunks: Value 0 not in range 1 to 1024") != std::string::npos);
}

TEST_CASE(
    "goodput: an infinite target and --mtbf beside --failures are refused, faults and memory are stated") {
  TempDir tmp;
  const std::string base =
      "workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 1MiB}\n"
      "cluster: {kind: switch, count: 2, device: {name: gpu, memory: 16GiB}, bandwidth: 10GBps, latency: "
      "1us}\n"
      "strategy: {micro_batches: 2}\n";
  const std::string exp = tmp.write("e.yaml", base);
  // An infinite target made the auto interval's search loop for ever (2026-12-05).
  auto inf = run_command({PIPEGRID_BINARY, "goodput", exp, "--iterations", "inf"});
  CHECK(inf.exit_code == 2);
  CHECK(inf.err.find("must be finite") != std::string::npos);
  // --mtbf replaces the failure model: an explicit --failures beside it was silently dropped.
  auto both = run_command(
      {PIPEGRID_BINARY, "goodput", exp, "--iterations", "100", "--failures", "none", "--mtbf", "100s"});
  CHECK(both.exit_code == 2);
  CHECK(run_command({PIPEGRID_BINARY, "goodput", exp, "--iterations", "100", "--mtbf", "100s"}).exit_code ==
        0);
  // The faults replayed are stated, as run states them.
  const std::string slow =
      tmp.write("s.yaml", base + "faults: {slow_devices: [{device: gpu1, factor: 2}]}\n");
  auto s = run_command({PIPEGRID_BINARY, "goodput", slow, "--iterations", "100"});
  REQUIRE(s.exit_code == 0);
  CHECK(s.out.find("faults      gpu1 2x slower (the iteration replayed with them)") != std::string::npos);
  // A plan over a device's memory (8 GiB of parameters per layer and Adam's state on 16 GiB devices): said.
  const std::string big = tmp.write(
      "b.yaml",
      "workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 8GiB}\n"
      "cluster: {kind: switch, count: 2, device: {name: gpu, memory: 16GiB}, bandwidth: 10GBps, latency: "
      "1us}\n"
      "strategy: {micro_batches: 2}\nmemory: {optimizer: adam}\n");
  auto b = run_command({PIPEGRID_BINARY, "goodput", big, "--iterations", "100", "--json"});
  REQUIRE(b.exit_code == 0);
  CHECK(nlohmann::json::parse(b.out)["feasible"] == false);
}

TEST_CASE("goodput: --tokens counts whole batches, and options that would be ignored are refused") {
  TempDir tmp;
  // A GPT of 4 layers on 2 A100s, global batch 8 of 512 tokens: 4,096 tokens per iteration by hand.
  // Counted as tokens/s x the iteration's time it came out at 4095.9999999999995, and --tokens 4096
  // asked for 2 iterations (2026-12-05).
  const std::string exp = tmp.write(
      "g.yaml",
      "workload: {model: gpt, layers: 4, hidden: 512, heads: 8, sequence: 512, vocabulary: 1024}\n"
      "cluster: {kind: switch, count: 2, device: {name: gpu, model: a100}, bandwidth: 25GBps, latency: 1us}\n"
      "strategy: {partitioner: uniform, schedule: 1f1b, stages: 1, micro_batch_size: 1, global_batch: 8}\n");
  for (const char* tokens : {"4096", "4096000"}) {
    auto r =
        run_command({PIPEGRID_BINARY, "goodput", exp, "--tokens", tokens, "--failures", "none", "--json"});
    REQUIRE(r.exit_code == 0);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    CHECK(j["tokens_per_iteration"] == 4096);
    CHECK(j["iterations"].get<double>() == std::stod(tokens) / 4096);
  }
  // --storage-bandwidth sets the write time that --checkpoint-write gives: both were taken, one ignored.
  auto both = run_command({PIPEGRID_BINARY, "goodput", exp, "--iterations", "100", "--checkpoint-write", "1s",
                           "--storage-bandwidth", "1kBps"});
  CHECK(both.exit_code == 2);
  CHECK(both.err.find("--storage-bandwidth sets the checkpoint's write time, and --checkpoint-write 1s was "
                      "given too") != std::string::npos);
  // Past 2^53 iterations the counts are not whole numbers any more (the auto interval's search hung).
  auto huge = run_command({PIPEGRID_BINARY, "goodput", exp, "--iterations", "1e20"});
  CHECK(huge.exit_code == 2);
  CHECK(huge.err.find("expected at most 9.0072e+15 (2^53") != std::string::npos);
  // A chain has no tokens (goodput in iterations/s, not "0 tokens/s"), and its hand-described devices
  // are not GPUs: Llama 3's per-GPU rates applied to them are said to be so. A short run reads in
  // minutes, not "0.00 days".
  const std::string chain = tmp.write(
      "c.yaml",
      "workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 1MiB}\n"
      "cluster: {kind: switch, count: 2, device: {name: gpu, memory: 16GiB}, bandwidth: 10GBps, latency: "
      "1us}\nstrategy: {micro_batches: 2}\n");
  auto c = run_command({PIPEGRID_BINARY, "goodput", chain, "--iterations", "100000"});
  REQUIRE(c.exit_code == 0);
  CHECK(c.out.find("goodput     0 tokens/s") == std::string::npos);
  CHECK(c.out.find("iterations/s (useful iterations per second of elapsed time") != std::string::npos);
  CHECK(c.out.find("on 2 devices (2 of them not GPUs, given the H100's rates)") != std::string::npos);
  CHECK(c.out.find("0.00 days") == std::string::npos);
  // ... and its iteration line counts no tokens (it printed "0 tokens").
  CHECK(c.out.find(" tokens\n") == std::string::npos);
}

TEST_CASE("goodput without failures: failure options refused, no spread, a fractional target said") {
  // With --failures none every trial runs the same time: the interval of the mean is 0, not the
  // rounding of 1,000 additions (6.9e-18 s), and --restart, --trials and --seed change nothing.
  TempDir tmp;
  const std::string chain = tmp.write(
      "c.yaml",
      "workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 1MiB}\n"
      "cluster: {kind: switch, count: 2, device: {name: gpu, memory: 16GiB}, bandwidth: 10GBps, latency: "
      "1us}\nstrategy: {micro_batches: 2}\n");
  for (const char* option : {"--restart", "--trials", "--seed"}) {
    CAPTURE(option);
    auto r = run_command({PIPEGRID_BINARY, "goodput", chain, "--iterations", "10", "--failures", "none",
                          option, std::string(option) == "--restart" ? "10s" : "3"});
    CHECK(r.exit_code == 2);
    CHECK(r.err == std::string("pipegrid: ") + option +
                       " is for failures, and --failures none has none: it would change nothing\n");
  }
  auto j =
      run_command({PIPEGRID_BINARY, "goodput", chain, "--iterations", "10", "--failures", "none", "--json"});
  REQUIRE(j.exit_code == 0);
  const nlohmann::json g = nlohmann::json::parse(j.out);
  CHECK(g["schema_version"] == 1);
  CHECK(g["command"] == "goodput");
  CHECK(g["expected_time_ci95_s"] == 0);
  CHECK(g["iterations"].is_number_integer());
  auto frac = run_command({PIPEGRID_BINARY, "goodput", chain, "--iterations", "0.3", "--failures", "none"});
  REQUIRE(frac.exit_code == 0);
  CHECK(frac.out.find("target      1 iteration (--iterations 0.3 rounded up to whole iterations)") !=
        std::string::npos);
  CHECK(frac.out.find("interval of the mean +-0 s") != std::string::npos);
  // RSC's rates are per node: on a cluster that names no node each device counts as one, and is said to.
  auto rsc = run_command({PIPEGRID_BINARY, "goodput", chain, "--iterations", "10", "--failures", "rsc1"});
  REQUIRE(rsc.exit_code == 0);
  CHECK(rsc.out.find("on 2 nodes (2 of them devices without a node in the cluster, each counted as one)") !=
        std::string::npos);
}

TEST_CASE("run: --tokens without tokens, a NaN budget and --plot-data without --plot are refused") {
  auto chain = run_command({PIPEGRID_BINARY, "run", "--tokens", "1e9"});  // the built-in chain
  CHECK(chain.exit_code == 2);
  CHECK(chain.err.find("--tokens needs a workload with a sequence length") != std::string::npos);
  auto nan = run_command({PIPEGRID_BINARY, "run", "--tokens", "nan"});
  CHECK(nan.exit_code == 2);
  CHECK(nan.err.find("expected a finite positive number, got nan") != std::string::npos);
  auto negative = run_command({PIPEGRID_BINARY, "run", "--tokens", "-5"});
  CHECK(negative.exit_code == 2);
  CHECK(negative.err.find("got -5;") != std::string::npos);  // not a range of two 309-digit numbers
  auto data = run_command({PIPEGRID_BINARY, "run", "--plot-data"});
  CHECK(data.exit_code == 2);
  CHECK(data.err.find("--plot-data keeps --plot's data and script, and --plot was not given") !=
        std::string::npos);
}

TEST_CASE("plan and jobs say which devices a plan leaves without a stage") {
  // run lists them as "(unused)" rows; plan and jobs said nothing until 2026-12-05.
  TempDir tmp;
  const std::string exp = tmp.write(
      "p.yaml",
      "workload: {kind: chain, layers: 2, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 1MiB}\n"
      "cluster: {kind: switch, count: 4, device: {name: gpu, memory: 16GiB}, bandwidth: 10GBps, latency: "
      "1us}\n"
      "strategy: {partitioner: uniform, stages: 2, micro_batches: 2}\n");
  auto plan = run_command({PIPEGRID_BINARY, "plan", exp});
  REQUIRE(plan.exit_code == 0);
  CHECK(plan.out.find("unused      2 of 4 devices hold no stage (gpu2, gpu3)") != std::string::npos);
  const std::string jobs =
      tmp.write("j.yaml",
                "cluster: {kind: switch, count: 4, device: {name: gpu, memory: 16GiB}, bandwidth: 10GBps, "
                "latency: 1us}\n"
                "jobs:\n"
                "  - {name: a, devices: 4, workload: {kind: chain, layers: 2, forward: 1ms, backward: 2ms, "
                "activation: 1MiB,"
                " parameters: 1MiB}, strategy: {partitioner: uniform, stages: 2, micro_batches: 2}}\n");
  auto j = run_command({PIPEGRID_BINARY, "jobs", jobs});
  REQUIRE_MESSAGE(j.exit_code == 0, j.err);
  CHECK(j.err.find("job a: 2 of 4 devices hold no stage (gpu2, gpu3): the job holds them idle") !=
        std::string::npos);
}

TEST_CASE("planners that cost every device as the first one say so on a cluster of unlike devices") {
  // graphpipe, pipedream and piper plan with the first device's costs; on two A100s and two V100s
  // graphpipe gave the last V100 4 of 13 layers (11 ms per micro-batch against about 6 ms on the
  // others) with nothing said until 2026-12-05. bapipe costs each device and says nothing.
  TempDir tmp;
  const std::string common =
      "workload: {model: gpt, layers: 8, hidden: 1024, heads: 16, sequence: 1024, vocabulary: 32000, "
      "precision: amp}\n"
      "cluster:\n  devices: [{name: fast, count: 2, model: a100}, {name: slow, count: 2, model: v100}]\n"
      "  switches: [sw]\n  links:\n"
      "    - {between: [fast0, sw], bandwidth: 25GBps, latency: 1us}\n"
      "    - {between: [fast1, sw], bandwidth: 25GBps, latency: 1us}\n"
      "    - {between: [slow0, sw], bandwidth: 25GBps, latency: 1us}\n"
      "    - {between: [slow1, sw], bandwidth: 25GBps, latency: 1us}\n";
  const std::string mixed =
      tmp.write("m.yaml", common + "strategy: {partitioner: graphpipe, micro_batches: 4}\n");
  // A partitioner beside planner piper would be refused (ignored by it), so piper has its own file.
  const std::string mixed_piper =
      tmp.write("p.yaml", common + "strategy: {planner: piper, micro_batches: 4}\n");
  const std::string said = "plans as if every device were the first (fast0, a100); slow0 (v100) differs";
  auto graphpipe = run_command({PIPEGRID_BINARY, "run", mixed});
  REQUIRE(graphpipe.exit_code == 0);
  CHECK(graphpipe.err.find("partitioner graphpipe " + said) != std::string::npos);
  auto piper = run_command({PIPEGRID_BINARY, "plan", mixed_piper});
  REQUIRE(piper.exit_code == 0);
  CHECK(piper.err.find("planner piper " + said) != std::string::npos);
  auto bapipe = run_command({PIPEGRID_BINARY, "run", mixed, "--set", "strategy.partitioner=bapipe"});
  REQUIRE(bapipe.exit_code == 0);
  CHECK(bapipe.err.find("plans as if") == std::string::npos);
  // Alike devices: nothing said.
  auto alike = run_command({PIPEGRID_BINARY, "run", mixed, "--set", "cluster.devices[1].model=a100"});
  REQUIRE(alike.exit_code == 0);
  CHECK(alike.err.find("plans as if") == std::string::npos);
}

TEST_CASE("memory.zero: 1 without a data-parallel group to shard over is said to change nothing") {
  // Found 2026-12-05: the same time and memory as without it, and nothing said.
  TempDir tmp;
  const std::string exp = tmp.write(
      "z.yaml",
      "workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 8MiB, parameters: 64MiB}\n"
      "cluster: {kind: switch, count: 4, device: {name: gpu, memory: 16GiB}, bandwidth: 25GBps, latency: "
      "1us}\n"
      "strategy: {schedule: 1f1b, micro_batches: 8}\nmemory: {zero: 1}\n");
  const std::string said = "memory.zero: 1 changes nothing: ZeRO-1 shards the optimizer state";
  auto alone = run_command({PIPEGRID_BINARY, "run", exp});
  REQUIRE(alone.exit_code == 0);
  CHECK(alone.err.find(said) != std::string::npos);
  // Two replicas per stage: it shards (552 -> 424 MiB in the hunt's run), nothing said.
  auto replicated = run_command({PIPEGRID_BINARY, "run", exp, "--set", "strategy.stages=2", "--set",
                                 "strategy.replicas=2", "--set", "strategy.micro_batch_size=1"});
  REQUIRE(replicated.exit_code == 0);
  CHECK(replicated.err.find(said) == std::string::npos);
}

TEST_CASE("a GPT-style block's stash at t = 1 follows its FFN width and fp8, as at t > 1") {
  // Korthikanti et al. 2022: s h (34 + 5 a s / h) bytes at 16 bits for ffn = 4h. The MLP's width
  // enters through its two 2 s f tensors (the GeLU's input and output: 4 s f bytes), and fp8 stores the
  // GEMMs' inputs at one byte (QKV, projection, the MLP's two: 7 s h bytes less at ffn = 4h). At t = 1
  // the formula alone was used until 2026-12-05, whatever ffn and precision.
  auto stash = [](const std::string& model, std::vector<std::string> args) {
    std::vector<std::string> cmd{PIPEGRID_BINARY, "workload", "show", model, "--json"};
    cmd.insert(cmd.end(), args.begin(), args.end());
    auto r = run_command(cmd);
    REQUIRE(r.exit_code == 0);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    for (const auto& l : j["layers"])
      if (l["name"] == "layer0" || l["name"] == "branch0.layer0") return l["stash_bytes"].get<double>();
    FAIL("no block");
    return 0.0;
  };
  const std::vector<std::string> gpt{"--arg", "layers=1",      "--arg", "hidden=1024",    "--arg", "heads=16",
                                     "--arg", "sequence=1024", "--arg", "vocabulary=1000"};
  auto with = [](std::vector<std::string> a, const std::string& p) {
    a.insert(a.end(), {"--precision", p});
    return a;
  };
  const double s = 1024, h = 1024, a = 16;
  CHECK(stash("gpt", with(gpt, "amp-bf16")) == s * h * (34 + 5 * a * s / h));
  CHECK(stash("gpt", with(gpt, "amp-bf16")) - stash("gpt", with(gpt, "fp8")) == 7 * s * h);
  // mmt's blocks (s 256): ffn 4096 -> 8192 adds 4 x 256 x 4096 bytes.
  const std::vector<std::string> mmt{"--arg", "branches=1", "--arg", "layers=1", "--precision", "amp-bf16"};
  auto ffn = [&](const char* f) {
    std::vector<std::string> x = mmt;
    x.insert(x.end(), {"--arg", std::string("ffn=") + f});
    return stash("mmt", x);
  };
  CHECK(ffn("4096") == 256.0 * 1024 * (34 + 5 * 16 * 256.0 / 1024));
  CHECK(ffn("8192") - ffn("4096") == 4.0 * 256 * 4096);
}

TEST_CASE("the head's logits in the backward's workspace are split over the vocabulary with or without SP") {
  // A GPT of 4 layers (V 51,200, s 1,024) at t 4 on one stage: the last device's workspace is its
  // share of the logits, s x V / t x 2 bytes = 26,214,400, with sequence parallelism or without (it
  // took the whole vocabulary without, until 2026-12-05). Workspace: peak - static - activations.
  TempDir tmp;
  const std::string exp = tmp.write(
      "g.yaml",
      "workload: {model: gpt, layers: 4, hidden: 1024, heads: 16, sequence: 1024, vocabulary: 51200, "
      "precision: amp}\n"
      "cluster: {preset: dgx-h100-8}\n"
      "strategy: {partitioner: megatron, schedule: 1f1b, stages: 1, replicas: 1, tensor_parallel: 4, "
      "micro_batch_size: 1, global_batch: 8}\n"
      "memory: {optimizer: mixed-adam, recompute: none}\n");
  for (const char* sp : {"false", "true"}) {
    CAPTURE(sp);
    auto r = run_command(
        {PIPEGRID_BINARY, "run", exp, "--json", "--set", std::string("strategy.sequence_parallel=") + sp});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    const auto& d = j["devices"][0];
    const double ws = d["peak_memory_bytes"].get<double>() - d["static_memory_bytes"].get<double>() -
                      d["peak_activation_bytes"].get<double>();
    CHECK(ws == 1024.0 * 51200 / 4 * 2);
  }
}

TEST_CASE("a list or a mapping where a value was expected is quoted in the message, cut at 40 bytes") {
  // It said "got a list" without what the list held (--set cluster.dims=[16] and the like).
  auto short_list = run_command({PIPEGRID_BINARY, "run", "--set", "strategy.stages=[1,2,3]"});
  CHECK(short_list.exit_code == 2);
  CHECK(short_list.err.find("strategy.stages: expected a positive integer, got a list [1, 2, 3]\n") !=
        std::string::npos);
  auto map = run_command({PIPEGRID_BINARY, "run", "--set", "strategy.stages={a: 1}"});
  CHECK(map.exit_code == 2);
  CHECK(map.err.find("got a mapping {a: 1}\n") != std::string::npos);
  // A long one: its first 37 bytes and "...".
  auto long_list = run_command({PIPEGRID_BINARY, "run", "--set",
                                "strategy.stages=[1111111111,2222222222,3333333333,4444444444,5555555555]"});
  CHECK(long_list.exit_code == 2);
  CHECK(long_list.err.find("got a list [1111111111, 2222222222, 3333333333, ...\n") != std::string::npos);
}
