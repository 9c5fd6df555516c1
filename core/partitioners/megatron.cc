// megatron: Megatron-LM's split of a transformer: the transformer blocks in contiguous runs, one per
// stage (ranks x chunks stages with interleaving, stage i on rank i mod ranks), the layers before the
// first block (input, embeddings) with the first stage and those after the last block (final norm,
// head) with the last stage. The runs are equal, as Megatron requires by default (--num-layers a
// multiple of the pipeline size, times the virtual size when interleaving), or uneven as Megatron-Core's
// first/last-stage counts and its embedding and loss accounting set them (megatron_layout).
#include "core/partitioners/megatron.h"

#include <fmt/format.h>

#include "core/partitioners/common.h"
#include "core/strategy.h"

namespace pipegrid {

namespace {

// One rank's problem: the layout names the key at fault and what was expected.
MegatronLayout refused(std::string_view key, std::string problem) {
  return {{}, std::string(key), std::move(problem)};
}

std::string chunk_multiple(int chunks, int count) {
  return fmt::format(
      "expected a multiple of the {} chunks per rank (Megatron-Core splits a rank's blocks equally "
      "over its chunks), got {}",
      chunks, count);
}

// The blocks of each pipeline rank (all its chunks) under the first/last-stage counts, or why not.
MegatronLayout first_last_ranks(int n, int ranks, const MegatronSplit& s) {
  const int f = s.first_stage_blocks, l = s.last_stage_blocks;
  const std::string_view key = f > 0 ? "first_stage_blocks" : "last_stage_blocks";
  const std::string_view later = l > 0 ? "last_stage_blocks" : "first_stage_blocks";
  if (s.account_for_embedding || s.account_for_loss)
    return refused(s.account_for_embedding ? "account_for_embedding" : "account_for_loss",
                   "expected false with first_stage_blocks or last_stage_blocks (Megatron-Core refuses the "
                   "two uneven splits together), got true");
  if (ranks < 2)
    return refused(key,
                   "expected a pipeline of at least 2 ranks (strategy.stages; with one the first rank is "
                   "the last), got 1");
  const int middle = n - f - l, middle_ranks = ranks - (f > 0) - (l > 0);
  if (middle < 0 || (middle == 0) != (middle_ranks == 0))
    return refused(
        later, fmt::format("expected the first and last ranks' blocks to leave {} for the {} middle "
                           "rank{} (the workload has {} transformer blocks), got {} + {}",
                           middle_ranks == 0 ? "none" : "some", middle_ranks, middle_ranks == 1 ? "" : "s", n,
                           f, l));
  if (middle_ranks > 0 && middle % middle_ranks != 0)
    return refused(later,
                   fmt::format("expected the {} blocks left by the first and last ranks ({} - {} - {}) "
                               "to be a multiple of the {} middle ranks, got {}",
                               middle, n, f, l, middle_ranks, middle));
  MegatronLayout out;
  out.blocks.assign(ranks, middle_ranks > 0 ? middle / middle_ranks : 0);
  if (f > 0) out.blocks.front() = f;
  if (l > 0) out.blocks.back() = l;
  return out;
}

// Each rank's blocks in an even split, the embedding and the loss counted as blocks where accounted.
MegatronLayout even_ranks(int n, int ranks, int chunks, const MegatronSplit& s) {
  if (!s.uneven()) {
    if (n % (ranks * chunks) == 0) return {std::vector<int>(ranks, n / ranks), {}, {}};
    return refused("",
                   fmt::format("the megatron partitioner needs the {} transformer blocks to be a multiple of "
                               "the {} stages ({} ranks x {} chunk{}), as Megatron-LM does",
                               n, ranks * chunks, ranks, chunks, chunks == 1 ? "" : "s"));
  }
  const int slots = n + s.account_for_embedding + s.account_for_loss;
  const std::string counted =
      fmt::format("{} blocks{}{} = {}", n, s.account_for_embedding ? " + the embedding" : "",
                  s.account_for_loss ? " + the loss" : "", slots);
  if (slots % ranks != 0)
    return refused(
        s.account_for_loss ? "account_for_loss" : "account_for_embedding",
        fmt::format("expected {} to be a multiple of the {} pipeline ranks (Megatron-Core's rule), got "
                    "{} left over",
                    counted, ranks, slots % ranks));
  if ((slots / ranks) % chunks != 0)
    return refused("chunks",
                   fmt::format("expected a divisor of the {} blocks per rank ({} over {} ranks), got {}",
                               slots / ranks, counted, ranks, chunks));
  return {std::vector<int>(ranks, slots / ranks), {}, {}};
}

// Megatron-Core splits each rank's blocks equally over its chunks: the first and last ranks' counts
// as given, the middle ranks' share.
MegatronLayout check_chunks(MegatronLayout out, int chunks, const MegatronSplit& s) {
  const int ranks = static_cast<int>(out.blocks.size());
  for (int r = 0; r < ranks; ++r) {
    if (out.blocks[r] % chunks == 0) continue;
    if (r == 0 && s.first_stage_blocks > 0)
      return refused("first_stage_blocks", chunk_multiple(chunks, out.blocks[r]));
    if (r == ranks - 1 && s.last_stage_blocks > 0)
      return refused("last_stage_blocks", chunk_multiple(chunks, out.blocks[r]));
    return refused("chunks", fmt::format("expected a divisor of the {} blocks on each middle rank, got {}",
                                         out.blocks[r], chunks));
  }
  return out;
}

}  // namespace

MegatronLayout megatron_layout(int n, int ranks, int chunks, std::string_view schedule,
                               const MegatronSplit& s) {
  const bool first_last = s.first_stage_blocks > 0 || s.last_stage_blocks > 0;
  if (s.uneven() && (schedule == "dualpipe" || schedule == "dualpipev"))
    return refused(
        first_last ? (s.first_stage_blocks > 0 ? "first_stage_blocks" : "last_stage_blocks")
                   : (s.account_for_embedding ? "account_for_embedding" : "account_for_loss"),
        fmt::format("used with schedules that run stage s on rank s mod p, as Megatron-Core does; {} "
                    "places its stages otherwise",
                    schedule));
  MegatronLayout out = first_last ? first_last_ranks(n, ranks, s) : even_ranks(n, ranks, chunks, s);
  if (out.ok() && first_last) out = check_chunks(std::move(out), chunks, s);
  if (!out.ok()) return out;
  std::vector<int> stages(static_cast<size_t>(ranks) * chunks);
  for (int k = 0; k < chunks; ++k)
    for (int r = 0; r < ranks; ++r) stages[k * ranks + r] = out.blocks[r] / chunks;
  // The embedding and the loss take one block's place in the first and the last model chunk.
  stages.front() -= s.account_for_embedding;
  stages.back() -= s.account_for_loss;
  out.blocks = std::move(stages);
  return out;
}

Result<Partition> partition_megatron(const PartitionRequest& r) {
  if (Status st = check_stage_count(r); !st) return st.error();
  const std::vector<int> order = topological_order(r.workload);
  std::vector<int> blocks;  // positions in `order` of the transformer blocks
  for (size_t i = 0; i < order.size(); ++i)
    if (is_layout_block(r.workload.layer(order[i]))) blocks.push_back(static_cast<int>(i));
  const int n = static_cast<int>(blocks.size());
  if (n == 0)
    return Error{fmt::format(
        "the megatron partitioner splits transformer (or MoE) blocks, and workload \"{}\" has none",
        r.workload.name)};
  const MegatronSplit& split = r.options.megatron;
  const MegatronLayout layout = megatron_layout(n, r.stages, r.chunks, r.schedule, split);
  if (!layout.ok())
    return Error{layout.key.empty() ? layout.problem
                                    : fmt::format("strategy.{}: {}", layout.key, layout.problem)};
  for (int i = 1; i < n; ++i)
    if (blocks[i] != blocks[i - 1] + 1)
      return Error{
          fmt::format("the megatron partitioner needs the transformer blocks to be consecutive in the "
                      "layer order; layer \"{}\" lies between two of them",
                      r.workload.layer(order[blocks[i - 1] + 1]).name)};
  std::vector<int> bounds{0};
  int end = blocks[0];  // the position after the last block placed so far
  for (size_t s = 0; s + 1 < layout.blocks.size(); ++s) bounds.push_back(end += layout.blocks[s]);
  bounds.push_back(static_cast<int>(order.size()));
  for (size_t s = 0; s + 1 < bounds.size(); ++s)
    if (bounds[s] == bounds[s + 1])
      return Error{
          fmt::format("the megatron partitioner's stage {} would hold no layer (its chunk has no "
                      "transformer block and the workload has no layer {} the blocks)",
                      s, s == 0 ? "before" : "after")};
  return contiguous_partition(r, order, bounds);
}

}  // namespace pipegrid
