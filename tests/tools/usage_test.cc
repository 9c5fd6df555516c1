// A newcomer's first commands: --version, list and its sections, usage errors with suggestions,
// `run -`, defaults in --help, workload show's micro-batch size.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "tests/support/approx.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

using nlohmann::json;
using pipegrid::testing::CommandResult;
using pipegrid::testing::run_command;
using pipegrid::testing::TempDir;

namespace {

CommandResult pg(std::vector<std::string> args) {
  args.insert(args.begin(), PIPEGRID_BINARY);
  return run_command(args);
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

}  // namespace

TEST_CASE("pipegrid --version prints the project version") {
  auto r = pg({"--version"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "pipegrid 0.1.0\n");
  CHECK(r.err.empty());
}

TEST_CASE("pipegrid list: eight sections in order, one line per entry, and one section alone") {
  auto all = pg({"list"});
  REQUIRE(all.exit_code == 0);
  size_t at = 0;
  for (const char* section : {"partitioners:\n", "\nschedules:\n", "\nplanners:\n", "\nmodels:\n",
                              "\npresets:\n", "\npreset_aliases:\n", "\ndevices:\n", "\nbackends:\n"}) {
    const size_t found = all.out.find(section, at);
    REQUIRE_MESSAGE(found != std::string::npos, section);
    at = found;
  }
  auto models = pg({"list", "models"});
  CHECK(models.exit_code == 0);
  CHECK(starts_with(models.out, "  vgg16 "));
  CHECK(models.out.find("\n  gpt ") != std::string::npos);
  CHECK(models.out.find(
            "(layers 12, hidden 768, heads 12, sequence 1024, vocabulary 50257, tied_embeddings 1)\n") !=
        std::string::npos);
  CHECK(models.out.find("schedules") == std::string::npos);
  auto presets = pg({"list", "presets"});
  CHECK(presets.exit_code == 0);
  CHECK(presets.out.find("  dgx-a100-16              16 devices  ") != std::string::npos);
  auto devices = pg({"list", "devices"});
  CHECK(devices.exit_code == 0);
  CHECK(devices.out.find("\n  u280 ") != std::string::npos);
  CHECK(devices.out.find("  a100 ") != std::string::npos);
  for (const char* section : {"partitioners", "schedules", "planners"}) {
    auto one = pg({"list", section});
    CHECK(one.exit_code == 0);
    CHECK(all.out.find(std::string(section) + ":\n" + one.out) != std::string::npos);
  }
  auto bad = pg({"list", "modles"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err ==
        "pipegrid: list: unknown section \"modles\" (did you mean \"models\"?); sections: partitioners, "
        "schedules, planners, models, presets, preset_aliases, devices, backends\n");
}

TEST_CASE("usage errors: pipegrid prefix, exit status 2, the closest name") {
  auto typo = pg({"lst"});
  CHECK(typo.exit_code == 2);
  CHECK(starts_with(
      typo.err,
      "pipegrid: unknown command \"lst\" (did you mean \"list\"?); commands: run, list, schedule,"));
  CHECK(typo.err.find("; see `pipegrid --help`\n") != std::string::npos);
  auto foo = pg({"foo"});
  CHECK(foo.exit_code == 2);
  CHECK(starts_with(foo.err, "pipegrid: unknown command \"foo\"; commands: run, list"));
  auto nested = pg({"cluster", "shwo", "dgx-a100-16"});
  CHECK(nested.exit_code == 2);
  CHECK(nested.err ==
        "pipegrid: unknown command \"shwo\" for `pipegrid cluster` (did you mean \"show\"?); commands: list, "
        "show, bench, export; see `pipegrid cluster --help`\n");
  auto option = pg({"run", "--jsn"});
  CHECK(option.exit_code == 2);
  CHECK(option.err ==
        "pipegrid: unknown option \"--jsn\" for `pipegrid run` (did you mean \"--json\"?); see `pipegrid run "
        "--help`\n");
  auto range = pg({"schedule", "1f1b", "-p", "0", "-m", "2"});
  CHECK(range.exit_code == 2);
  CHECK(starts_with(range.err, "pipegrid: schedule: --stages: "));
  auto none = pg({});
  CHECK(none.exit_code == 2);
  CHECK(starts_with(none.err, "pipegrid: "));
  CHECK(pg({"--help"}).exit_code == 0);
  CHECK(pg({"run", "--help"}).exit_code == 0);
}

TEST_CASE("pipegrid schedule needs --stages and --micro-batches") {
  auto r = pg({"schedule", "1f1b"});
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK(r.err == "pipegrid: schedule: --stages is required; see `pipegrid schedule --help`\n");
  auto m = pg({"schedule", "1f1b", "-p", "2"});
  CHECK(m.exit_code == 2);
  CHECK(m.err == "pipegrid: schedule: --micro-batches is required; see `pipegrid schedule --help`\n");
}

TEST_CASE("--help shows the options' defaults") {
  auto r = pg({"workload", "show", "--help"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("=v100") != std::string::npos);  // --profile-device
  CHECK(r.out.find("=128") != std::string::npos);   // --profile-batch
  auto bench = pg({"cluster", "bench", "--help"});
  CHECK(bench.out.find("=allreduce") != std::string::npos);
  CHECK(bench.out.find("=ring") != std::string::npos);
}

TEST_CASE("pipegrid run - reads the experiment from standard input, paths against the current directory") {
  TempDir tmp;
  tmp.write("c.yaml",
            "kind: switch\ncount: 2\ndevice: {name: gpu, memory: 16GiB}\nbandwidth: 10GBps\nlatency: 1us\n");
  const std::string experiment =
      "workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 1MiB}\n"
      "cluster: {file: c.yaml}\n"
      "strategy: {micro_batches: 4}\n";
  tmp.write("e.yaml", experiment);
  auto r = run_command({"/bin/sh", "-c", std::string(PIPEGRID_BINARY) + " run - --json < e.yaml"},
                       tmp.path.string());
  REQUIRE(r.exit_code == 0);
  CHECK(json::parse(r.out)["devices"].size() == 2);
  auto file = run_command({PIPEGRID_BINARY, "run", "e.yaml", "--json"}, tmp.path.string());
  CHECK(json::parse(file.out)["iteration_time_s"] == json::parse(r.out)["iteration_time_s"]);
  tmp.write("bad.yaml", "workload: {kind: chain}\n");
  auto bad =
      run_command({"/bin/sh", "-c", std::string(PIPEGRID_BINARY) + " run - < bad.yaml"}, tmp.path.string());
  CHECK(bad.exit_code == 2);
  CHECK(starts_with(bad.err, "pipegrid: <stdin>:1:"));
}

TEST_CASE("workload show takes a model file's micro_batch_size unless --micro-batch-size is given") {
  TempDir tmp;
  const std::string model = tmp.write("m.yaml",
                                      "name: mlp\nmicro_batch_size: 8\nlayers:\n"
                                      "  - {name: x, kind: input, shape: [16]}\n"
                                      "  - {name: fc, kind: linear, in_features: 16, out_features: 16}\n");
  auto own = pg({"workload", "show", model, "--json"});
  REQUIRE(own.exit_code == 0);
  json j = json::parse(own.out);
  CHECK(j["micro_batch_size"] == 8);
  CHECK(j["layers"][1]["forward_flops"].get<double>() == pipegrid::testing::approx(8 * 2.0 * 16 * 16));
  auto given = pg({"workload", "show", model, "--micro-batch-size", "2", "--json"});
  CHECK(json::parse(given.out)["micro_batch_size"] == 2);
  auto text = pg({"workload", "show", model});
  CHECK(text.out.find("micro-batch of 8 samples") != std::string::npos);
  auto zoo = pg({"workload", "show", "vgg16", "--json"});
  CHECK(json::parse(zoo.out)["micro_batch_size"] == 1);
  // Options of another kind of workload were accepted and changed nothing until 2026-12-05.
  auto batch = pg({"workload", "show", "vgg16", "--profile-batch", "7"});
  CHECK(batch.exit_code == 2);
  CHECK(batch.err == "pipegrid: --profile-batch: only PipeDream profiles (.txt) take it\n");
  auto device = pg({"workload", "show", model, "--profile-device", "h100"});
  CHECK(device.exit_code == 2);
  CHECK(device.err == "pipegrid: --profile-device: only PipeDream profiles (.txt) take it\n");
  const std::string profile =
      std::string(PIPEGRID_SOURCE_DIR) + "/workloads/profiles/pipedream/alexnet_graph.txt";
  auto precision = pg({"workload", "show", profile, "--precision", "fp16"});
  CHECK(precision.exit_code == 2);
  CHECK(
      precision.err ==
      "pipegrid: --precision: a PipeDream profile holds measured times at its own precision; only zoo models "
      "and model files take it\n");
  auto measured = pg({"workload", "show", profile, "--profile-batch", "64"});
  REQUIRE(measured.exit_code == 0);
  CHECK(measured.out.find("(fp32, micro-batch of 64 samples)") != std::string::npos);
  CHECK(measured.err.empty());  // alexnet's sizes are whole fp32 parameters: no warning
  // A kind no catalog has was accepted until 2026-12-05; the experiment's `device:` key refused it.
  auto typo = pg({"workload", "show", profile, "--profile-device", "v10"});
  CHECK(typo.exit_code == 2);
  CHECK(typo.err ==
        "pipegrid: --profile-device: unknown device kind \"v10\" (did you mean \"v100\"? expected a catalog "
        "name, \"custom\" or \"any\"; `pipegrid device list` shows the catalog)\n");
  CHECK(pg({"workload", "show", profile, "--profile-device", "any"}).exit_code == 0);
}

TEST_CASE("workload show and run warn of a profile's parameter_size that is not whole fp32 parameters") {
  // DAPPLE's vgg-19 writes floor(bytes x 10^6 / 2^20) (workloads/profiles/dapple/SOURCE.md). By hand
  // from the file: 19 layers have weights, 14 of their sizes are not multiples of 4 (6835, 140869,
  // 281738, 4501953, 9001953 x 7, 392015625, 64015625, 15628814 are not; 562988, 1125976 and
  // 2250976 x 3 are), the first conv1_1's 6835 and the last the prediction layer's 15628814.
  const std::string profile =
      std::string(PIPEGRID_SOURCE_DIR) + "/workloads/profiles/dapple/vgg-19-pbs-32.txt";
  auto r = pg({"workload", "show", profile, "--profile-batch", "32"});
  REQUIRE(r.exit_code == 0);
  CHECK(r.err ==
        "pipegrid: warning: 14 of the profile's layers have a parameter_size that is not a multiple of 4 "
        "bytes (node2 (6835 bytes), ..., node25 (15628814 bytes)), so their fp32 parameter counts are "
        "fractional (parameter_size / 4); the bytes are used as given, and if the profile wrote them in "
        "another unit its weights' memory and gradient sizes are off by it\n");
  // conv1_1's count is 6835 / 4 = 1708.75 parameters, as the bytes say.
  auto j = json::parse(pg({"workload", "show", profile, "--json"}).out);
  CHECK(j["layers"][1]["parameters"].get<double>() == pipegrid::testing::approx(1708.75));
}
