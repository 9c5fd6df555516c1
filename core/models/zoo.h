// The model zoo: layer DAGs built from shapes (core/models/builder.h), with named parameters.
// Figures they reproduce are in docs/reference/models.md and the tests.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"
#include "core/workload.h"

namespace pipegrid {

// Named numeric parameters of a model (layers, hidden, heads, ...); missing ones take defaults.
using ModelArgs = std::map<std::string, double, std::less<>>;

struct ModelInfo {
  std::string_view name;
  std::string_view description;
  std::vector<std::pair<std::string_view, double>> defaults;  // every parameter the model takes
  Result<Workload> (*build)(const ModelArgs& args, Precision precision);
};

std::span<const ModelInfo> model_zoo();
// The layer kinds the zoo's builders give their layers (beside the model format's kinds: a
// backend pattern may name either); tests/core/zoo_test.cc builds every model against it.
const std::vector<std::string_view>& zoo_layer_kinds();
// Unknown names are errors listing the valid ones.
Result<const ModelInfo*> find_model(std::string_view name);
// The values a model parameter may take: sizes and counts from 1 to 1e9 (a model of 0 classes or
// 0 layers is no model; the bound keeps derived counts exact), `pooled` (a flag) 0 or 1.
struct ParameterRange {
  int64_t lo = 1, hi = 1'000'000'000;
  std::string text() const;  // "an integer from 1 to 1000000000", "0 or 1"
};
ParameterRange parameter_range(std::string_view parameter);

// Builds `info` with `args` over its defaults. Fails on a parameter the model does not take.
Result<Workload> build_model(const ModelInfo& info, const ModelArgs& args, Precision precision);

}  // namespace pipegrid
