// pipegrid jobs: bad jobs files give located errors naming the job; a job alone on all of a cluster's
// devices gives what `pipegrid run` gives, to the byte; the documented example's placements.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

using pipegrid::testing::read_file;
using pipegrid::testing::run_command;
namespace fs = std::filesystem;

TEST_CASE("bad jobs files: exact messages naming the job, exit status 2") {
  const fs::path dir = fs::path(PIPEGRID_SOURCE_DIR) / "tests/tools/bad_jobs";
  std::vector<fs::path> expectations;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".err") expectations.push_back(entry.path());
  std::sort(expectations.begin(), expectations.end());
  REQUIRE(expectations.size() >= 6);
  for (const fs::path& err : expectations) {
    const std::string name = err.stem().string() + ".yaml";
    auto r = run_command({PIPEGRID_BINARY, "jobs", name}, dir.string());
    INFO("case " << name);
    CHECK(r.exit_code == 2);
    CHECK(r.err == read_file(err.string()));
    CHECK(r.out.empty());
  }
}

TEST_CASE(
    "a job alone on all of its cluster's devices: its first iteration is `pipegrid run`'s, to the byte") {
  const fs::path experiments = fs::path(PIPEGRID_SOURCE_DIR) / "experiments/jobs";
  pipegrid::testing::TempDir tmp;
  const std::string jobs = (fs::path(tmp.path) / "alone.yaml").string();
  {
    // gpt-b.yaml's own cluster as the shared cluster, all 32 devices in order.
    std::ofstream f(jobs);
    f << "cluster: {kind: dgx, nodes: 4, gpu: h100, nvlink: {bandwidth: 450GBps, latency: 0.5us},\n"
         "          infiniband: {bandwidth: 400Gbps, latency: 1us}, fabric: rail}\n"
         "iterations: 2\n"
         "jobs:\n"
         "  - {name: b, experiment: "
      << (experiments / "gpt-b.yaml").string() << ", devices: 32}\n";
  }
  auto run = run_command({PIPEGRID_BINARY, "run", (experiments / "gpt-b.yaml").string(), "--json"});
  REQUIRE(run.exit_code == 0);
  auto together = run_command({PIPEGRID_BINARY, "jobs", jobs, "--json"});
  REQUIRE(together.exit_code == 0);
  nlohmann::json r = nlohmann::json::parse(run.out), j = nlohmann::json::parse(together.out);
  nlohmann::json first = j["jobs"][0]["first_iteration"];
  // Everything but the planner's wall time (a measurement, different in every run).
  for (nlohmann::json* x : {&r, &first}) {
    REQUIRE(x->contains("planning_seconds"));
    x->erase("planning_seconds");
  }
  CHECK(first.dump() == r.dump());
  // Both iterations take run's time (the second starts at the barrier), and alone is the same.
  const double t = r["iteration_time_s"].get<double>();
  CHECK(j["jobs"][0]["iteration_times_s"][0].get<double>() == t);
  CHECK(j["jobs"][0]["alone_s"].get<double>() == t);
  CHECK(std::abs(j["jobs"][0]["iteration_times_s"][1].get<double>() - t) < 1e-9 * t);
  CHECK(j["shared_links"].empty());
}

TEST_CASE("the documented example: packed jobs never meet; spread jobs meet on the pods' uplinks") {
  const fs::path dir = fs::path(PIPEGRID_SOURCE_DIR) / "experiments/jobs";
  auto packed = run_command({PIPEGRID_BINARY, "jobs", "packed.yaml", "--json"}, dir.string());
  auto spread = run_command({PIPEGRID_BINARY, "jobs", "spread.yaml", "--json"}, dir.string());
  REQUIRE(packed.exit_code == 0);
  REQUIRE(spread.exit_code == 0);
  const nlohmann::json p = nlohmann::json::parse(packed.out), s = nlohmann::json::parse(spread.out);
  CHECK(p["shared_links"].empty());
  for (const auto& job : p["jobs"]) CHECK(std::abs(job["slowdown"].get<double>() - 1) < 1e-12);
  // Packed: each job on its own pod's 4 nodes; spread: every other node, half a job in each pod.
  CHECK(p["jobs"][0]["devices"] == "gpu0-31");
  CHECK(s["jobs"][0]["devices"] == "gpu0-7, gpu16-23, gpu32-39, gpu48-55");
  REQUIRE(!s["shared_links"].empty());
  // The most loaded shared link is a pod's 1:7 uplink to the core switch.
  const std::string top = s["shared_links"][0]["link"];
  CHECK(top.find("ib-core") != std::string::npos);
  for (size_t j = 0; j < 2; ++j) {
    CHECK(s["jobs"][j]["slowdown"].get<double>() > 1.0);
    CHECK(s["jobs"][j]["alone_s"].get<double>() > p["jobs"][j]["alone_s"].get<double>());
  }
}
