// User models in YAML: a list of layers, each with a `kind` and shape parameters from which
// costs are derived (core/models/builder.h), or explicit costs (`kind: custom`). Layers take
// the previous layer as input unless they name their `inputs` (a DAG; any order).
//
//   name: my-mlp
//   precision: fp32            # optional
//   micro_batch_size: 8        # optional
//   layers:
//     - {name: x, kind: input, shape: [4096]}
//     - {name: fc1, kind: linear, in_features: 4096, out_features: 4096}
//     - {name: act, kind: relu}
//     - {name: fc2, kind: linear, in_features: 4096, out_features: 10}
//
// Kinds and their keys are listed in workloads/README.md.
#pragma once

#include <optional>
#include <string>

#include "core/workload.h"
#include "tools/input/yaml_node.h"

namespace pipegrid::input {

// The layer kinds a model file may use, for messages and documentation.
const std::vector<std::string_view>& layer_kinds();

// Builds a workload from a `layers` list. Shape mismatches, unknown kinds, unknown inputs and
// cycles are InputErrors at the offending layer.
Workload parse_layers(const Node& layers, const std::string& name, Precision precision);

// A whole model file (keys name, precision, micro_batch_size, layers); `precision` overrides the
// file's when given.
Workload load_model_file(const Node& where, const std::string& path, std::optional<Precision> precision);

// The same for a path given on the command line; errors as values.
Result<Workload> load_model_file(const std::string& path, std::optional<Precision> precision);

// A model file's document (or text; `name` names it in messages).
Workload parse_model_document(const Document& doc, std::optional<Precision> precision);
Result<Workload> load_model_text(const std::string& text, const std::string& name,
                                 std::optional<Precision> precision);

}  // namespace pipegrid::input
