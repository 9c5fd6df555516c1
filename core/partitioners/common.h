// Helpers shared by the contiguous (sequential-pipeline) partitioners.
#pragma once

#include <vector>

#include "core/strategy.h"

namespace pipegrid {

// Fails unless 1 <= r.stages x r.replicas <= devices, r.chunks >= 1 and r.stages x r.chunks <= layers.
Status check_stage_count(const PartitionRequest& r);

// Stage i = layers order[bounds[i] .. bounds[i+1]) on rank i mod r.stages (rank i without
// interleaving), rank q being devices q r.replicas .. q r.replicas + r.replicas - 1; consecutive
// stages form a chain (add_sequence_edges).
Result<Partition> contiguous_partition(const PartitionRequest& r, const std::vector<int>& order,
                                       const std::vector<int>& bounds);

}  // namespace pipegrid
