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

int rank_of_stage(int s, int ranks, int stages, std::string_view schedule) {
  if (schedule == "dualpipev" && stages == 2 * ranks) return s < ranks ? s : 2 * ranks - 1 - s;
  return s % ranks;
}

Result<Partition> contiguous_partition(const PartitionRequest& r, const std::vector<int>& order,
                                       const std::vector<int>& bounds) {
  std::vector<std::pair<int, int>> ranges;
  std::vector<std::vector<int>> devices;
  const int stages = static_cast<int>(bounds.size()) - 1;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    ranges.emplace_back(bounds[s], bounds[s + 1]);
    const int rank = r.stage_ranks.size() == static_cast<size_t>(stages)
                         ? r.stage_ranks[s]
                         : rank_of_stage(static_cast<int>(s), r.stages, stages, r.schedule);
    devices.emplace_back();
    for (int j = 0; j < r.replicas; ++j) devices.back().push_back(rank * r.replicas + j);
  }
  Result<Partition> p = contiguous_stages(r.workload, order, ranges, devices, r.cluster.devices.size());
  if (p && r.schedule == "dualpipe") return dualpipe_pipelines(*p);
  return p;
}

Result<Partition> contiguous_stages(const Workload& w, const std::vector<int>& order,
                                    const std::vector<std::pair<int, int>>& ranges,
                                    const std::vector<std::vector<int>>& devices, size_t device_count) {
  std::vector<int> stage_of(w.layer_count(), -1);
  for (size_t s = 0; s < ranges.size(); ++s)
    for (int k = ranges[s].first; k < ranges[s].second; ++k) stage_of[order[k]] = static_cast<int>(s);
  Result<Partition> p = make_partition(w, stage_of, devices, device_count);
  if (p) add_sequence_edges(*p);
  return p;
}

}  // namespace pipegrid
