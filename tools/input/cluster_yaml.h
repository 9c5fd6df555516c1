// The `cluster` section of an experiment file.
#pragma once

#include "core/cluster.h"
#include "tools/input/yaml_node.h"

namespace pipegrid::input {

Cluster parse_cluster(const Node& n);

}  // namespace pipegrid::input
