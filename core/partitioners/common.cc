#include "core/partitioners/common.h"

#include <fmt/format.h>

namespace pipegrid {

Status check_stage_count(const PartitionRequest& r) {
  const size_t devices = r.cluster.devices.size();
  const size_t layers = r.workload.layer_count();
  if (r.stages < 1) return Error{fmt::format("expected at least 1 stage, got {}", r.stages)};
  if (r.chunks < 1) return Error{fmt::format("expected at least 1 chunk, got {}", r.chunks)};
  if (r.replicas < 1) return Error{fmt::format("expected at least 1 replica, got {}", r.replicas)};
  if (r.replicas > 1 && static_cast<size_t>(r.stages) * r.replicas > devices)
    return Error{fmt::format("{} stages of {} replicas need {} devices, the cluster has {}", r.stages,
                             r.replicas, static_cast<size_t>(r.stages) * r.replicas, devices)};
  if (static_cast<size_t>(r.stages) > devices)
    return Error{fmt::format("{} stages need {} devices, the cluster has {}", r.stages, r.stages, devices)};
  const size_t total = static_cast<size_t>(r.stages) * r.chunks;
  if (total > layers) {
    if (r.chunks == 1)
      return Error{
          fmt::format("{} stages need at least {} layers, the workload has {}", r.stages, r.stages, layers)};
    return Error{fmt::format("{} ranks x {} chunks = {} stages need at least {} layers, the workload has {}",
                             r.stages, r.chunks, total, total, layers)};
  }
  return {};
}

Result<Partition> contiguous_partition(const PartitionRequest& r, const std::vector<int>& order,
                                       const std::vector<int>& bounds) {
  std::vector<int> stage_of(order.size(), -1);
  std::vector<std::vector<int>> devices;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    for (int k = bounds[s]; k < bounds[s + 1]; ++k) stage_of[order[k]] = static_cast<int>(s);
    const int rank = static_cast<int>(s) % r.stages;
    devices.emplace_back();
    for (int j = 0; j < r.replicas; ++j) devices.back().push_back(rank * r.replicas + j);
  }
  Result<Partition> p = make_partition(r.workload, stage_of, devices, r.cluster.devices.size());
  if (p) add_sequence_edges(*p);
  return p;
}

}  // namespace pipegrid
