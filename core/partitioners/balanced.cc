// balanced: contiguous stages (layers in topological order) minimising the slowest stage's compute
// time (forward + backward of one micro-batch), stage i on device i - so heterogeneous devices get
// shares that match their speed. Exact dynamic programme over (stage, prefix): O(p n^2). Among
// optimal partitions the one found first (earliest cut points) is kept. Communication is not part
// of the objective (the event simulation accounts for it). With `chunks` v there are p x v
// stages, stage s on device s mod p. With `replicas` r, rank i is devices i r .. i r + r - 1 and a
// stage's time is its slowest replica's, for 1/r of the micro-batch.
#include <fmt/format.h>

#include <limits>

#include "core/partitioners/common.h"
#include "core/strategy.h"

namespace pipegrid {

Result<Partition> partition_balanced(const PartitionRequest& r) {
  if (Status st = check_stage_count(r); !st) return st.error();
  const std::vector<int> order = topological_order(r.workload);
  const int n = static_cast<int>(order.size());
  const int p = r.stages * r.chunks;
  // prefix[d][k] = time of layers order[0..k) on device d (for its replica's share of the micro-batch).
  const int devices = r.stages * r.replicas;
  std::vector<std::vector<double>> prefix(devices, std::vector<double>(n + 1, 0.0));
  for (int d = 0; d < devices; ++d) {
    for (int k = 0; k < n; ++k) {
      Result<PassTimes> t = device_layer_times(r.workload.layer(order[k]), r.workload.precision,
                                               r.cluster.devices[d], r.micro_batch_size / r.replicas);
      if (!t) return t.error();
      prefix[d][k + 1] = prefix[d][k] + t->forward + t->backward();
    }
  }
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[s][j]: smallest max stage time placing layers [0, j) on stages 0..s-1 (every stage non-empty).
  std::vector<std::vector<double>> best(p + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> cut(p + 1, std::vector<int>(n + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= p; ++s) {
    const int rank = (s - 1) % r.stages;
    for (int j = s; j <= n - (p - s); ++j) {
      for (int k = s - 1; k < j; ++k) {
        if (best[s - 1][k] == kInf) continue;
        double v = best[s - 1][k];
        for (int d = rank * r.replicas; d < (rank + 1) * r.replicas; ++d)
          v = std::max(v, prefix[d][j] - prefix[d][k]);
        if (v < best[s][j]) {
          best[s][j] = v;
          cut[s][j] = k;
        }
      }
    }
  }
  std::vector<int> bounds(p + 1);
  bounds[p] = n;
  for (int s = p; s >= 1; --s) bounds[s - 1] = cut[s][bounds[s]];
  return contiguous_partition(r, order, bounds);
}

}  // namespace pipegrid
