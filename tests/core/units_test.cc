#include "core/units.h"

#include <doctest/doctest.h>

#include <cmath>

#include "tests/support/approx.h"

using namespace pipegrid;

TEST_CASE("quantities parse to SI base units") {
  CHECK(*parse_quantity("1ms", Dimension::Time) == pipegrid::testing::approx(1e-3).epsilon(1e-15));
  CHECK(*parse_quantity("2.5us", Dimension::Time) == pipegrid::testing::approx(2.5e-6).epsilon(1e-15));
  CHECK(*parse_quantity("3 ns", Dimension::Time) == pipegrid::testing::approx(3e-9).epsilon(1e-15));
  CHECK(*parse_quantity("0s", Dimension::Time) == 0.0);
  CHECK(*parse_quantity("25GBps", Dimension::Bandwidth) == 25e9);
  CHECK(*parse_quantity("25GB/s", Dimension::Bandwidth) == 25e9);
  CHECK(*parse_quantity("100Gbps", Dimension::Bandwidth) == 12.5e9);
  CHECK(*parse_quantity("1000TBps", Dimension::Bandwidth) == 1e15);
  CHECK(*parse_quantity("16GiB", Dimension::Bytes) == std::ldexp(1.0, 34));
  CHECK(*parse_quantity("8MiB", Dimension::Bytes) == 8388608.0);
  CHECK(*parse_quantity("1GB", Dimension::Bytes) == 1e9);
  CHECK(*parse_quantity("125TFLOPS", Dimension::FlopRate) == 1.25e14);
  CHECK(*parse_quantity("1e3B", Dimension::Bytes) == 1000.0);
}

TEST_CASE("quantity errors say what was expected and what was found") {
  CHECK(parse_quantity("fast", Dimension::Bandwidth).error().message ==
        "expected a bandwidth like \"25GBps\", got \"fast\"");
  CHECK(parse_quantity("5GB", Dimension::Time).error().message ==
        "expected a time like \"1ms\", got \"5GB\" (\"GB\" is the unit of a byte size)");
  CHECK(parse_quantity("5", Dimension::Bytes).error().message ==
        "expected a byte size like \"16GiB\", got \"5\" (the unit is missing)");
  CHECK(parse_quantity("5 parsecs", Dimension::Time).error().message ==
        "expected a time like \"1ms\", got \"5 parsecs\" (unknown unit \"parsecs\")");
  CHECK(parse_quantity("-1ms", Dimension::Time).error().message ==
        "expected a non-negative time like \"1ms\", got \"-1ms\"");
  CHECK(*parse_quantity("-1ms", Dimension::Time, /*allow_negative=*/true) ==
        pipegrid::testing::approx(-1e-3));
}

TEST_CASE("formatting picks a readable unit") {
  CHECK(format_time(0.0713) == "71.3 ms");
  CHECK(format_time(2.5e-6) == "2.5 us");
  CHECK(format_bytes(16.0 * (1 << 20)) == "16 MiB");
  CHECK(format_bandwidth(25e9) == "25 GB/s");
  CHECK(format_flop_rate(1.25e14) == "125 TFLOP/s");
}
