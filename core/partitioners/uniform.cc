// uniform: equal layer counts. With n layers and p stages, the first n mod p stages get one layer
// more than the others. Layers are taken in topological order; stage i runs on device i (with
// `chunks` v: p x v stages, stage i on device i mod p, as in Megatron's interleaving).
#include <fmt/format.h>

#include "core/partitioners/common.h"
#include "core/strategy.h"

namespace pipegrid {

Result<Partition> partition_uniform(const PartitionRequest& r) {
  if (Status st = check_stage_count(r); !st) return st.error();
  const std::vector<int> order = topological_order(r.workload);
  const int n = static_cast<int>(order.size());
  const int p = r.stages * r.chunks;
  std::vector<int> sizes(p, n / p);
  for (int i = 0; i < n % p; ++i) ++sizes[i];
  std::vector<int> bounds{0};
  for (int s : sizes) bounds.push_back(bounds.back() + s);
  return contiguous_partition(r, order, bounds);
}

}  // namespace pipegrid
