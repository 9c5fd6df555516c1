// sim::PairTable (the replay's look-up of a pair's start delay and route) against hand-written
// expectations: pairs added in any order, repeated pairs, pairs added after a look-up, absent pairs.
#include "sim/pair_table.h"

#include <doctest/doctest.h>

#include <string>

using pipegrid::sim::PairTable;

TEST_CASE("PairTable: finds every pair added, in any order, and nothing else") {
  PairTable<std::string> t;
  t.add(3, 1, "3-1");
  t.add(0, 2, "0-2");
  t.add(3, 0, "3-0");
  t.add(0, 1, "0-1");
  t.add(3, 1, "3-1 again");  // the last value of a pair wins
  REQUIRE(t.find(0, 1) != nullptr);
  CHECK(*t.find(0, 1) == "0-1");
  CHECK(*t.find(0, 2) == "0-2");
  CHECK(*t.find(3, 0) == "3-0");
  CHECK(*t.find(3, 1) == "3-1 again");
  CHECK(t.find(1, 0) == nullptr);  // a row with no pair
  CHECK(t.find(0, 3) == nullptr);  // a row without that destination
  CHECK(t.find(3, 2) == nullptr);
  CHECK(t.find(4, 0) == nullptr);  // past the last row
  CHECK(t.find(1000000, 1) == nullptr);
  // Added after a look-up: merged with what was there; a repeated pair takes the new value.
  t.add(1, 0, "1-0");
  t.add(0, 2, "0-2 new");
  CHECK(*t.find(1, 0) == "1-0");
  CHECK(*t.find(0, 2) == "0-2 new");
  CHECK(*t.find(3, 1) == "3-1 again");
  CHECK(*t.find(0, 1) == "0-1");
}

TEST_CASE("PairTable: empty") {
  PairTable<double> t;
  CHECK(t.find(0, 0) == nullptr);
  CHECK(t.find(7, 3) == nullptr);
}
