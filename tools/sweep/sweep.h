// Sweep files: a base experiment and axes of values for any key path, combined as a grid
// (product) and zipped groups, with ranges, scale factors and filters. See docs/sweeps.md.
//
//   base: experiment.yaml            # or `experiment:` with the experiment inline
//   grid:                            # every combination (the first key varies slowest)
//     strategy.micro_batches: [4, 8, 16]
//     cluster.device.dsps: {scale: [0.5, 1, 2, 4]}        # x the base value (or `of: 9024`)
//     cluster.qsfp.bandwidth: {from: 100Gbps, to: 400Gbps, times: 2}
//   zip:                             # lists of equal length taken together (or a list of groups)
//     cluster.bandwidth: [25GBps, 50GBps]
//     cluster.latency: [1us, 2us]
//   where: ["cluster.count * strategy.micro_batches <= 64"]   # keep points where all hold
//   skip: ["cluster.device.model == 'u280-ddr' and cluster.count > 32"]   # drop where any holds
//
// A point is an index into the product of the factors (each grid axis, each zip group) in the
// order written; its number never changes when filters change, so results stay keyed by it.
#pragma once

#include <yaml-cpp/yaml.h>

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "tools/input/yaml_node.h"

namespace pipegrid::sweep {

// A number as filters see it: its value in SI units (25GBps = 2.5e10) and its dimension, as the
// exponents of seconds, bytes and floating-point operations (25GBps: {-1, 1, 0}; a count: {0, 0, 0}).
struct Quantity {
  double value = 0;
  std::array<int, 3> dimension{};
  bool operator==(const Quantity& o) const { return value == o.value && dimension == o.dimension; }
};

// A value as filters see it: a quantity, a string, a bool.
using Value = std::variant<Quantity, std::string, bool>;

struct Axis {
  std::string path;                 // "cluster.device.dsps"
  std::vector<YAML::Node> values;   // positioned in the sweep file (computed ones at their axis)
  std::vector<std::string> labels;  // the values as YAML text ("25GBps", "[4, 4]")
  std::vector<Value> filter_values;
  std::vector<nlohmann::json> json_values;  // numbers as numbers, other scalars as strings
};

struct Factor {
  std::vector<size_t> axes;  // a grid axis, or a zip group's axes
  size_t size = 0;
};

class Expression;

class Sweep {
 public:
  // Reads a sweep file; throws input::InputError with file:line:column.
  static Sweep load(const std::string& path);
  // The same from a file's text; `path` names it in errors and anchors a relative `base:`.
  static Sweep load_text(std::string text, const std::string& path);
  ~Sweep();
  Sweep(Sweep&&) noexcept;
  Sweep& operator=(Sweep&&) noexcept;

  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }
  const std::vector<Axis>& axes() const { return axes_; }
  // Points in the whole product (before filters).
  size_t grid_size() const { return grid_size_; }
  // The value index of each axis at `point`.
  std::vector<size_t> value_indices(size_t point) const;
  // Whether `point` passes the filters.
  bool selected(size_t point) const;
  // The selected points, in order.
  std::vector<size_t> points() const;
  // {path: value} of a point (in axis order).
  nlohmann::json axis_values(size_t point) const;
  // "cluster.count=4 strategy.micro_batches=8"
  std::string describe(size_t point) const;
  // A hash (hex) of the base experiment's text and of the factors (axes, their values, grid and
  // zip grouping): a database holds one sweep. Filters and the name are not in it.
  const std::string& fingerprint() const { return fingerprint_; }

  // The base experiment's document with the point's values set (errors name the sweep file).
  input::Document experiment_document(size_t point) const;

 private:
  Sweep() = default;
  std::string path_;
  std::string name_;
  std::string text_;  // the sweep file's
  std::unique_ptr<input::Document> doc_;
  std::string base_path_;  // resolved; empty when the experiment is inline
  std::string base_text_;
  std::vector<Axis> axes_;
  std::vector<input::Node> axis_keys_;  // for errors while setting values
  std::vector<Factor> factors_;
  size_t grid_size_ = 1;
  std::vector<std::unique_ptr<Expression>> where_, skip_;
  std::string fingerprint_;
};

// FNV-1a 64-bit of `text`, as 16 hex digits.
std::string fnv1a_hex(std::string_view text, uint64_t seed = 1469598103934665603ull);

}  // namespace pipegrid::sweep
