// Every file in tests/tools/bad_inputs/NAME.yaml is run with `pipegrid run NAME.yaml`: the command
// must exit with status 2 and print exactly NAME.err on stderr (hand-written expectations).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>

#include "tests/support/process.h"

using pipegrid::testing::read_file;
using pipegrid::testing::run_command;
namespace fs = std::filesystem;

TEST_CASE("bad experiment files: exact messages, exit status 2") {
  const fs::path dir = fs::path(PIPEGRID_SOURCE_DIR) / "tests/tools/bad_inputs";
  std::vector<fs::path> expectations;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".err") expectations.push_back(entry.path());
  std::sort(expectations.begin(), expectations.end());
  REQUIRE(expectations.size() >= 20);
  for (const fs::path& err : expectations) {
    const std::string name = err.stem().string() + ".yaml";
    auto r = run_command({PIPEGRID_BINARY, "run", name}, dir.string());
    INFO("case " << name);
    CHECK(r.exit_code == 2);
    CHECK(r.err == read_file(err.string()));
    CHECK(r.out.empty());
  }
}

TEST_CASE("usage errors exit with status 2") {
  CHECK(run_command({PIPEGRID_BINARY}).exit_code == 2);
  CHECK(run_command({PIPEGRID_BINARY, "frobnicate"}).exit_code == 2);
  CHECK(run_command({PIPEGRID_BINARY, "run", "--no-such-flag"}).exit_code == 2);
  CHECK(run_command({PIPEGRID_BINARY, "--help"}).exit_code == 0);
}
