// Devices summarised by role (tools/output/device_groups.h): ranges of names, one row per group, the
// outliers named; --devices all lists every device.
#include "tools/output/device_groups.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

using pipegrid::output::name_ranges;
using pipegrid::testing::run_command;
using pipegrid::testing::TempDir;

namespace {

std::vector<std::string> gpus(int from, int to) {
  std::vector<std::string> out;
  for (int i = from; i <= to; ++i) out.push_back("gpu" + std::to_string(i));
  return out;
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

size_t lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace

TEST_CASE("name_ranges: consecutive numbers of one prefix as ranges, the rest as they are") {
  CHECK(name_ranges(gpus(0, 7)) == "gpu0-7");
  CHECK(name_ranges({"gpu3"}) == "gpu3");
  CHECK(name_ranges(concat(gpus(0, 1), gpus(4, 4))) == "gpu0-1, gpu4");
  CHECK(name_ranges({"gpu2", "gpu1", "gpu0"}) == "gpu2, gpu1, gpu0");  // the given order, not sorted
  CHECK(name_ranges({"a", "b", "node1/gpu0", "node1/gpu1"}) == "a, b, node1/gpu0-1");
  CHECK(name_ranges({"v100-0", "v100-1", "v100-2"}) == "v100-0..2");
  CHECK(name_ranges({"gpu07", "gpu08"}) == "gpu07, gpu08");  // leading zeros: not a number range
  CHECK(name_ranges({}) == "");
  // 128 tensor-parallel groups of 8, 64 apart: the first ranges, the last, and how many.
  std::vector<std::string> stage0;
  for (int r = 0; r < 128; ++r) stage0 = concat(stage0, gpus(64 * r, 64 * r + 7));
  CHECK(name_ranges(stage0, 3) == "gpu0-7, gpu64-71, ..., gpu8128-8135 (128 ranges)");
  CHECK(name_ranges(stage0, 0).size() > 1000);
  CHECK(name_ranges(concat(gpus(0, 0), gpus(2, 2)), 2) == "gpu0, gpu2");
  // One range over the limit is shown, not hidden behind "..." (which would save nothing).
  CHECK(name_ranges({"gpu7", "gpu5", "gpu6", "gpu4"}, 2) == "gpu7, gpu5-6, gpu4");
  CHECK(name_ranges(concat(concat(gpus(0, 0), gpus(2, 2)), concat(gpus(4, 4), gpus(6, 6))), 2) ==
        "gpu0, ..., gpu6 (4 ranges)");
}

TEST_CASE("run groups a data-parallel run's devices by stage, --devices all prints each") {
  TempDir tmp;
  const std::string e = tmp.write("dp.yaml", R"(
workload: {kind: chain, layers: 2, forward: 1ms, backward: 2ms, activation: 1KiB, parameters: 1MiB,
           samples_per_micro_batch: 8}
cluster: {kind: switch, count: 18, device: {name: gpu, memory: 16GiB}, bandwidth: 10GBps, latency: 1us}
strategy: {micro_batches: 4, replicas: 8, stages: 2}
)");
  auto grouped = run_command({PIPEGRID_BINARY, "run", e});
  REQUIRE(grouped.exit_code == 0);
  // Stage 0 on gpu0-7, stage 1 on gpu8-15 (Megatron's placement), gpu16-17 unused.
  CHECK(grouped.out.find("\n0      layer0") != std::string::npos);
  CHECK(grouped.out.find(" gpu0-7 ") != std::string::npos);
  CHECK(grouped.out.find("\ngpu0-7  ") != std::string::npos);
  CHECK(grouped.out.find("\ngpu8-15 ") != std::string::npos);
  CHECK(grouped.out.find("\ngpu16-17 ") != std::string::npos);
  CHECK(grouped.out.find("busiest device   gpu") != std::string::npos);
  CHECK(grouped.out.find("most memory      gpu") != std::string::npos);
  CHECK(grouped.out.find("\ngpu3 ") == std::string::npos);
  auto all = run_command({PIPEGRID_BINARY, "run", e, "--devices", "all"});
  REQUIRE(all.exit_code == 0);
  for (int d = 0; d < 16; ++d) CHECK(all.out.find("\ngpu" + std::to_string(d) + " ") != std::string::npos);
  CHECK(all.out.find("\ngpu17      (unused)") != std::string::npos);
  CHECK(lines(all.out) == lines(grouped.out) + 18 - 3 - 3);  // 18 rows for 3; no outlier lines, no note
  // plan: the stage rows show ranges.
  auto plan = run_command({PIPEGRID_BINARY, "plan", e});
  REQUIRE(plan.exit_code == 0);
  CHECK(plan.out.find("  gpu0-7 | layer0") != std::string::npos);
  auto plan_all = run_command({PIPEGRID_BINARY, "plan", e, "--devices", "all"});
  REQUIRE(plan_all.exit_code == 0);
  CHECK(plan_all.out.find("  gpu0,gpu1,gpu2,gpu3,gpu4,gpu5,gpu6,gpu7 | layer0") != std::string::npos);
}
