// Helpers shared by the contiguous (sequential-pipeline) partitioners.
#pragma once

#include <vector>

#include "core/strategy.h"

namespace pipegrid {

// Fails unless 1 <= r.stages x r.replicas <= devices, r.chunks >= 1 and r.stages x r.chunks <= layers.
Status check_stage_count(const PartitionRequest& r);

// The rank of stage s of `stages` on `ranks` ranks: s mod ranks (Megatron's interleaving), or for
// the dualpipev schedule the V: stage s and stage 2 ranks - 1 - s on rank s.
int rank_of_stage(int s, int ranks, int stages, std::string_view schedule);

// Stage i = layers order[bounds[i] .. bounds[i+1]) on r.stage_ranks[i] where a schedule file gave the
// placement, else rank_of_stage(i) (rank i without interleaving),
// rank q being devices q r.replicas .. q r.replicas + r.replicas - 1; consecutive stages form a chain
// (add_sequence_edges). For the dualpipe schedule, that chain and its mirror copy
// (dualpipe_pipelines).
Result<Partition> contiguous_partition(const PartitionRequest& r, const std::vector<int>& order,
                                       const std::vector<int>& bounds);

// Stage i = layers order[ranges[i].first, ranges[i].second) on devices[i] (the ranges cover the
// order, in pipeline order), consecutive stages chained (add_sequence_edges). Fails as make_partition.
Result<Partition> contiguous_stages(const Workload& w, const std::vector<int>& order,
                                    const std::vector<std::pair<int, int>>& ranges,
                                    const std::vector<std::vector<int>>& devices, size_t device_count);

}  // namespace pipegrid
