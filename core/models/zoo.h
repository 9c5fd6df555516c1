// The model zoo: layer DAGs built from shapes (core/models/builder.h), with named parameters.
// Figures they reproduce are in ../shared/reference/models.md and the tests.
#pragma once

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
// Unknown names are errors listing the valid ones.
Result<const ModelInfo*> find_model(std::string_view name);
// Builds `info` with `args` over its defaults. Fails on a parameter the model does not take.
Result<Workload> build_model(const ModelInfo& info, const ModelArgs& args, Precision precision);

}  // namespace pipegrid
