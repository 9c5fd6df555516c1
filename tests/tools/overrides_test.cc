// `--set KEY=VALUE` overrides and presets refined in place: the values reach the experiment, and
// bad paths or values get located errors that name the argument or the file position.
#include <doctest/doctest.h>

#include <string>

#include "tests/support/approx.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"
#include "tools/input/experiment_yaml.h"

using namespace pipegrid;
using pipegrid::testing::run_command;
using pipegrid::testing::TempDir;

namespace {

// A small FPGA experiment on the 8-board ring preset (VGG-16-sized layers are not needed: a chain).
const char* kPresetExperiment = R"(workload:
  kind: chain
  layers: 8
  forward: 1ms
  backward: 2ms
  activation: 1MiB
  parameters: 1MiB
cluster:
  preset: fpga-ring-u280-8
strategy:
  micro_batches: 8
)";

const char* kSwitchExperiment =
    R"(workload: {kind: chain, layers: 8, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 1MiB}
cluster:
  kind: switch
  count: 4
  device: {name: fpga, model: u280}
  bandwidth: 25GBps
  latency: 1us
strategy: {micro_batches: 8}
)";

Experiment load(const std::string& text, const std::vector<std::string>& sets = {}) {
  Result<Experiment> e = input::load_experiment_text(text, "exp.yaml", sets);
  if (!e) FAIL(e.error().message);
  return *e;
}

std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  Result<Experiment> e = input::load_experiment_text(text, "exp.yaml", sets);
  return e ? "" : e.error().message;
}

// The U280's fp32 peak with `dsps` DSPs: DSPs x 300 MHz x 0.2 MACs x 2 FLOPs (topologies/devices.yaml).
double u280_fp32_peak(double dsps) {
  return dsps * 300e6 * 0.2 * 2;
}

}  // namespace

TEST_CASE("--set changes scalars, adds keys, and refines a device given by catalog name") {
  const Experiment base = load(kSwitchExperiment);
  REQUIRE(base.cluster.devices.size() == 4);
  CHECK(base.cluster.devices[0].spec.fpga->dsps == 9024);
  const Experiment e =
      load(kSwitchExperiment, {"cluster.device.dsps=18048", "strategy.micro_batches=16", "cluster.count=6"});
  CHECK(e.strategy.micro_batches == 16);
  REQUIRE(e.cluster.devices.size() == 6);
  for (const Device& d : e.cluster.devices) {
    CHECK(d.spec.kind == "u280");  // `model: u280` kept
    CHECK(d.spec.fpga->dsps == 18048);
    CHECK(d.spec.peak(Precision::FP32) == pipegrid::testing::approx(u280_fp32_peak(18048)));
    CHECK(d.spec.memory_bytes == 8e9);  // the catalog's HBM, untouched
  }
  // A whole mapping as the value (YAML flow syntax), and a later --set wins over an earlier one.
  const Experiment m = load(
      kSwitchExperiment, {"cluster.device={name: f, model: u280-ddr}", "cluster.count=2", "cluster.count=3"});
  REQUIRE(m.cluster.devices.size() == 3);
  CHECK(m.cluster.devices[0].name == "f0");
  CHECK(m.cluster.devices[0].spec.memory_bytes == 32e9);  // the U280's DDR4 (catalog)
}

TEST_CASE("a preset is refined in place: its device and its generator keys") {
  const Experiment plain = load(kPresetExperiment);
  REQUIRE(plain.cluster.devices.size() == 8);
  const size_t plain_hosts = plain.cluster.switches.size();
  CHECK(plain_hosts == 4);  // 2 boards per host on PCIe (the preset's pcie: {per_host: 2})

  std::string refined = kPresetExperiment;
  refined.replace(refined.find("  preset: fpga-ring-u280-8\n"), 27,
                  "  preset: fpga-ring-u280-8\n  count: 16\n  device: {dsps: 18048}\n");
  const Experiment e = load(refined);
  REQUIRE(e.cluster.devices.size() == 16);
  CHECK(e.cluster.switches.size() == 8);  // still 2 boards per host
  for (const Device& d : e.cluster.devices) {
    CHECK(d.spec.kind == "u280");
    CHECK(d.spec.fpga->dsps == 18048);
    CHECK(d.spec.peak(Precision::FP32) == pipegrid::testing::approx(u280_fp32_peak(18048)));
  }
  // The same with --set on the plain preset experiment, and a link figure of the generator.
  const Experiment s =
      load(kPresetExperiment, {"cluster.device.dsps=4512", "cluster.qsfp.bandwidth=200Gbps"});
  REQUIRE(s.cluster.devices.size() == 8);
  CHECK(s.cluster.devices[3].spec.fpga->dsps == 4512);
  bool saw_qsfp = false;
  for (const Link& l : s.cluster.links)
    if (s.cluster.is_device(l.a) && s.cluster.is_device(l.b)) {
      CHECK(l.bandwidth == 25e9);  // 200 Gb/s = 25 GB/s
      saw_qsfp = true;
    }
  CHECK(saw_qsfp);
  // The preset's own torus keeps its `ports: 4` when its model changes.
  const Experiment t =
      load(kPresetExperiment, {"cluster.preset=fpga-torus-u280-4x4", "cluster.device.model=u280-ddr"});
  REQUIRE(t.cluster.devices.size() == 16);
  CHECK(t.cluster.devices[0].spec.fpga->ports == 4);
  CHECK(t.cluster.devices[0].spec.memory_bytes == 32e9);
}

TEST_CASE("bad --set arguments and bad refinements get located errors") {
  // A bad value: the argument is named, then the key path, expected and found.
  CHECK(
      error_of(kSwitchExperiment, {"cluster.device.dsps=abc"}) ==
      "--set cluster.device.dsps=abc: cluster.device.dsps: expected a positive number of DSPs, got \"abc\"");
  // A misspelt key: the unknown-key error names the argument, with the suggestion.
  const std::string typo = error_of(kSwitchExperiment, {"cluster.devcie.dsps=1"});
  CHECK(typo.rfind("--set cluster.devcie.dsps=1: cluster.devcie: unknown key (did you mean \"device\"?", 0) ==
        0);
  // A path through a scalar.
  CHECK(error_of(kSwitchExperiment, {"strategy.micro_batches.x=3"}) ==
        "--set strategy.micro_batches.x=3: cannot follow \"strategy.micro_batches.x\": "
        "strategy.micro_batches is "
        "\"8\", not a mapping");
  CHECK(error_of(kSwitchExperiment, {"cluster"}).rfind("--set cluster: expected KEY=VALUE", 0) == 0);
  CHECK(error_of(kSwitchExperiment, {"cluster.count="}) ==
        "--set cluster.count=: expected a value after \"cluster.count=\"");
  CHECK(error_of(kSwitchExperiment, {"cluster..count=2"})
            .find("bad key path \"cluster..count\": an empty key") != std::string::npos);
  // Inside a flow mapping the column is the one in the whole `--set ...` text.
  const std::string arg = "cluster.device={name: f, model: u280, dsps: x}";
  const std::string flow = error_of(kSwitchExperiment, {arg});
  const std::string name = "--set " + arg;
  const size_t column = name.find("x}") + 1;  // 1-based
  CHECK(flow == "--set " + arg + " (column " + std::to_string(column) +
                    "): cluster.device.dsps: expected a positive number of DSPs, got \"x\"");
  // A preset refined in the file: errors at the experiment's own positions (line 10 column 3 is
  // `cont`, line 11 column 18 the value of dsps).
  std::string refined = kPresetExperiment;
  refined.replace(refined.find("  preset: fpga-ring-u280-8\n"), 27,
                  "  preset: fpga-ring-u280-8\n  cont: 16\n  device: {dsps: lots}\n");
  CHECK(error_of(refined).rfind("exp.yaml:10:3: cluster.cont: unknown key (did you mean \"count\"?", 0) == 0);
  refined.replace(refined.find("  cont: 16\n"), 11, "");
  CHECK(error_of(refined) ==
        "exp.yaml:10:18: cluster.device.dsps: expected a positive number of DSPs, got \"lots\"");
}

TEST_CASE("pipegrid run --set: the override reaches the run, a bad one exits with status 2") {
  TempDir dir;
  const std::string exp = dir.write("exp.yaml", kSwitchExperiment);
  auto base = run_command({PIPEGRID_BINARY, "run", exp, "--json"});
  auto more = run_command({PIPEGRID_BINARY, "run", exp, "--json", "--set", "strategy.micro_batches=16"});
  REQUIRE(base.exit_code == 0);
  REQUIRE(more.exit_code == 0);
  CHECK(base.out.find("\"micro_batches\": 8") != std::string::npos);
  CHECK(more.out.find("\"micro_batches\": 16") != std::string::npos);
  auto bad = run_command({PIPEGRID_BINARY, "run", exp, "--set", "cluster.count=zero"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err ==
        "pipegrid: --set cluster.count=zero: cluster.count: expected a positive integer, got \"zero\"\n");
  auto plan = run_command({PIPEGRID_BINARY, "plan", exp, "--set", "strategy.micro_batches=0"});
  CHECK(plan.exit_code == 2);
  CHECK(
      plan.err.find("--set strategy.micro_batches=0: strategy.micro_batches: expected a positive integer") !=
      std::string::npos);
}
