// Backend catalogs (YAML): which layer patterns each backend of a device kind implements, what
// they cost, and what handing a tensor between backends costs (core/backends.h). Format:
//
//   backends:
//     cudnn-like:                       # a name, unique in the file
//       device: a100                    # device catalog name the backend runs on
//       description: ...
//       source: hypothetical ...        # citation or "hypothetical"
//       efficiency: {conv: 0.55}        # defaults for its patterns (per kernel class, fraction of peak)
//       memory_efficiency: {elementwise: 0.8}
//       launch: 5us                     # per kernel call (replaces the device's kernel_startup)
//       overhead: 0s                    # per layer and pass (replaces the device's layer_overhead)
//       patterns:
//         - conv2d                      # one op: a layer kind, class:KERNEL_CLASS, or "*"
//         - [conv2d, add, relu]         # a fused chain
//         - {ops: [class:gemm], efficiency: {gemm: 0.7}, source: ...}
//         - {ops: [attention], measured: {forward: 1ms, backward: 2ms, batch: 8}}
//   conversions:
//     - {from: "*", to: "*", latency: 5us, bandwidth: 1TBps, source: ...}
//
// Every error names file:line:column, the key path, what was expected and what was found.
#pragma once

#include <string>

#include "core/backends.h"
#include "core/result.h"

namespace pipegrid::input {

Result<BackendCatalog> load_backend_catalog_file(const std::string& path);
Result<BackendCatalog> load_backend_catalog_text(const std::string& text, const std::string& name);

class Node;
// Parses a catalog document's root (throws InputError).
BackendCatalog parse_backend_catalog(const Node& root);

}  // namespace pipegrid::input
