// Helpers shared by the contiguous (sequential-pipeline) partitioners.
#pragma once

#include <vector>

#include "core/strategy.h"

namespace pipegrid {

// Fails unless 1 <= r.stages <= min(devices, layers).
Status check_stage_count(const PartitionRequest& r);

// Stage i = layers order[bounds[i] .. bounds[i+1]) on device i.
Result<Partition> contiguous_partition(const PartitionRequest& r, const std::vector<int>& order,
                                       const std::vector<int>& bounds);

}  // namespace pipegrid
