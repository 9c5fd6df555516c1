// Clusters from the command line: presets, cluster files, `cluster show/bench/export`, and
// experiments on presets, against hand computations from the link figures.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "tests/support/experiments.h"
#include "tests/support/process.h"

using nlohmann::json;
using pipegrid::testing::run_command;
namespace fs = std::filesystem;

namespace {

// A scratch directory for the files a case writes, removed at the end of the case.
class Scratch {
 public:
  Scratch() {
    char pattern[] = "/tmp/pipegrid-cluster-XXXXXX";
    dir_ = mkdtemp(pattern);
  }
  ~Scratch() { fs::remove_all(dir_); }
  std::string file(const std::string& name, const std::string& text = "") const {
    if (!text.empty()) std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  }

 private:
  fs::path dir_;
};

json run_json(const std::vector<std::string>& args) {
  std::vector<std::string> argv{PIPEGRID_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = run_command(argv);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return json::parse(r.out);
}

bool close(double a, double b, double rel) {
  return std::fabs(a - b) <= rel * std::max(std::fabs(a), std::fabs(b));
}

const char* kRing = R"(
kind: ring
name: test-ring
count: 5
device: {name: gpu, model: a100}
bandwidth: 10GBps
latency: 2us
)";

// The README's cluster file, completed: a GPU box and an FPGA pair on two leaf switches.
const char* kWritten = R"(
name: two-boxes
devices:
  - {name: gpu, count: 4, model: a100, node: box0}
  - {name: fpga0, model: u280, memory: 32GB}
  - {name: fpga1, model: u280}
switches: [box0-nvswitch, {name: leaf, count: 2}]
links:
  - {between: [gpu0, box0-nvswitch], bandwidth: 300GBps, latency: 0.5us}
  - {between: [gpu1, box0-nvswitch], bandwidth: 300GBps, latency: 0.5us}
  - {between: [gpu2, box0-nvswitch], bandwidth: 300GBps, latency: 0.5us}
  - {between: [gpu3, box0-nvswitch], bandwidth: 300GBps, latency: 0.5us}
  - {between: [box0-nvswitch, leaf0], bandwidth: 50GBps, latency: 1us}
  - {between: [leaf0, leaf1], bandwidth: 25GBps, latency: 1us}
  - {between: [fpga0, leaf1], bandwidth: 100Gbps, latency: 1us, duplex: shared}
  - {between: [fpga1, leaf1], bandwidth: 100Gbps, latency: 1us}
  - {between: [fpga0, fpga1], bandwidth: 100Gbps, latency: 0.5us}
routes:
  - {path: [gpu0, box0-nvswitch, gpu1], symmetric: true}
  - {path: [fpga1, leaf1, fpga0], symmetric: false}
)";

}  // namespace

TEST_CASE("cluster show names a fat-tree's routing: destination-mod-k, not shortest paths") {
  // The fat-tree and dgx generators route by destination-mod-k (core/cluster.h); show said shortest
  // paths until 2026-12-05.
  Scratch s;
  const std::string ft = s.file("ft.yaml",
                                "kind: fat-tree\nk: 4\ndevice: {name: gpu, model: a100}\n"
                                "bandwidth: 25GBps\nlatency: 1us\n");
  CHECK(run_json({"cluster", "show", ft, "--json"})["routing"] == "destination-mod-k");
  CHECK(run_json({"cluster", "show", s.file("ring.yaml", kRing), "--json"})["routing"] == "shortest-path");
}

TEST_CASE("a preset refined by sharing or collective_engine says so in its name, as by any other key") {
  // Both were applied and left out of the name until 2026-12-05: an FPGA preset without its engine
  // (5.58 ms against 7.82 ms an iteration) read as the preset itself.
  Scratch s;
  const std::string chain =
      "workload: {kind: chain, layers: 8, forward: 1ms, backward: 2ms, activation: 8MiB, parameters: 64MiB, "
      "samples_per_micro_batch: 4}\nstrategy: {partitioner: uniform, stages: 2, replicas: 4, micro_batches: "
      "8}\n";
  CHECK(
      run_json({"run",
                s.file("a.yaml", chain + "cluster: {preset: fpga-switch-u280-8, collective_engine: none}\n"),
                "--json"})["hardware"]["cluster"] == "fpga-switch-u280-8 (collective_engine=none)");
  CHECK(
      run_json({"run",
                s.file("b.yaml", chain + "cluster: {preset: fpga-switch-u280-8, count: 16, sharing: tcp}\n"),
                "--json"})["hardware"]["cluster"] == "fpga-switch-u280-8 (count=16, sharing=tcp)");
}

TEST_CASE("a cluster file written out: mixed devices, counted names, shared links, given routes") {
  Scratch s;
  const std::string file = s.file("two-boxes.yaml", kWritten);
  json j = run_json({"cluster", "show", file, "--json"});
  CHECK(j["name"] == "two-boxes");
  REQUIRE(j["devices"].size() == 6);
  CHECK(j["devices"][3]["name"] == "gpu3");
  CHECK(j["devices"][3]["node"] == "box0");
  CHECK(j["devices"][4]["model"] == "u280");
  CHECK(j["devices"][4]["memory_bytes"] == 32e9);
  CHECK(j["switches"] == json({"box0-nvswitch", "leaf0", "leaf1"}));
  CHECK(j["links"][6]["duplex"] == "shared");
  CHECK(j["links"][6]["bandwidth_Bps"] == 12.5e9);
  CHECK(j["explicit_routes"] == 3);
  // gpu0 -> box0-nvswitch -> leaf0 -> leaf1 -> fpga0: 4 hops.
  CHECK(j["diameter_hops"] == 4);
  // The given route fpga1 -> leaf1 -> fpga0 (2 us) replaces the direct link (0.5 us) one way only.
  json there = run_json({"cluster", "bench", file, "--op", "p2p", "--from", "fpga1", "--to", "fpga0",
                         "--sizes", "1MB", "--json"})["results"];
  json back = run_json({"cluster", "bench", file, "--op", "p2p", "--from", "fpga0", "--to", "fpga1",
                        "--sizes", "1MB", "--json"})["results"];
  CHECK(close(there[0]["time_s"], 2e-6 + 1e6 / 12.5e9, 1e-6));
  CHECK(close(back[0]["time_s"], 0.5e-6 + 1e6 / 12.5e9, 1e-6));
}

TEST_CASE("every preset loads, and the device count in its name is the one it builds") {
  json list = run_json({"cluster", "list", "--json"})["presets"];
  REQUIRE(list.size() >= 10);
  const std::regex trailing_count(".*-([0-9]+)$");
  int counted = 0;
  for (const json& p : list) {
    std::smatch m;
    const std::string name = p["name"];
    CHECK(!p["description"].get<std::string>().empty());
    if (std::regex_match(name, m, trailing_count) && name.rfind("dgx", 0) != 0 &&
        name.rfind("summit", 0) != 0 && name.rfind("dragonfly", 0) != 0) {
      INFO(name);
      CHECK(p["devices"] == std::stoi(m[1]));
      ++counted;
    }
  }
  CHECK(counted >= 4);
  // DGX presets count nodes of 8 GPUs (dgx-a100-16: 16 GPUs) except the large ones named by GPUs.
  for (const json& p : list)
    if (p["name"] == "dgx-a100-16")
      CHECK(p["devices"] == 16);
    else if (p["name"] == "dgx-a100-1024")
      CHECK(p["devices"] == 1024);
    else if (p["name"] == "summit-32")
      CHECK(p["devices"] == 32);
}

TEST_CASE("sharing: max-min by default, tcp on request, in generated and written clusters") {
  Scratch s;
  CHECK(run_json({"cluster", "show", s.file("ring.yaml", kRing), "--json"})["sharing"] == "max-min");
  CHECK(run_json({"cluster", "show", s.file("tcp-ring.yaml", std::string(kRing) + "sharing: tcp\n"),
                  "--json"})["sharing"] == "tcp");
  const std::string written = R"(
sharing: tcp
devices: [{name: gpu, count: 2, model: a100}]
links: [{between: [gpu0, gpu1], bandwidth: 10GBps, latency: 1us}]
)";
  CHECK(run_json({"cluster", "show", s.file("pair.yaml", written), "--json"})["sharing"] == "tcp");
  CHECK(run_json({"cluster", "show", "dgx-a100-16", "--json"})["sharing"] == "max-min");
}

TEST_CASE("cluster show: devices, links, diameter and bisection bandwidth by hand") {
  json j = run_json({"cluster", "show", "dgx-a100-16", "--json"});
  CHECK(j["devices"].size() == 16);
  CHECK(j["devices"][8]["node"] == "dgx1");
  CHECK(j["devices"][8]["model"] == "a100");
  CHECK(j["switches"] == json({"dgx0-nvswitch", "dgx1-nvswitch", "ib-switch"}));
  CHECK(j["links"].size() == 32);
  CHECK(j["diameter_hops"] == 2);
  // The cheapest balanced split puts each node on one side: 8 InfiniBand links of 200 Gb/s.
  CHECK(j["bisection_bandwidth_Bps"] == 8 * 25e9);
  CHECK(j["bisection_exact"] == true);

  Scratch s;
  json ring = run_json({"cluster", "show", s.file("ring.yaml", kRing), "--json"});
  CHECK(ring["name"] == "test-ring");
  CHECK(ring["diameter_hops"] == 2);
  CHECK(ring["bisection_bandwidth_Bps"] == 2 * 10e9);
  auto human = run_command({PIPEGRID_BINARY, "cluster", "show", "fat-tree-1024"});
  CHECK(human.exit_code == 0);
  CHECK(human.out.find("1024 devices, 320 switches, 3072 links") != std::string::npos);
  CHECK(human.out.find("diameter: 6 hops") != std::string::npos);
  // Full bisection of a 16-ary fat-tree: k^3/8 = 512 links of 25 GB/s.
  CHECK(human.out.find("bisection bandwidth: 12.8 TB/s") != std::string::npos);
}

TEST_CASE(
    "cluster bench: p2p is a + S/B, ring all-reduce 2(n-1) a + 2(n-1)/n S/B, bus bandwidth as nccl-tests") {
  Scratch s;
  const std::string ring = s.file("ring.yaml", kRing);
  const double a = 2e-6, B = 10e9;
  const int n = 5;
  json all = run_json(
      {"cluster", "bench", ring, "--op", "allreduce", "--sizes", "1MB,100MB,1GB", "--json"})["results"];
  REQUIRE(all.size() == 3);
  for (const json& row : all) {
    const double S = row["bytes"];
    CHECK(row["op"] == "allreduce");
    const double t = row["time_s"];
    CHECK(close(t, 2.0 * (n - 1) * a + 2.0 * (n - 1) / n * S / B, 0.01));
    CHECK(close(row["bus_bandwidth_Bps"], S / t * 2.0 * (n - 1) / n, 1e-9));
  }
  // Large messages: the bus bandwidth approaches the link bandwidth, as nccl-tests' busbw does.
  CHECK(close(all[2]["bus_bandwidth_Bps"], B, 0.01));
  json p2p = run_json({"cluster", "bench", ring, "--op", "p2p", "--sizes", "1MB", "--from", "gpu1", "--to",
                       "gpu3", "--json"})["results"];
  CHECK(close(p2p[0]["time_s"], 2 * a + 1e6 / B, 1e-6));  // two hops
  CHECK(p2p[0]["op"] == "p2p");
}

TEST_CASE("cluster export --simgrid, then show the export: the same cluster") {
  Scratch s;
  const std::string out = s.file("dgx.xml");
  auto r = run_command({PIPEGRID_BINARY, "cluster", "export", "dgx-a100-16", "--simgrid", "-o", out});
  REQUIRE(r.exit_code == 0);
  json a = run_json({"cluster", "show", "dgx-a100-16", "--json"});
  json b = run_json({"cluster", "show", out, "--json"});
  CHECK(b["explicit_routes"] == 16 * 15);
  // The export writes every pair's route: the show says so (it said "shortest-path" until 2026-12-05).
  CHECK(a["routing"] == "shortest-path");
  CHECK(b["routing"] == "explicit");
  for (const char* key : {"explicit_routes", "routing"}) {
    b.erase(key);
    a.erase(key);
  }
  CHECK(a == b);
}

TEST_CASE(
    "cluster bench: an all-reduce of one device, sub-byte sizes and a size without a unit are refused") {
  // One device printed 0 s and "0 B/s" (bytes / 0 s is not 0); 0.5 B was benched as a message; "1"
  // was called not positive where its unit is missing.
  auto one = run_command({PIPEGRID_BINARY, "cluster", "bench", "dgx-a100-16", "--devices", "1"});
  CHECK(one.exit_code == 2);
  CHECK(one.err ==
        "pipegrid: cluster bench: --devices: an all-reduce over 1 device moves nothing (no time, no "
        "bandwidth); expected at least 2\n");
  // 0 and too many say where and what, as 1 does (their prefixes differed, 0's with a finite number).
  auto zero = run_command({PIPEGRID_BINARY, "cluster", "bench", "dgx-a100-16", "--devices", "0"});
  CHECK(zero.exit_code == 2);
  CHECK(zero.err.rfind("pipegrid: cluster bench: --devices: expected a positive whole number, got 0", 0) ==
        0);
  auto many = run_command({PIPEGRID_BINARY, "cluster", "bench", "dgx-a100-16", "--devices", "99"});
  CHECK(many.exit_code == 2);
  CHECK(many.err ==
        "pipegrid: cluster bench: --devices: expected at most the cluster's 16 devices, got 99\n");
  auto half = run_command({PIPEGRID_BINARY, "cluster", "bench", "dgx-a100-16", "--sizes", "0.5B"});
  CHECK(half.exit_code == 2);
  CHECK(half.err.find("expected whole byte counts of at least 1") != std::string::npos);
  auto bare = run_command({PIPEGRID_BINARY, "cluster", "bench", "dgx-a100-16", "--sizes", "1"});
  CHECK(bare.exit_code == 2);
  CHECK(bare.err.find("(the unit is missing)") != std::string::npos);
}

TEST_CASE("cluster commands: bad input exits with status 2 and says why") {
  auto none = run_command({PIPEGRID_BINARY, "cluster", "show", "dgx-a100-3"});
  CHECK(none.exit_code == 2);
  // The family's presets by device count (the number in a name counts devices), and the one to refine.
  CHECK(none.err.rfind(
            "pipegrid: no cluster file or preset named \"dgx-a100-3\" (the dgx-a100 presets, named by "
            "their device count: dgx-a100-16, dgx-a100-32, dgx-a100-1024, dgx-a100-4096, "
            "dgx-a100-16384; another size: refine one, {preset: dgx-a100-16, nodes: N}; presets: ",
            0) == 0);
  // A name with no family: the closest name.
  CHECK(run_command({PIPEGRID_BINARY, "cluster", "show", "dragonfly72"})
            .err.find("did you mean \"dragonfly-72\"?") != std::string::npos);
  // Older names still read their preset (issue 55: dgx-a100-2 counted nodes).
  auto old = run_command({PIPEGRID_BINARY, "cluster", "show", "dgx-a100-2"});
  CHECK(old.exit_code == 0);
  CHECK(old.out.rfind("cluster dgx-a100-16: 16 devices", 0) == 0);
  auto format = run_command({PIPEGRID_BINARY, "cluster", "export", "dgx-a100-16"});
  CHECK(format.exit_code == 2);
  CHECK(format.err == "pipegrid: cluster export: choose a format (--simgrid)\n");
  auto device =
      run_command({PIPEGRID_BINARY, "cluster", "bench", "dgx-a100-16", "--op", "p2p", "--to", "gpu99"});
  CHECK(device.exit_code == 2);
  CHECK(device.err == "pipegrid: --to: no device named \"gpu99\" in dgx-a100-16\n");
  auto size = run_command({PIPEGRID_BINARY, "cluster", "bench", "dgx-a100-16", "--sizes", "1MHz"});
  CHECK(size.exit_code == 2);
  CHECK(size.err ==
        "pipegrid: --sizes: expected a byte size like \"16GiB\", got \"1MHz\" (\"MHz\" is the unit of a "
        "frequency)\n");
  auto op = run_command({PIPEGRID_BINARY, "cluster", "bench", "dgx-a100-16", "--op", "broadcast"});
  CHECK(op.exit_code == 2);
  // Options the operation would ignore, and NCCL's pick on FPGAs (run until 2026-12-05: the p2p row
  // looked like a 4-device result, and the FPGA ring printed "runs multi-ring" under NCCL's name).
  auto devices =
      run_command({PIPEGRID_BINARY, "cluster", "bench", "dgx-a100-16", "--op", "p2p", "--devices", "4"});
  CHECK(devices.exit_code == 2);
  CHECK(devices.err == "pipegrid: --devices is for --op allreduce (--op p2p: --from and --to)\n");
  auto algorithm =
      run_command({PIPEGRID_BINARY, "cluster", "bench", "dgx-a100-16", "--op", "p2p", "--algorithm", "tree"});
  CHECK(algorithm.exit_code == 2);
  CHECK(algorithm.err == "pipegrid: --algorithm is for --op allreduce\n");
  auto nccl = run_command({PIPEGRID_BINARY, "cluster", "bench", "fpga-ring-u280-8", "--algorithm", "nccl"});
  CHECK(nccl.exit_code == 2);
  CHECK(
      nccl.err ==
      "pipegrid: --algorithm nccl: fpga-ring-u280-8 has devices other than GPUs (nccl is NCCL's pick, a GPU "
      "library); expected ring, hierarchical, multi-ring or tree\n");
}

TEST_CASE("dgx preset: a pipeline whose stages cross InfiniBand is slower by what the link figures predict") {
  // GPipe over p = 16 stages (one chain layer each, stage i on gpu<i>), m = 4, T_F = 1 ms,
  // T_BW = 2 ms, 8 MiB between stages. Every transfer is shorter than T_F, so it is hidden except on
  // the critical path, which crosses each boundary twice (activations, then gradients):
  //   iteration = (m + p - 1)(T_F + T_BW) + 2 sum over boundaries of c_i,
  // c = 2 latency + S / bandwidth of the two-link route. Inside one 16-GPU node every boundary is
  // NVLink (2 x 0.5 us, 300 GB/s); on dgx-a100-16 the gpu7 -> gpu8 boundary is InfiniBand (2 x 1 us,
  // 25 GB/s): slower by 2 (c_IB - c_NV).
  const std::string workload =
      "workload: {kind: chain, layers: 16, forward: 1ms, backward: 2ms, activation: 8MiB, parameters: 1MiB}\n"
      "strategy: {partitioner: uniform, schedule: gpipe, micro_batches: 4}\n";
  Scratch s;
  const std::string crossing = s.file("crossing.yaml", workload + "cluster: {preset: dgx-a100-16}\n");
  const std::string inside =
      s.file("inside.yaml", workload + "cluster: {kind: dgx, nodes: 1, gpus_per_node: 16, gpu: a100}\n");
  const double across = run_json({"run", crossing, "--json"})["iteration_time_s"];
  const double within = run_json({"run", inside, "--json"})["iteration_time_s"];
  const double S = 8.0 * (1 << 20);
  const double c_nv = 2 * 0.5e-6 + S / 300e9, c_ib = 2 * 1e-6 + S / 25e9;
  const double base = (4 + 16 - 1) * 3e-3;
  CHECK(close(within, base + 2 * 15 * c_nv, 1e-6));
  CHECK(close(across, base + 2 * (14 * c_nv + c_ib), 1e-6));
  CHECK(close(across - within, 2 * (c_ib - c_nv), 1e-4));
}

TEST_CASE("collective_engine: the FPGA presets run ACCL, a name, none, or a base with changed figures") {
  // topologies/engines.yaml's accl-tcp: 44.3 us per call, 16.6 us per message, 4.03 GB/s, sends 87.8 Gb/s.
  json e = run_json({"cluster", "show", "fpga-ring-u280-8", "--json"})["collective_engine"];
  CHECK(e["name"] == "accl-tcp");
  CHECK(pipegrid::testing::close_rel(e["call_s"].get<double>(), 44.3e-6, 1e-12));
  CHECK(pipegrid::testing::close_rel(e["step_s"].get<double>(), 16.6e-6, 1e-12));
  CHECK(pipegrid::testing::close_rel(e["bandwidth_Bps"].get<double>(), 4.03e9, 1e-12));
  CHECK(pipegrid::testing::close_rel(e["send_bandwidth_Bps"].get<double>(), 87.8e9 / 8, 1e-12));
  CHECK(run_json({"cluster", "show", "dgx-a100-16", "--json"})["collective_engine"].is_null());
  Scratch s;
  const std::string preset = "kind: fpga-ring\ncount: 4\ndevice: u280\n";
  CHECK(run_json({"cluster", "show", s.file("raw.yaml", preset + "collective_engine: none\n"),
                  "--json"})["collective_engine"]
            .is_null());
  json changed =
      run_json({"cluster", "show",
                s.file("xrt.yaml", preset + "collective_engine: {base: accl-tcp-pynq, call: 44.3us}\n"),
                "--json"})["collective_engine"];
  CHECK(changed["name"] == "accl-tcp-pynq (changed)");
  CHECK(pipegrid::testing::close_rel(changed["call_s"].get<double>(), 44.3e-6, 1e-12));
  CHECK(pipegrid::testing::close_rel(changed["step_s"].get<double>(), 16.6e-6, 1e-12));
  json custom = run_json({"cluster", "show", s.file("own.yaml", preset + "collective_engine: {step: 2us}\n"),
                          "--json"})["collective_engine"];
  CHECK(custom["name"] == "custom (changed)");
  CHECK(custom["call_s"].get<double>() == 0);
  CHECK(custom["bandwidth_Bps"].is_null());  // unbounded
  // `run` says so among its assumptions.
  const std::string experiment = R"(
workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 8MiB, parameters: 64MiB}
cluster: {preset: fpga-ring-u280-8}
strategy: {micro_batches: 4, replicas: 2, micro_batch_size: 1}
)";
  auto out = run_command({PIPEGRID_BINARY, "run", s.file("e.yaml", experiment)});
  CHECK(out.exit_code == 0);
  CHECK(out.out.find("FPGA collective engine accl-tcp (44.3 us per call, 16.6 us per message, 4.03 GB/s; "
                     "sends 10.97 GB/s)") != std::string::npos);
}

TEST_CASE("cluster show: devices of one kind with different figures are not counted as alike") {
  // Two hand-described devices (16 GiB / 10 TFLOP/s and 32 GiB / 20 TFLOP/s) are both `custom`: the
  // line said "2 x custom" as if they were one device twice.
  Scratch s;
  const std::string file = s.file("c.yaml", R"(
devices:
  - {name: a, memory: 16GiB, flops: 10TFLOPS}
  - {name: b, memory: 32GiB, flops: 20TFLOPS}
  - {name: c, model: a100}
  - {name: d, model: a100}
switches: [sw]
links:
  - {between: [a, sw], bandwidth: 25GBps, latency: 1us}
  - {between: [b, sw], bandwidth: 25GBps, latency: 1us}
  - {between: [c, sw], bandwidth: 25GBps, latency: 1us}
  - {between: [d, sw], bandwidth: 25GBps, latency: 1us}
)");
  auto r = run_command({PIPEGRID_BINARY, "cluster", "show", file});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("devices: 2 x a100, 2 x custom (2 different memories or peaks)\n") != std::string::npos);
}
