// Backend catalogs (tools/input/backends_yaml): the format, the shipped catalogs, located errors.
#include "tools/input/backends_yaml.h"

#include <doctest/doctest.h>

#include "tests/support/approx.h"

using namespace pipegrid;
using namespace pipegrid::input;
using pipegrid::testing::approx;

namespace {

std::string error_of(const std::string& yaml) {
  auto c = load_backend_catalog_text(yaml, "b.yaml");
  return c ? "" : c.error().message;
}

}  // namespace

TEST_CASE("a catalog: backends with defaults that patterns refine, and conversions") {
  auto c = load_backend_catalog_text(R"(backends:
  lib:
    device: a100
    efficiency: {conv: 0.5}
    launch: 3us
    patterns:
      - conv2d
      - [conv2d, add, relu]
      - {ops: [class:gemm], efficiency: {gemm: 0.7}, launch: 1us, source: "a paper, table 2"}
      - {ops: attention, measured: {forward: 1ms, backward: 2ms, batch: 8}}
  any:
    device: u280
    patterns: ["*"]
conversions:
  - {from: lib, to: "*", latency: 2us, bandwidth: 1TBps}
)",
                                     "b.yaml");
  REQUIRE(c);
  REQUIRE(c->backends.size() == 2);
  const Backend& lib = c->backends[0];
  CHECK(lib.name == "lib");
  CHECK(lib.device_kind == "a100");
  REQUIRE(lib.patterns.size() == 4);
  CHECK(lib.patterns[0].cost.compute_efficiency[static_cast<int>(KernelClass::Conv)] == approx(0.5));
  CHECK(lib.patterns[0].cost.launch_s == approx(3e-6));
  CHECK(lib.patterns[1].ops.size() == 3);
  CHECK(lib.patterns[1].ops[2].text == "relu");
  CHECK(lib.patterns[2].ops[0].kind == PatternOp::Kind::Class);
  CHECK(lib.patterns[2].ops[0].cls == KernelClass::Gemm);
  CHECK(lib.patterns[2].cost.compute_efficiency[static_cast<int>(KernelClass::Gemm)] == approx(0.7));
  CHECK(lib.patterns[2].cost.compute_efficiency[static_cast<int>(KernelClass::Conv)] == approx(0.5));  // inherited
  CHECK(lib.patterns[2].cost.launch_s == approx(1e-6));
  CHECK(lib.patterns[2].source == "a paper, table 2");
  REQUIRE(lib.patterns[3].cost.measured);
  CHECK(lib.patterns[3].cost.measured->backward_s == approx(2e-3));
  CHECK(lib.patterns[3].cost.measured->batch == approx(8));
  CHECK(c->backends[1].patterns[0].ops[0].kind == PatternOp::Kind::Any);
  // 2 us + 1 MB at 1 TB/s = 3 us from lib to any; nothing listed the other way.
  CHECK(c->conversion_time(0, 1, 1e6) == approx(3e-6));
  CHECK(c->conversion_time(1, 0, 1e6) == 0);
  CHECK(c->conversion_time(0, 0, 1e6) == 0);
}

TEST_CASE("the shipped catalogs parse") {
  for (const char* f : {"a100.yaml", "u280.yaml"}) {
    auto c = load_backend_catalog_file(std::string(PIPEGRID_SOURCE_DIR) + "/topologies/backends/" + f);
    INFO(f);
    REQUIRE(c);
    CHECK(c->backends.size() >= 4);
  }
}

TEST_CASE("catalog errors name file:line:column, the key path, what was expected and what was found") {
  CHECK(error_of("backends:\n  x:\n    device: a100\n    patterns: [class:gemmm]\n") ==
        "b.yaml:4:16: backends.x.patterns[0]: expected a kernel class after \"class:\" (gemm, conv, attention, "
        "recurrent, gather, elementwise, norm), got \"gemmm\"");
  CHECK(error_of("backends:\n  x:\n    device: a101\n    patterns: [conv2d]\n")
            .starts_with("b.yaml:3:13: backends.x.device: expected a device of the catalog ("));
  CHECK(error_of("backends:\n  x:\n    device: a100\n    efficiency: {conv: 1.5}\n    patterns: [conv2d]\n") ==
        "b.yaml:4:24: backends.x.efficiency.conv: expected a number in (0, 1], got \"1.5\"");
  CHECK(error_of("backends:\n  x:\n    device: a100\n    patterns: []\n") ==
        "b.yaml:4:15: backends.x.patterns: expected a non-empty list of patterns, got a list");
  CHECK(error_of("backends:\n  x:\n    device: a100\n    patterns: [conv2d]\nconversions:\n  - {from: y}\n") ==
        "b.yaml:6:12: conversions[0].from: expected a backend of this catalog or \"*\" (*, x), got \"y\" (did you mean "
        "\"*\"?)");
  CHECK(error_of("backends:\n  x:\n    device: a100\n    launch: fast\n    patterns: [conv2d]\n")
            .starts_with("b.yaml:4:13: backends.x.launch: expected a time like"));
  CHECK(error_of("backends:\n  x:\n    device: a100\n    patterns: [conv2d]\n    colour: red\n")
            .starts_with("b.yaml:5:5: backends.x.colour: unknown key"));
}
