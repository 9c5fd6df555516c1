// Sweep files: grids, zipped groups, ranges, scale factors, filters, the points they make, the
// experiments of those points, and located errors.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "tests/support/approx.h"
#include "tests/support/temp_dir.h"
#include "tools/input/experiment_yaml.h"
#include "tools/sweep/sweep.h"

using namespace pipegrid;
using pipegrid::sweep::Sweep;
using pipegrid::testing::TempDir;

namespace {

const char* kExperiment =
    R"(workload: {kind: chain, layers: 8, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 1MiB}
cluster: {kind: switch, count: 4, device: {name: gpu, memory: 16GiB}, bandwidth: 25GBps, latency: 1us}
strategy: {micro_batches: 8}
)";

std::string error_of(const TempDir& dir, const std::string& sweep) {
  try {
    Sweep s = Sweep::load(dir.write("sweep.yaml", sweep));
    (void)s.points();
  } catch (const input::InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the issue's sweep form: a grid of 3 x 2 and a zipped pair make 12 points") {
  TempDir dir;
  dir.write("experiment.yaml", kExperiment);
  const Sweep s = Sweep::load(dir.write("sweep.yaml", R"(base: experiment.yaml
grid:
  strategy.micro_batches: [4, 8, 16]
  cluster.count: [2, 4]
zip:
  cluster.bandwidth: [25GBps, 50GBps]
  cluster.latency: [1us, 2us]
)"));
  REQUIRE(s.axes().size() == 4);
  CHECK(s.grid_size() == 3 * 2 * 2);
  const std::vector<size_t> all = s.points();
  CHECK(all.size() == 12);
  // Row-major, the first axis slowest: point 7 = (micro_batches index 1, count 1, zip 1).
  // 7 = 1 * (2 * 2) + 1 * 2 + 1.
  CHECK(s.value_indices(7) == std::vector<size_t>{1, 1, 1, 1});
  CHECK(s.value_indices(4) == std::vector<size_t>{1, 0, 0, 0});
  CHECK(s.describe(7) ==
        "strategy.micro_batches=8 cluster.count=4 cluster.bandwidth=50GBps cluster.latency=2us");
  CHECK(s.axis_values(7)["strategy.micro_batches"] == 8);  // a number, not text
  CHECK(s.axis_values(7)["cluster.bandwidth"] == "50GBps");
  // Every combination once: the 12 (mb, count, bandwidth) triples are distinct.
  std::set<std::string> seen;
  for (size_t p : all) seen.insert(s.describe(p));
  CHECK(seen.size() == 12);
  // The point's experiment has the values.
  const input::Document doc = s.experiment_document(7);
  const Experiment e = input::parse_experiment(doc);
  CHECK(e.strategy.micro_batches == 8);
  CHECK(e.cluster.devices.size() == 4);
  for (const Link& l : e.cluster.links) {
    CHECK(l.bandwidth == 50e9);
    CHECK(l.latency == pipegrid::testing::approx(2e-6));
  }
}

TEST_CASE("ranges, scale factors of a preset's catalog device, and filters") {
  TempDir dir;
  const Sweep s = Sweep::load(dir.write("sweep.yaml", R"(experiment:
  workload: {kind: chain, layers: 8, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 1MiB}
  cluster: {preset: fpga-ring-u280-8}
  strategy: {micro_batches: 8}
grid:
  cluster.device.dsps: {scale: [0.5, 1, 2, 4]}
  cluster.qsfp.bandwidth: {from: 100Gbps, to: 400Gbps, times: 2}
  strategy.micro_batches: {from: 4, to: 16, step: 4}
where: "strategy.micro_batches * 2 <= 24 and cluster.qsfp.bandwidth > 12.5GBps"
skip: ["cluster.device.dsps == 36096 and strategy.micro_batches == 4"]
)"));
  REQUIRE(s.axes().size() == 3);
  // The U280 has 9,024 DSPs (topologies/devices.yaml): 0.5x .. 4x.
  CHECK(s.axes()[0].labels == std::vector<std::string>{"4512", "9024", "18048", "36096"});
  CHECK(s.axes()[1].labels == std::vector<std::string>{"100Gbps", "200Gbps", "400Gbps"});
  CHECK(s.axes()[2].labels == std::vector<std::string>{"4", "8", "12", "16"});
  CHECK(s.grid_size() == 4 * 3 * 4);
  // where: micro_batches in {4, 8, 12} (x2 <= 24) and bandwidth above 100 Gb/s (= 12.5 GB/s):
  // 4 x 2 x 3 = 24 points; skip drops 36096 DSPs with 4 micro-batches: 2 points (two bandwidths).
  CHECK(s.points().size() == 24 - 2);
  for (size_t p : s.points()) {
    const std::vector<size_t> idx = s.value_indices(p);
    CHECK(idx[1] >= 1);
    CHECK(idx[2] <= 2);
    CHECK_FALSE((idx[0] == 3 && idx[2] == 0));
  }
  // The scaled value reaches the device.
  const size_t first = s.points().front();
  const Experiment e = input::parse_experiment(s.experiment_document(first));
  CHECK(e.cluster.devices[0].spec.fpga->dsps == 4512);
}

TEST_CASE("bad sweep files get located errors") {
  TempDir dir;
  dir.write("experiment.yaml", kExperiment);
  CHECK(
      error_of(
          dir,
          "base: experiment.yaml\nzip:\n  cluster.bandwidth: [25GBps, 50GBps]\n  cluster.latency: [1us]\n") ==
      dir.path.string() +
          "/sweep.yaml:4:20: zip.cluster.latency: expected 2 values (as cluster.bandwidth), got 1: "
          "zipped lists have equal lengths");
  CHECK(error_of(dir, "base: experiment.yaml\ngrid:\n  cluster.count: [2, 4]\nwhere: cluster.cuont > 2\n")
            .find("sweep.yaml:4:8: where: in the filter \"cluster.cuont > 2\" at character 1: "
                  "\"cluster.cuont\" is not an axis "
                  "(did you mean \"cluster.count\"?") != std::string::npos);
  CHECK(error_of(dir, "base: experiment.yaml\ngrid:\n  cluster.device.dsps: {scale: [2]}\n") ==
        dir.path.string() +
            "/sweep.yaml:3:32: grid.cluster.device.dsps.scale: the base experiment gives cluster.device.dsps "
            "no value to scale "
            "(write `of: VALUE`)");
  CHECK(error_of(dir, "base: experiment.yaml\ngrid:\n  cluster.count: {from: 4, to: 2, step: 1}\n")
            .find("sweep.yaml:3:32: grid.cluster.count.to: expected a value at least from's 4, got 2") !=
        std::string::npos);
  CHECK(error_of(dir, "base: nothere.yaml\n").find("nothere.yaml") != std::string::npos);
  CHECK(error_of(dir, "base: experiment.yaml\ngrid:\n  cluster.count: [2]\n  cluster.count: [3]\n")
            .find("duplicate key") != std::string::npos);
  // Filters deep or long enough to exhaust the stack (parser, evaluation, destruction) are refused
  // with a located error; the message shows the start of the filter only.
  const std::string deep = "base: experiment.yaml\ngrid:\n  cluster.count: [2, 4]\nwhere: \"" +
                           std::string(100000, '(') + "cluster.count > 2" + std::string(100000, ')') + "\"\n";
  const std::string deep_error = error_of(dir, deep);
  CHECK(deep_error.find("sweep.yaml:4:8: where: in the filter \"((((") != std::string::npos);
  CHECK(deep_error.find("at character 102: nested deeper than 100 levels") != std::string::npos);
  CHECK(deep_error.size() < 400);
  std::string sum = "1";
  for (int k = 0; k < 50000; ++k) sum += " + 1";
  CHECK(error_of(dir, "base: experiment.yaml\ngrid:\n  cluster.count: [2, 4]\nwhere: \"" + sum + " > 2\"\n")
            .find("more than 1000 operations: split it into a list of conditions") != std::string::npos);
  // 100 levels and 1,000 operations are still read.
  CHECK(error_of(dir, "base: experiment.yaml\ngrid:\n  cluster.count: [2, 4]\nwhere: \"" +
                          std::string(99, '(') + "cluster.count > 2" + std::string(99, ')') + "\"\n") == "");
  // Keys that are no text name no axis (found by fuzzing: the reader dereferenced a missing value).
  CHECK(error_of(dir, "base: experiment.yaml\nzip:\n  : [8, 8]\n") ==
        dir.path.string() +
            "/sweep.yaml:3:3: zip: expected a key path like strategy.micro_batches, got nothing");
  CHECK(error_of(dir, "base: experiment.yaml\ngrid:\n  [a, b]: [8, 8]\n") ==
        dir.path.string() +
            "/sweep.yaml:3:3: grid: expected a key path like strategy.micro_batches, got a list [a, b]");
}

// Quantities keep their kind: a bandwidth compared with a time or a bare number was compared by its SI
// value (1e10 > 4e-5) until 2026-12-05 and kept every point. Products and quotients combine kinds.
TEST_CASE("filters refuse quantities of different kinds and combine kinds through * and /") {
  TempDir dir;
  dir.write("experiment.yaml", kExperiment);
  const std::string grid =
      "base: experiment.yaml\ngrid:\n  cluster.bandwidth: [10GBps, 50GBps]\n"
      "  strategy.micro_batches: [4, 8]\nwhere: \"";
  CHECK(error_of(dir, grid + "cluster.bandwidth > 40us\"\n") ==
        dir.path.string() + "/sweep.yaml:5:8: where: cannot use > with a bandwidth and a time");
  CHECK(error_of(dir, grid + "cluster.bandwidth == 10\"\n") ==
        dir.path.string() +
            "/sweep.yaml:5:8: where: cannot use == with a bandwidth and a number (give the number its unit, "
            "e.g. 40GBps, or the axis values theirs)");
  CHECK(error_of(dir, grid + "cluster.bandwidth + 1ms > 2GBps\"\n") ==
        dir.path.string() + "/sweep.yaml:5:8: where: cannot use + with a bandwidth and a time");
  CHECK(error_of(dir, grid + "cluster.bandwidth * cluster.bandwidth > 1GBps\"\n")
            .find("cannot use > with a quantity in s^-2 B^2 and a bandwidth") != std::string::npos);
  // 10 GB/s x 1 ms = 10 MB, 50 GB/s x 1 ms = 50 MB: the 50 GB/s points (2 of 4).
  TempDir d2;
  d2.write("experiment.yaml", kExperiment);
  CHECK(Sweep::load(d2.write("sweep.yaml", grid + "cluster.bandwidth * 1ms > 40MB\"\n")).points() ==
        std::vector<size_t>{2, 3});
  // 50 GB/s / 4 = 12.5 GB/s >= 10 GB/s; 50 / 8, 10 / 4 and 10 / 8 are below: point 2 alone.
  TempDir d3;
  d3.write("experiment.yaml", kExperiment);
  CHECK(Sweep::load(d3.write("sweep.yaml", grid + "cluster.bandwidth / strategy.micro_batches >= 10GBps\"\n"))
            .points() == std::vector<size_t>{2});
}

TEST_CASE("a bad value in a sweep is located in the sweep file when its point is read") {
  TempDir dir;
  dir.write("experiment.yaml", kExperiment);
  const Sweep s =
      Sweep::load(dir.write("sweep.yaml", "base: experiment.yaml\ngrid:\n  cluster.count: [2, many]\n"));
  CHECK(input::parse_experiment(s.experiment_document(0)).cluster.devices.size() == 2);
  std::string error;
  try {
    (void)input::parse_experiment(s.experiment_document(1));
  } catch (const input::InputError& e) {
    error = e.what();
  }
  CHECK(error ==
        dir.path.string() + "/sweep.yaml:3:22: cluster.count: expected a positive integer, got \"many\"");
}

TEST_CASE("filters: a division by zero and a condition that is no true/false are located errors") {
  // Until 2026-12-05 0 / 0 was NaN (kept by ==, dropped by <) and 4 / 0 was inf, without a word; a
  // condition giving a number named the sweep file without its line.
  TempDir dir;
  dir.write("experiment.yaml", kExperiment);
  const std::string grid = "base: experiment.yaml\ngrid:\n  strategy.micro_batches: [4, 8]\nwhere: \"";
  const std::string at = dir.path.string() + "/sweep.yaml:4:8: where: ";
  CHECK(error_of(dir, grid + "0 / 0 == 0 / 0\"\n") ==
        at +
            "a division by zero at this point (guard it: `DIVISOR != 0 and ...` is evaluated left to right)");
  CHECK(error_of(dir, grid + "strategy.micro_batches / (strategy.micro_batches - 4) > 0\"\n")
            .find("a division by zero") != std::string::npos);
  // The guard works: 8 / 4 = 2 > 0 keeps point 1; point 0 stops at its guard.
  TempDir d2;
  d2.write("experiment.yaml", kExperiment);
  CHECK(Sweep::load(d2.write("sweep.yaml", grid + "strategy.micro_batches != 4 and strategy.micro_batches / "
                                                  "(strategy.micro_batches - 4) > 0\"\n"))
            .points() == std::vector<size_t>{1});
  CHECK(error_of(dir, grid + "1e300 * 1e300 > 1\"\n") == at + "* gives a number too large at this point");
  CHECK(error_of(dir, grid + "strategy.micro_batches + 1\"\n") ==
        at + "a where condition gives a number, not true/false");
  CHECK(error_of(dir, "base: experiment.yaml\ngrid:\n  strategy.micro_batches: [4, 8]\nskip: 5\n") ==
        dir.path.string() + "/sweep.yaml:4:7: skip: a skip condition gives a number, not true/false");
}

TEST_CASE("an axis path with an unknown key is located at the axis in the sweep file") {
  TempDir dir;
  dir.write("experiment.yaml", kExperiment);
  const Sweep s = Sweep::load(
      dir.write("sweep.yaml", "base: experiment.yaml\ngrid:\n  strategy.micro_batchez: [2, 4]\n"));
  std::string error;
  try {
    (void)input::parse_experiment(s.experiment_document(0));
  } catch (const input::InputError& e) {
    error = e.what();
  }
  // Until 2026-12-05: "sweep.yaml: strategy.micro_batchez: unknown key ...", with no line.
  CHECK(error.starts_with(dir.path.string() +
                          "/sweep.yaml:3:3: strategy.micro_batchez: unknown key (did you mean"));
}

TEST_CASE("a sweep's fingerprint covers its base and axes, not its filters or name") {
  TempDir dir;
  dir.write("experiment.yaml", kExperiment);
  const std::string grid =
      "base: experiment.yaml\ngrid:\n  cluster.count: [2, 4]\n  strategy.micro_batches: [4, 8]\n";
  const std::string a = Sweep::load(dir.write("a.yaml", grid)).fingerprint();
  // Filters and the name change which points run, not what a point number means.
  CHECK(
      Sweep::load(dir.write("b.yaml", "name: x\n" + grid + "skip: \"cluster.count == 2\"\n")).fingerprint() ==
      a);
  // A value, the order of the axes, a grid axis made a zip group, or the base experiment: another sweep.
  CHECK(Sweep::load(
            dir.write(
                "c.yaml",
                "base: experiment.yaml\ngrid:\n  cluster.count: [2, 3]\n  strategy.micro_batches: [4, 8]\n"))
            .fingerprint() != a);
  CHECK(Sweep::load(
            dir.write(
                "d.yaml",
                "base: experiment.yaml\ngrid:\n  strategy.micro_batches: [4, 8]\n  cluster.count: [2, 4]\n"))
            .fingerprint() != a);
  CHECK(Sweep::load(
            dir.write(
                "e.yaml",
                "base: experiment.yaml\nzip:\n  cluster.count: [2, 4]\n  strategy.micro_batches: [4, 8]\n"))
            .fingerprint() != a);
  dir.write("experiment.yaml", std::string(kExperiment) + "memory: {optimizer: sgd}\n");
  CHECK(Sweep::load(dir.write("f.yaml", grid)).fingerprint() != a);
}
