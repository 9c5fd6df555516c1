// megatron: Megatron-LM's split of a transformer: the transformer blocks in equal contiguous runs, one
// per stage (ranks x chunks stages with interleaving, stage i on rank i mod ranks), the layers before
// the first block (input, embeddings) with the first stage and those after the last block (final
// norm, head) with the last stage. Megatron requires the block count to be a multiple of the stage
// count (--num-layers by the pipeline size, and by it times the virtual size when interleaving).
#include <fmt/format.h>

#include "core/partitioners/common.h"
#include "core/strategy.h"

namespace pipegrid {

Result<Partition> partition_megatron(const PartitionRequest& r) {
  if (Status st = check_stage_count(r); !st) return st.error();
  const std::vector<int> order = topological_order(r.workload);
  std::vector<int> blocks;  // positions in `order` of the transformer blocks
  for (size_t i = 0; i < order.size(); ++i)
    if (is_block(r.workload.layer(order[i]).split.kind))
      blocks.push_back(static_cast<int>(i));
  const int stages = r.stages * r.chunks;
  const int n = static_cast<int>(blocks.size());
  if (n == 0)
    return Error{fmt::format(
        "the megatron partitioner splits transformer (or MoE) blocks, and workload \"{}\" has none", r.workload.name)};
  if (n % stages != 0)
    return Error{
        fmt::format("the megatron partitioner needs the {} transformer blocks to be a multiple of the {} "
                    "stages ({} ranks x {} chunks), as Megatron-LM does",
                    n, stages, r.stages, r.chunks)};
  for (int i = 1; i < n; ++i)
    if (blocks[i] != blocks[i - 1] + 1)
      return Error{
          fmt::format("the megatron partitioner needs the transformer blocks to be consecutive in the "
                      "layer order; layer \"{}\" lies between two of them",
                      r.workload.layer(order[blocks[i - 1] + 1]).name)};
  std::vector<int> bounds{0};
  const int per = n / stages;
  for (int s = 1; s < stages; ++s) bounds.push_back(blocks[0] + s * per);
  bounds.push_back(static_cast<int>(order.size()));
  return contiguous_partition(r, order, bounds);
}

}  // namespace pipegrid
