// dp: pure data parallelism, the baseline every pipeline is compared with. One stage holds every
// layer and runs on every device of the cluster: each device takes 1/D of every micro-batch, and
// the gradients are all-reduced after the last backward (the strategy's `allreduce`, ring by
// default). `stages` is ignored; `chunks` must be 1.
#include <fmt/format.h>

#include "core/strategy.h"

namespace pipegrid {

Result<Partition> partition_dp(const PartitionRequest& r) {
  if (r.chunks != 1) return Error{fmt::format("the dp partitioner runs one stage, not {} chunks", r.chunks)};
  std::vector<int> devices(r.cluster.devices.size());
  for (size_t d = 0; d < devices.size(); ++d) devices[d] = static_cast<int>(d);
  return make_partition(r.workload, std::vector<int>(r.workload.layer_count(), 0), {devices},
                        r.cluster.devices.size());
}

}  // namespace pipegrid
