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

TEST_CASE("a job alone on an FPGA ring with its collective engine: run's answer, engine included") {
  // The job's cluster kept no collective engine until 2026-12-05: planned without ACCL's per-call and
  // per-message costs, its first iteration was 0.12999 s against run's 0.13014 s, and its
  // assumptions named no engine.
  pipegrid::testing::TempDir tmp;
  const std::string chain =
      "{kind: chain, layers: 8, forward: 1ms, backward: 2ms, activation: 8MiB, parameters: 64MiB, "
      "samples_per_micro_batch: 4}";
  const std::string strategy =
      "{partitioner: uniform, schedule: 1f1b, micro_batches: 8, stages: 2, replicas: 4}";
  const std::string exp = tmp.write(
      "e.yaml", "workload: " + chain + "\ncluster: {preset: fpga-ring-u280-8}\nstrategy: " + strategy + "\n");
  const std::string jobs = tmp.write("j.yaml",
                                     "cluster: {preset: fpga-ring-u280-8}\niterations: 1\njobs:\n"
                                     "  - {name: all, devices: 8, workload: " +
                                         chain + ", strategy: " + strategy + "}\n");
  auto run = run_command({PIPEGRID_BINARY, "run", exp, "--json"});
  REQUIRE(run.exit_code == 0);
  auto together = run_command({PIPEGRID_BINARY, "jobs", jobs, "--json"});
  REQUIRE(together.exit_code == 0);
  nlohmann::json r = nlohmann::json::parse(run.out);
  nlohmann::json first = nlohmann::json::parse(together.out)["jobs"][0]["first_iteration"];
  REQUIRE(r["assumptions"]["collective_engine"] != nullptr);
  CHECK(first["assumptions"]["collective_engine"] == r["assumptions"]["collective_engine"]);
  CHECK(first["iteration_time_s"] == r["iteration_time_s"]);
}

TEST_CASE("the documented example: packed jobs never meet, spread jobs meet on the pods' uplinks") {
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

TEST_CASE(
    "--phase-shift: two offsets over one iteration of the first job, the hand-counted better one kept") {
  // tests/sim/jobs_test.cc's trunk: alone 22 ms each; together from 0 s, 42 ms each (slowdown
  // 42/22). Offsets tried for b: 0 and 11 ms. At 11 ms: a's step 0 [2, 12] alone, its step 1 alone
  // to 13 (10 MB), then 5 GB/s beside b's step 0 to 31; b's step 0 [13, 31] at 5 GB/s (90 MB) then
  // alone to 32, its step 1 [32, 42]: both iterations 31 ms, slowdown 31/22.
  const std::string file = (fs::path(PIPEGRID_SOURCE_DIR) / "tests/tools/jobs_trunk.yaml").string();
  auto r = run_command({PIPEGRID_BINARY, "jobs", file, "--phase-shift", "2", "--json"});
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(std::abs(j["phase_shift"]["period_s"].get<double>() - 22e-3) < 1e-12);
  CHECK(j["phase_shift"]["tried"] == 2);
  CHECK(std::abs(j["phase_shift"]["mean_slowdown_given"].get<double>() - 42.0 / 22) < 1e-9);
  CHECK(std::abs(j["phase_shift"]["mean_slowdown_shifted"].get<double>() - 31.0 / 22) < 1e-9);
  CHECK(std::abs(j["jobs"][1]["start_s"].get<double>() - 11e-3) < 1e-12);
  for (int k = 0; k < 2; ++k) CHECK(std::abs(j["jobs"][k]["mean_s"].get<double>() - 31e-3) < 1e-12);
  CHECK(j["schema_version"] == 1);
  for (const auto& link : j["shared_links"])
    for (const auto& b : link["bytes"]) CHECK(b.is_number_integer());  // whole bytes print whole
}

TEST_CASE("a queue on the trunk: first come first served, each running set's replay, counted by hand") {
  // Alone 22 ms an iteration, together 42 ms (tests/sim/jobs_test.cc). a (10 iterations) alone from
  // 0 to 100 ms: 100/22 iterations; b (5 iterations) from 100 ms beside a: 5 x 42 = 210 ms, to 310 ms,
  // while a does 5 more; a's last 10 - 5 - 100/22 = 0.4545... iterations alone: 10 ms, to 320 ms.
  // Utilisation: (2 x 320 + 2 x 210) / (4 x 320). Sets replayed: {a}, {a, b}, {a} (cached), {b} alone.
  const std::string file = (fs::path(PIPEGRID_SOURCE_DIR) / "tests/tools/jobs_queue_trunk.yaml").string();
  auto r = run_command({PIPEGRID_BINARY, "jobs", file, "--json"});
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const auto& q = j["queue"];
  CHECK(std::abs(q[0]["end_s"].get<double>() - 0.320) < 1e-12);
  CHECK(std::abs(q[1]["start_s"].get<double>() - 0.100) < 1e-12);
  CHECK(std::abs(q[1]["end_s"].get<double>() - 0.310) < 1e-12);
  CHECK(q[0]["devices"] == "gpu0-1");
  CHECK(q[1]["devices"] == "gpu2-3");
  CHECK(std::abs(j["makespan_s"].get<double>() - 0.320) < 1e-12);
  CHECK(std::abs(j["utilisation"].get<double>() - (2 * 0.320 + 2 * 0.210) / (4 * 0.320)) < 1e-12);
  // {a} and {a, b} are the running sets; {b} is replayed alone only (the count said 3 sets until
  // 2026-12-05, counting it among them).
  CHECK(j["running_sets_replayed"] == 2);
  CHECK(j["alone_replayed"] == 1);
  // The text table's iteration and slowdown, by hand: a's 10 iterations over 320 ms against 22 ms
  // alone; b's 5 over 210 ms (42 ms each). Whole counts print whole; every JSON output has its schema.
  CHECK(j["schema_version"] == 1);
  CHECK(std::abs(q[0]["mean_s"].get<double>() - 0.032) < 1e-12);
  CHECK(std::abs(q[0]["slowdown"].get<double>() - 32.0 / 22) < 1e-9);
  CHECK(std::abs(q[1]["mean_s"].get<double>() - 0.042) < 1e-12);
  CHECK(std::abs(q[1]["slowdown"].get<double>() - 42.0 / 22) < 1e-9);
  CHECK(q[0]["iterations"].is_number_integer());
  // --top lists a jobs file's shared links; a queue's output has none: refused, as it was ignored.
  auto top = run_command({PIPEGRID_BINARY, "jobs", file, "--top", "3"});
  CHECK(top.exit_code == 2);
  CHECK(top.err == "pipegrid: --top is for a jobs file's jobs, not a queue\n");
}

TEST_CASE("jobs --phase-shift with one job is refused: it shifts the jobs after the first") {
  pipegrid::testing::TempDir tmp;
  const std::string job = (fs::path(PIPEGRID_SOURCE_DIR) / "tests/tools/bad_jobs/job.yaml").string();
  const std::string file = tmp.write(
      "one.yaml",
      "cluster: {kind: switch, count: 4, device: {name: gpu, model: a100}, bandwidth: 25GBps, latency: 1us}\n"
      "jobs:\n  - {name: first, experiment: " +
          job + ", devices: [gpu0, gpu1]}\n");
  auto r = run_command({PIPEGRID_BINARY, "jobs", file, "--phase-shift", "4"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--phase-shift shifts the starts of the jobs after the first") != std::string::npos);
  CHECK(run_command({PIPEGRID_BINARY, "jobs", file}).exit_code == 0);
}

TEST_CASE("jobs --trace: one process per job, its iterations and its flows on shared links, as counted") {
  // The trunk from 0 s: each job's iteration [0, 42] ms, its ring on the trunk [2, 42] ms.
  const std::string file = (fs::path(PIPEGRID_SOURCE_DIR) / "tests/tools/jobs_trunk.yaml").string();
  pipegrid::testing::TempDir tmp;
  const std::string trace = (fs::path(tmp.path) / "jobs.json").string();
  auto r = run_command({PIPEGRID_BINARY, "jobs", file, "--trace", trace});
  REQUIRE(r.exit_code == 0);
  const nlohmann::json t = nlohmann::json::parse(read_file(trace));
  int slices = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++slices;
    const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    if (e["tid"] == 1) {
      CHECK(std::abs(ts) < 1e-6);
      CHECK(std::abs(dur - 42000) < 1e-6);
    } else {
      CHECK(std::abs(ts - 2000) < 1e-6);
      CHECK(std::abs(dur - 40000) < 1e-6);
    }
  }
  CHECK(slices == 4);
  auto clash = run_command({PIPEGRID_BINARY, "jobs", file, "--trace", file});
  CHECK(clash.exit_code == 2);
}

TEST_CASE("a generated queue: jobs of one kind on the same devices plan and replay once, days apart") {
  // Five jobs of one kind, each on both devices of the cluster, arriving a day apart on average
  // (runs of milliseconds): each runs alone on the same devices, so by hand one running set, {a job
  // of the kind on gpu0-1}, and no other replay: its alone time is that set's. The cache was keyed by
  // the job, not its kind (5 replays), and at arrivals of 1e5 s and more the queue looped for ever.
  pipegrid::testing::TempDir tmp;
  const std::string job = (fs::path(PIPEGRID_SOURCE_DIR) / "tests/tools/bad_jobs/job.yaml").string();
  const std::string file = tmp.write(
      "q.yaml",
      "cluster: {kind: switch, count: 2, device: {name: gpu, model: a100}, bandwidth: 25GBps, latency: 1us}\n"
      "queue:\n  generate: {count: 5, seed: 1, mean_interarrival: 86400s, iterations: [1, 20], mix: "
      "[{experiment: " +
          job + ", devices: 2}]}\n");
  auto r = run_command({PIPEGRID_BINARY, "jobs", file, "--json"});
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["running_sets_replayed"] == 1);
  CHECK(j["alone_replayed"] == 0);
  for (const auto& q : j["queue"]) {
    CHECK(q["start_s"] == q["arrival_s"]);  // never waits: the previous job ended a day before
    CHECK(std::abs(q["slowdown"].get<double>() - 1) < 1e-6);
  }
}
