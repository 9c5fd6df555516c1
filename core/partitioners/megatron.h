// The megatron partitioner's split of the transformer blocks over the pipeline stages, by
// Megatron-Core's rules (megatron/core/transformer/transformer_block.py, get_num_layers_to_build, and
// transformer_layer.py, get_transformer_layer_offset, read at core_r0.14.0; docs/3d-parallelism.md):
//  - even: every rank the same number of blocks;
//  - first_stage_blocks / last_stage_blocks: those counts on the first and last ranks, the rest split
//    evenly over the middle ranks;
//  - account_for_embedding / account_for_loss: the embedding and the loss each count as one block in an
//    even split, and the first (last) model chunk builds one block fewer;
//  - layout: Megatron-Core's --pipeline-model-parallel-layout (megatron/core/transformer/
//    pipeline_parallel_layer_layout.py), every stage's layers spelt out: `E` the embedding, `t` a
//    transformer block, `m` a multi-token-prediction module, `L` the loss (final norm and head), `|`
//    between stages in stage order, `x*n` and `(...)*n` repeated, commas ignored. Its rules: the
//    embedding first and the loss last, each once, the model's blocks and MTP modules all there, every
//    block before the first module, the modules in one stage. pipegrid keeps the modules with the head
//    (docs/moe.md), so they must share the loss's stage, and the embedding the first.
// With v chunks per rank each rank's count is split equally over its chunks, and the blocks run in
// Megatron's order: chunk k of rank r is stage k p + r, stages in order.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/strategy.h"

namespace pipegrid {

// The blocks a Megatron split places (is_layout_block) and the multi-token-prediction modules beside
// them (their blocks: Layer::multi_token_prediction), which a layout places too.
struct MegatronBlocks {
  int blocks = 0, mtp = 0;
};
MegatronBlocks megatron_blocks(const Workload& w);

struct MegatronLayout {
  std::vector<int> blocks;  // per stage (k p + r), in stage order; empty when the split does not fit
  // When it does not fit: the strategy key at fault ("first_stage_blocks", "chunks", ...; empty for
  // an even split, which names no key) and what was expected and found.
  std::string key;
  std::string problem;
  bool ok() const { return problem.empty(); }
};

// The split of `blocks` transformer blocks over `ranks` x `chunks` stages. Preconditions: blocks,
// ranks, chunks >= 1. `schedule`: dualpipev refuses the first/last-rank counts (its V puts the first
// and the last stage on one rank); every split is in stage order. `mtp_modules`: the workload's
// multi-token-prediction modules, which a layout must place.
MegatronLayout megatron_layout(int blocks, int ranks, int chunks, std::string_view schedule,
                               const MegatronSplit& split, int mtp_modules = 0);

// A layout string's stages, each the layer symbols it holds (E, t, m, L), expanded; or the problem
// (key "layout") with the character at fault.
struct ParsedLayout {
  std::vector<std::string> stages;
  std::string problem;
};
ParsedLayout parse_megatron_layout(std::string_view text);

}  // namespace pipegrid
