// `pipegrid run` outputs beyond the summary: CSVs, infeasible runs, plots; and `pipegrid schedule`.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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

std::vector<std::vector<std::string>> csv_rows(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream l(line);
    std::string cell;
    while (std::getline(l, cell, ',')) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.push_back("");
    rows.push_back(cells);
  }
  return rows;
}

// The chain of the issue on 4 GPUs with 300 MiB each: static memory alone is 2 layers x 64 MiB x 4.
const char* kTight = R"(
workload: {kind: chain, layers: 8, forward: 1ms, backward: 2ms, activation: 8MiB, parameters: 64MiB}
cluster: {kind: switch, count: 4, device: {name: gpu, memory: 600MiB}, bandwidth: 25GBps, latency: 1us}
strategy: {schedule: gpipe, micro_batches: 8}
)";

bool has_matplotlib() {
  for (const char* py : {"/usr/bin/python3", "python3"})
    if (run_command({"/usr/bin/env", py, "-c", "import matplotlib"}).exit_code == 0) return true;
  return false;
}

}  // namespace

TEST_CASE("an over-capacity run is reported infeasible (device, peak, capacity), with its trace written") {
  TempDir tmp;
  const std::string exp = tmp.write("tight.yaml", kTight);
  const std::string trace = (tmp.path / "t.json").string();
  auto r = run_command({PIPEGRID_BINARY, "run", exp, "--json", "--trace", trace});
  REQUIRE(r.exit_code == 0);
  json j = json::parse(r.out);
  CHECK(j["feasible"] == false);
  // GPipe: 8 micro-batches x 2 layers x 8 MiB stashed on every stage + 512 MiB static > 600 MiB.
  REQUIRE(j["infeasible"].size() == 4);
  CHECK(j["infeasible"][0]["device"] == "gpu0");
  CHECK(j["infeasible"][0]["capacity_bytes"].get<double>() == 600.0 * (1 << 20));
  CHECK(j["infeasible"][0]["peak_memory_bytes"].get<double>() ==
        pipegrid::testing::approx(512.0 * (1 << 20) + 8 * 16.0 * (1 << 20) + 8.0 * (1 << 20)));
  CHECK(json::parse(read_file(trace))["traceEvents"].size() > 0);
  auto summary = run_command({PIPEGRID_BINARY, "run", exp});
  CHECK(summary.exit_code == 0);
  CHECK(summary.out.find("INFEASIBLE: gpu0 needs 648 MiB but has 600 MiB") != std::string::npos);
}

TEST_CASE("--tasks and --memory CSVs: every task once, memory steps matching the reported peaks") {
  TempDir tmp;
  const std::string tasks = (tmp.path / "tasks.csv").string(), memory = (tmp.path / "memory.csv").string();
  auto r = run_command({PIPEGRID_BINARY, "run", "--json", "--tasks", tasks, "--memory", memory});
  REQUIRE(r.exit_code == 0);
  json j = json::parse(r.out);
  auto rows = csv_rows(read_file(tasks));
  REQUIRE(rows.size() > 1);
  CHECK(rows[0] == std::vector<std::string>{"device", "stage", "kind", "micro_batch", "start_s", "end_s",
                                            "peer", "bytes"});
  std::map<std::string, int> compute;
  double end = 0;
  for (size_t i = 1; i < rows.size(); ++i) {
    if (rows[i][2] == "forward" || rows[i][2] == "backward") ++compute[rows[i][0]];
    end = std::max(end, std::stod(rows[i][5]));
  }
  for (int d = 0; d < 4; ++d) CHECK(compute["gpu" + std::to_string(d)] == 16);  // 8 F + 8 B
  CHECK(end == pipegrid::testing::approx(j["iteration_time_s"].get<double>()).epsilon(1e-9));
  auto mem = csv_rows(read_file(memory));
  CHECK(mem[0] == std::vector<std::string>{"device", "time_s", "weights", "gradients", "optimizer",
                                           "activations", "workspace", "total"});
  std::map<std::string, double> peak, act;
  for (size_t i = 1; i < mem.size(); ++i) {
    peak[mem[i][0]] = std::max(peak[mem[i][0]], std::stod(mem[i][7]));
    act[mem[i][0]] = std::max(act[mem[i][0]], std::stod(mem[i][5]));
  }
  for (const json& d : j["devices"]) {
    CHECK(peak[d["name"]] == pipegrid::testing::approx(d["peak_memory_bytes"].get<double>()));
    CHECK(act[d["name"]] == pipegrid::testing::approx(d["peak_activation_bytes"].get<double>()));
  }
}

TEST_CASE("--plot draws a Gantt and a memory figure (PNG and SVG) for the built-in example") {
  if (!has_matplotlib()) {
    MESSAGE("skipped: python3-matplotlib is not installed (apt-get install python3-matplotlib)");
    return;
  }
  TempDir tmp;
  const std::string dir = (tmp.path / "plots").string();
  auto r = run_command({PIPEGRID_BINARY, "run", "--plot", dir});
  REQUIRE(r.exit_code == 0);
  for (const char* name : {"timeline", "memory"}) {
    const std::string png = read_file(dir + "/" + name + ".png");
    CHECK(png.size() > 10000);
    CHECK(png.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
    const std::string svg = read_file(dir + "/" + name + ".svg");
    CHECK(svg.find("<svg") != std::string::npos);
    CHECK(svg.size() > 10000);
  }
}

TEST_CASE("pipegrid schedule --moe-overlap prints Megatron-Core's order under the all-to-all overlap") {
  // interleaved-1f1b, p 2, v 2, m 4: the hand count of tests/core/schedules_test.cc, as torch's CSV.
  auto csv = run_command({PIPEGRID_BINARY, "schedule", "interleaved-1f1b", "-p", "2", "-m", "4", "-v", "2",
                          "--moe-overlap", "--csv"});
  CHECK(csv.exit_code == 0);
  CHECK(csv.out ==
        "0F0,0F1,2F0,2F1,0F2,(0F3;2B0)OVERLAP_F_B,(2F2;2B1)OVERLAP_F_B,(2F3;0B0)OVERLAP_F_B,0B1,2B2,2B3,0B2,"
        "0B3\n"
        "1F0,1F1,3F0,(3F1;3B0)OVERLAP_F_B,(1F2;3B1)OVERLAP_F_B,(1F3;1B0)OVERLAP_F_B,(3F2;1B1)OVERLAP_F_B,"
        "(3F3;3B2)OVERLAP_F_B,3B3,1B2,1B3\n");
  // Without a pipeline, Megatron-Core's combined order (combined_1f1b.py).
  auto one =
      run_command({PIPEGRID_BINARY, "schedule", "1f1b", "-p", "1", "-m", "3", "--moe-overlap", "--csv"});
  CHECK(one.out == "0F0,(0F1;0B0)OVERLAP_F_B,(0F2;0B1)OVERLAP_F_B,0B2\n");
  // Outside Megatron-Core's rules: refused, as the experiment parser refuses moe.overlap.
  auto plain = run_command({PIPEGRID_BINARY, "schedule", "1f1b", "-p", "2", "-m", "4", "--moe-overlap"});
  CHECK(plain.exit_code == 2);
  CHECK(plain.err.find("--moe-overlap: with a pipeline (p = 2) Megatron-Core requires a virtual pipeline") !=
        std::string::npos);
}

TEST_CASE("pipegrid schedule prints the grid and the CSV of a schedule") {
  // zb-h1, p = 2, m = 2 by its rule: worker 0 runs W right after B; worker 1 keeps one W pending. The
  // split backward's input gradient is written as torch does, I (BACKWARD_INPUT): torch reads B as
  // FULL_BACKWARD, input and weight gradients together.
  auto csv =
      run_command({PIPEGRID_BINARY, "schedule", "zb-h1", "--stages", "2", "--micro-batches", "2", "--csv"});
  CHECK(csv.exit_code == 0);
  CHECK(csv.out == "0F0,0F1,0I0,0W0,0I1,0W1\n1F0,1I0,1F1,1I1,1W0,1W1\n");
  auto grid = run_command({PIPEGRID_BINARY, "schedule", "1f1b", "-p", "2", "-m", "2"});
  CHECK(grid.exit_code == 0);
  CHECK(grid.out ==
        "step   rank 0   rank 1\n"
        "0      0F0      1F0\n"
        "1      0F1      1B0\n"
        "2      0B0      1F1\n"
        "3      0B1      1B1\n");
  TempDir tmp;
  auto back = run_command({PIPEGRID_BINARY, "schedule", "file", "-p", "2", "-m", "2", "--csv", "--file",
                           tmp.write("s.csv", csv.out)});
  CHECK(back.out == csv.out);
  auto bad = run_command({PIPEGRID_BINARY, "schedule", "1f1b", "-p", "4", "-m", "8", "--chunks", "2"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err == "pipegrid: --chunks 2: chunks need interleaved-1f1b, dualpipev or file, not 1f1b\n");
  // interleaved-1f1b without --chunks printed 1F1B, and --file beside another schedule was ignored,
  // even a file that does not exist (until 2026-12-05; docs/schedules.md: not a silent 1F1B).
  auto unchunked = run_command({PIPEGRID_BINARY, "schedule", "interleaved-1f1b", "-p", "2", "-m", "4"});
  CHECK(unchunked.exit_code == 2);
  CHECK(unchunked.err ==
        "pipegrid: interleaved-1f1b needs --chunks, the model chunks per rank (at least 2; with 1 it is "
        "another "
        "schedule)\n");
  auto file =
      run_command({PIPEGRID_BINARY, "schedule", "1f1b", "-p", "2", "-m", "2", "--file", "/nonexistent.csv"});
  CHECK(file.exit_code == 2);
  CHECK(file.err ==
        "pipegrid: --file: 1f1b does not read a schedule file (`pipegrid schedule file --file CSV` does)\n");
}
