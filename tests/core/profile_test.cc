// PipeDream profiles as workloads, checked against sums computed here from the files with a
// separate (regex) reading, and against models.md's totals.
#include <doctest/doctest.h>

#include <filesystem>
#include <regex>

#include "core/device.h"
#include "core/models/pipedream_profile.h"
#include "tests/support/approx.h"
#include "tests/support/process.h"

using namespace pipegrid;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(PIPEGRID_PROFILES_DIR) / "pipedream";

struct Sums {
  double forward_ms = 0, backward_ms = 0, input_forward_ms = 0, params = 0;
  int nodes = 0, edges = 0;
};

Sums independent_sums(const std::string& text) {
  Sums s;
  std::regex node(
      R"(forward_compute_time=([0-9.]+), backward_compute_time=([0-9.]+).*parameter_size=([0-9.]+))");
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '\t') {
      ++s.edges;
      continue;
    }
    std::smatch m;
    if (!std::regex_search(line, m, node)) continue;
    ++s.nodes;
    s.forward_ms += std::stod(m[1]);
    s.backward_ms += std::stod(m[2]);
    s.params += std::stod(m[3]);
    if (line.find(" -- Input") != std::string::npos) s.input_forward_ms += std::stod(m[1]);
  }
  return s;
}

}  // namespace

TEST_CASE(
    "every PipeDream profile imports: nodes, edges, times (Input dropped) and parameters match the file") {
  REQUIRE_MESSAGE(fs::exists(kDir), kDir << " is missing: the profiles are part of the repository");
  int files = 0;
  for (const auto& entry : fs::directory_iterator(kDir)) {
    if (entry.path().extension() != ".txt") continue;
    ++files;
    const std::string text = testing::read_file(entry.path().string());
    Result<Workload> w = parse_pipedream_profile(text, entry.path().filename().string(), {});
    INFO(entry.path().filename().string());
    REQUIRE(w.ok());
    const Sums s = independent_sums(text);
    CHECK(static_cast<int>(w->layer_count()) == s.nodes);
    CHECK(static_cast<int>(boost::num_edges(w->graph)) == s.edges);
    double fwd = 0, bwd = 0;
    for (size_t i = 0; i < w->layer_count(); ++i) {
      fwd += w->layer(i).measured->forward_s;
      bwd += w->layer(i).measured->backward_s;
      CHECK(w->layer(i).measured->batch == 128);
      CHECK(w->layer(i).measured->device_kind == "v100");
    }
    CHECK(fwd * 1e3 == pipegrid::testing::approx(s.forward_ms - s.input_forward_ms).epsilon(1e-9));
    CHECK(bwd * 1e3 == pipegrid::testing::approx(s.backward_ms).epsilon(1e-9));
    CHECK(total_parameter_bytes(*w) == pipegrid::testing::approx(s.params).epsilon(1e-12));
    CHECK(check_acyclic(*w).ok());
  }
  CHECK(files == 14);
}

TEST_CASE("VGG-16 and ResNet-50 profiles total models.md's 233.9 + 438.6 ms and 182.5 + 260.9 ms") {
  REQUIRE_MESSAGE(fs::exists(kDir), kDir << " is missing: the profiles are part of the repository");
  struct Case {
    const char* file;
    double forward_ms, backward_ms;
    int nodes;
  };
  for (Case c : {Case{"vgg16_graph.txt", 233.9, 438.6, 41}, Case{"resnet50_graph.txt", 182.5, 260.9, 177}}) {
    Workload w = *parse_pipedream_profile(testing::read_file((kDir / c.file).string()), c.file, {});
    double fwd = 0, bwd = 0;
    for (size_t i = 0; i < w.layer_count(); ++i) {
      fwd += w.layer(i).measured->forward_s * 1e3;
      bwd += w.layer(i).measured->backward_s * 1e3;
    }
    INFO(c.file);
    CHECK(fwd == pipegrid::testing::approx(c.forward_ms).epsilon(0.0005));
    CHECK(bwd == pipegrid::testing::approx(c.backward_ms).epsilon(0.0005));
    CHECK(static_cast<int>(w.layer_count()) == c.nodes);
  }
  // VGG-16's conv1 output, per sample: 64 x 224 x 224 x 4 bytes (the file has it for 128 images).
  Workload vgg =
      *parse_pipedream_profile(testing::read_file((kDir / "vgg16_graph.txt").string()), "vgg16", {});
  bool found = false;
  for (size_t i = 0; i < vgg.layer_count(); ++i)
    if (vgg.layer(i).description.rfind("Conv2d(3, 64", 0) == 0) {
      CHECK(vgg.layer(i).output_bytes == 64.0 * 224 * 224 * 4);
      found = true;
    }
  CHECK(found);
}

TEST_CASE("profile rules: lists of sizes are summed, times scale with the batch, only on the measured kind") {
  const char* text =
      "node1 -- Input -- forward_compute_time=9.0, backward_compute_time=0.0, activation_size=1024.0, "
      "parameter_size=0.0\n"
      "node2 -- LSTM(8, 8) -- forward_compute_time=2.0, backward_compute_time=4.0, activation_size=[512.0; "
      "256.0; 256.0], "
      "parameter_size=4096.0 -- stage_id=0\n"
      "\tnode1 -- node2\n";
  ProfileOptions o;
  o.batch = 8;
  o.device_kind = "v100";
  Workload w = *parse_pipedream_profile(text, "t.txt", o);
  REQUIRE(w.layer_count() == 2);
  CHECK(w.layer(0).kind == "input");
  CHECK(w.layer(0).measured->forward_s == 0);  // data loading dropped
  CHECK(w.layer(1).kind == "LSTM");
  CHECK(w.layer(1).output_bytes == 1024.0 / 8);
  CHECK(w.layer(1).parameters == 1024);
  DeviceSpec v100;
  v100.kind = "v100";
  PassTimes t = *layer_times(w.layer(1), w.precision, v100, 2);  // 2 samples = a quarter of the batch
  CHECK(t.forward == pipegrid::testing::approx(0.5e-3));
  CHECK(t.backward() == pipegrid::testing::approx(1e-3));
  DeviceSpec a100;
  a100.kind = "a100";
  CHECK(layer_times(w.layer(1), w.precision, a100, 2).error().message ==
        "layer \"node2\" was measured on device kind \"v100\" and has no FLOP or byte counts to cost it on "
        "\"a100\"");
}

TEST_CASE("malformed profiles: the error names the line") {
  auto err = [](const char* text) { return parse_pipedream_profile(text, "g.txt", {}).error().message; };
  CHECK(err("node1 -- Input -- forward_compute_time=1.0\n") ==
        "g.txt:1: node node1 has no backward_compute_time");
  CHECK(err("node1 -- Input -- forward_compute_time=1.0, backward_compute_time=x, activation_size=1.0, "
            "parameter_size=0.0\n") ==
        "g.txt:1: node node1: backward_compute_time must be a number from 0 to 1e+12 (ms), got \"x\"");
  CHECK(err("node1 -- A -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=1.0, "
            "parameter_size=0.0\n\tnode1 -- node9\n") == "g.txt:2: edge to unknown node \"node9\"");
  CHECK(err("this is not a profile\n")
            .rfind("g.txt:1: expected \"nodeN -- description -- forward_compute_time=", 0) == 0);
  CHECK(err("node1 -- A -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=1.0, "
            "parameter_size=0.0\n"
            "node2 -- B -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=1.0, "
            "parameter_size=0.0\n"
            "\tnode1 -- node2\n\tnode2 -- node1\n") ==
        "g.txt:4: the layer graph has a cycle: node1 -> node2 -> node1 (this edge closes it)");
  // Finite values only, within the bounds of every other input (1e9 s = 1e12 ms, 1e18 bytes); before,
  // `inf` and 1e308 ms crashed the replay and 1e300 bytes ran with an infinite memory.
  for (const char* bad : {"inf", "nan", "1e308", "-1"})
    CHECK(err(("node1 -- A -- forward_compute_time=" + std::string(bad) +
               ", backward_compute_time=1.0, activation_size=1.0, parameter_size=0.0\n")
                  .c_str()) ==
          "g.txt:1: node node1: forward_compute_time must be a number from 0 to 1e+12 (ms), got \"" +
              std::string(bad) + "\"");
  CHECK(
      err("node1 -- A -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=[1e300; 1.0], "
          "parameter_size=0.0\n") ==
      "g.txt:1: node node1: activation_size must be a number from 0 to 1e+18 (bytes), got \"[1e300; 1.0]\"");
}
