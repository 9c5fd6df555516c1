// DAPPLE's published V100 layer profiles (workloads/profiles/dapple/, PipeDream's format, with
// trailing spaces, integer times and edges indented by spaces): every file loads (checked against sums read
// here with a regex), plans with the default planner (uniform + 1F1B) and with PipeDream's planner, and
// replays in SimGrid within bounds derived from the profile.
#include <doctest/doctest.h>

#include <filesystem>
#include <regex>
#include <set>

#include "core/experiment.h"
#include "core/models/pipedream_profile.h"
#include "core/topologies/generators.h"
#include "sim/replay.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"
#include "tests/support/process.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(PIPEGRID_PROFILES_DIR) / "dapple";

struct Sums {
  double forward_ms = 0, backward_ms = 0, params = 0, activations = 0;
  int nodes = 0, edges = 0;
};

// An independent reading: integers or decimals, a lone size or a bracketed list, Input nodes' times
// dropped (pipegrid's rule, as PipeDream's planner does).
Sums independent_sums(const std::string& text) {
  Sums s;
  std::regex node(R"(-- (.*) -- forward_compute_time=([0-9.]+), backward_compute_time=([0-9.]+), )"
                  R"(activation_size=\[?([0-9.; ]+)\]?, parameter_size=([0-9.]+))");
  // Edges are indented by a tab, two spaces or a space and a tab, depending on the file.
  std::regex edge(R"(^[ \t]+node[0-9]+ -- node[0-9]+[ \t]*$)");
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (std::regex_match(line, edge)) {
      ++s.edges;
      continue;
    }
    std::smatch m;
    if (!std::regex_search(line, m, node)) continue;
    ++s.nodes;
    if (m[1].str().rfind("Input", 0) != 0) {
      s.forward_ms += std::stod(m[2]);
      s.backward_ms += std::stod(m[3]);
    }
    std::stringstream sizes(m[4].str());
    std::string size;
    while (std::getline(sizes, size, ';')) s.activations += std::stod(size);
    s.params += std::stod(m[5]);
  }
  return s;
}

// The profiled batch from the file name (`pbs-N`); vgg16.txt does not say: 32 (as vgg-19's).
double profiled_batch(const std::string& file) {
  std::smatch m;
  if (std::regex_search(file, m, std::regex(R"(pbs-([0-9]+))"))) return std::stod(m[1]);
  return 32;
}

std::vector<fs::path> profiles() {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(kDir))
    if (entry.path().extension() == ".txt") out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("every DAPPLE profile loads: nodes, edges, times, activations and parameters match the file") {
  REQUIRE_MESSAGE(fs::exists(kDir), kDir << " is missing: the profiles are part of the repository");
  int files = 0;
  bool trailing_space = false, integer_time = false, space_indent = false;
  for (const fs::path& p : profiles()) {
    ++files;
    const std::string text = testing::read_file(p.string());
    trailing_space |= text.find(" \n") != std::string::npos;
    integer_time |= std::regex_search(text, std::regex(R"(compute_time=[0-9]+,)"));
    space_indent |= text.find("\n  node") != std::string::npos;
    const double batch = profiled_batch(p.filename().string());
    Result<Workload> w = parse_pipedream_profile(text, p.filename().string(), {batch, "v100"});
    INFO(p.filename().string());
    REQUIRE(w.ok());
    const Sums s = independent_sums(text);
    CHECK(static_cast<int>(w->layer_count()) == s.nodes);
    CHECK(static_cast<int>(boost::num_edges(w->graph)) == s.edges);
    double fwd = 0, bwd = 0, act = 0;
    for (size_t i = 0; i < w->layer_count(); ++i) {
      fwd += w->layer(i).measured->forward_s;
      bwd += w->layer(i).measured->backward_s;
      act += w->layer(i).output_bytes * batch;  // stored per sample
    }
    CHECK(fwd * 1e3 == pipegrid::testing::approx(s.forward_ms).epsilon(1e-9));
    CHECK(bwd * 1e3 == pipegrid::testing::approx(s.backward_ms).epsilon(1e-9));
    CHECK(act == pipegrid::testing::approx(s.activations).epsilon(1e-9));
    CHECK(total_parameter_bytes(*w) == pipegrid::testing::approx(s.params).epsilon(1e-12));
  }
  CHECK(files == 13);
  CHECK(trailing_space);  // the quirks this test is about are really in the files
  CHECK(integer_time);
  CHECK(space_indent);
}

TEST_CASE("every DAPPLE profile plans (uniform + 1f1b and pipedream) and replays in SimGrid within bounds") {
  REQUIRE_MESSAGE(fs::exists(kDir), kDir << " is missing: the profiles are part of the repository");
  constexpr int kMicroBatches = 4;
  constexpr double kBandwidth = 10e9;
  for (const fs::path& p : profiles()) {
    const double batch = profiled_batch(p.filename().string());
    for (const char* partitioner : {"uniform", "pipedream"}) {
      Experiment e;
      e.workload =
          *parse_pipedream_profile(testing::read_file(p.string()), p.filename().string(), {batch, "v100"});
      DeviceSpec v100 = testing::test_device(32e9);
      v100.kind = "v100";
      e.cluster = make_switch_cluster(4, "gpu", v100, kBandwidth, 0);
      e.strategy.partitioner = partitioner;
      e.strategy.schedule = "1f1b";
      e.strategy.micro_batches = kMicroBatches;
      e.micro_batch_size = batch;
      INFO(p.filename().string() << " " << partitioner);
      Result<PreparedRun> run = prepare(e);
      REQUIRE(run.ok());
      // Every layer in exactly one stage.
      std::multiset<int> layers;
      for (size_t s = 0; s < run->partition.stage_count(); ++s)
        layers.insert(run->partition.stage(s).layers.begin(), run->partition.stage(s).layers.end());
      CHECK(layers.size() == e.workload.layer_count());
      CHECK(std::set<int>(layers.begin(), layers.end()).size() == e.workload.layer_count());
      Result<sim::Replay> r = process::replay_isolated(e.cluster, run->graph);
      REQUIRE(r.ok());
      const double t = r->timeline.makespan();
      // Lower bound: a stage's replicas share its m micro-batches' forward and backward compute.
      // Upper bound: everything one after another - all compute of m micro-batches, every layer's
      // activation sent forward and its gradient back for each micro-batch, and each stage's weights
      // all-reduced (a ring moves under 2 W per device), each at the slowest bandwidth.
      double lower = 0, compute = 0, bytes = 0;
      for (size_t s = 0; s < run->partition.stage_count(); ++s) {
        double stage = 0, weights = 0;
        for (int l : run->partition.stage(s).layers) {
          stage += e.workload.layer(l).measured->forward_s + e.workload.layer(l).measured->backward_s;
          bytes += 2.0 * kMicroBatches * e.workload.layer(l).output_bytes * batch;
          weights += e.workload.layer(l).parameter_bytes;
        }
        const double r_s = static_cast<double>(run->partition.stage(s).devices.size());
        lower = std::max(lower, kMicroBatches * stage / r_s);
        compute += kMicroBatches * stage;
        bytes += 2 * weights * r_s;
      }
      CHECK(t >= lower * (1 - 1e-9));
      CHECK(t <= compute + bytes / kBandwidth);
    }
  }
}
