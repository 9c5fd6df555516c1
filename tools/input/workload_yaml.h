// The `workload` section of an experiment file.
#pragma once

#include "core/workload.h"
#include "tools/input/yaml_node.h"

namespace pipegrid::input {

Workload parse_workload(const Node& n);

}  // namespace pipegrid::input
