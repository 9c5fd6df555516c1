// Model FLOPs of a transformer: what tokens/s, model TFLOP/s per device and MFU are computed from.
//
// Megatron-LM's model-FLOPs count (Narayanan et al., arXiv 2104.04473, eq. 3 without its recomputed
// forward) and PaLM's MFU definition (Chowdhery et al., arXiv 2204.02311, appendix B): per token,
// 6 N + 12 L h s FLOPs for a forward and a backward pass, N the parameters whose matrices every token
// multiplies, L the blocks, h the attention width, s the keys a query attends to. Recomputation is
// not counted (a model FLOP is one the model needs, not one the schedule repeats).
#pragma once

#include <optional>

#include "core/workload.h"

namespace pipegrid {

struct ModelFlops {
  // N: the transformer and MoE blocks' parameters a token uses (MoE: the router, the shared experts
  // and top_k of the routed experts, i.e. the ACTIVE parameters; dense blocks: all of theirs, with
  // their biases and norms) plus the output layer's V x h. The input embedding (a lookup) and
  // position embeddings multiply nothing and are left out, as in Megatron's eq. 3. A multi-token-
  // prediction module (Layer::multi_token_prediction) adds its block (to L too), its eh_proj (2 h x h)
  // and its pass through the shared head (V x h): every token multiplies them (eq. 3's terms).
  double active_parameters = 0;
  // Every parameter of the workload (the 6 N count of `search` uses it).
  double total_parameters = 0;
  // Attention's score and value products, forward and backward: per block 6 s x heads x (d_qk + d_v),
  // 12 L h s where the heads' widths add up to h. Counted over all s keys (no causal halving, as
  // Megatron and PaLM count them); a sliding-window block attends to min(s, window) keys.
  double attention_flops_per_token = 0;
  double sequence = 0;  // tokens per sample (the blocks' s)
  int blocks = 0;       // L
  bool moe = false;     // some block is a mixture of experts: N counts active parameters
  double flops_per_token() const { return 6 * active_parameters + attention_flops_per_token; }
};

// The model FLOPs of a workload with transformer or MoE blocks (TensorSplitKind Transformer or
// MoeBlock); nullopt for any other workload (CNNs, RNNs, profiled modules), whose tokens are undefined.
std::optional<ModelFlops> model_flops(const Workload& w);

}  // namespace pipegrid
