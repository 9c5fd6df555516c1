// Tensor parallelism as Megatron-LM runs it (Shoeybi et al., arXiv 1909.08053; Narayanan et al.,
// arXiv 2104.04473; Korthikanti et al., arXiv 2205.05198): a stage replica is a group of t devices
// that each hold 1/t of the weights of every split layer and run every pass together, separated by
// the group's collectives.
//
// A pass of a layer on one device of the group is a list of pieces: compute (per-device kernels,
// timed by the cost model like any layer) and collectives over the group. Per transformer layer:
//   without sequence parallelism (SP), forward:
//     [LN1, QKV (column), attention core (heads/t), softmax + dropout, output projection (row)]
//     all-reduce(s h) [dropout + residual, LN2, MLP up (column), activation, MLP down (row)]
//     all-reduce(s h) [dropout + residual]
//   backward: the mirror, with the all-reduces after the column-parallel layers' input gradients;
//   with SP, each all-reduce becomes a reduce-scatter (forward) / all-gather (backward) pair and the
//   norms, dropouts and residuals run on 1/t of the sequence:
//     [LN1] all-gather [QKV .. projection] reduce-scatter [dropout, residual, LN2] all-gather
//     [MLP] reduce-scatter [dropout + residual]
// Embedding (vocabulary-parallel): forward all-reduce (SP: reduce-scatter) of its output; its
// backward's gradient all-gather with SP. Output head (vocabulary-parallel): SP all-gather of its
// input, the logits' GEMM on V/t columns, one all-reduce of the cross-entropy's three per-token
// fp32 statistics (max, sum of exponentials, target logit: Megatron issues three, merged here), and
// in the backward the input gradient all-reduced (SP: reduce-scattered).
#pragma once

#include <utility>
#include <vector>

#include "core/collectives.h"
#include "core/context_parallel.h"
#include "core/memory.h"
#include "core/moe.h"
#include "core/result.h"
#include "core/workload.h"

namespace pipegrid {

struct TensorParallelOptions {
  bool sequence_parallel = false;
  // Megatron's overlap of TP communication with the GEMMs (--tp-comm-overlap): a collective runs
  // beside the compute piece that follows it, which then does not wait for it; the piece after that
  // does. Off: every collective blocks the device (the default, as Megatron-LM without the option).
  bool overlap = false;
  MoeOptions moe;                      // MoE blocks: the dispatcher, capacity factor and routing
  ContextParallelOptions context;      // stages with context_parallel > 1
  RecomputeModules recompute_modules;  // what selective recomputation re-runs (core/memory.h)
  // Megatron-LM's asynchronous tensor-parallel communication in a column-parallel linear's backward
  // (--async-tensor-model-parallel-allreduce from 2021-08-30, on by default from 2022 and unconditional
  // in Megatron-Core: megatron/core/tensor_parallel/layers.py, LinearWithGradAccumulationAndAsync-
  // Communication.backward): the input gradient's all-reduce (reduce-scatter with sequence
  // parallelism) starts after the input-gradient GEMM and runs beside the weight-gradient GEMM, and
  // with sequence parallelism the linear's input is re-gathered beside the input-gradient GEMM. Off:
  // the collective follows both GEMMs (Megatron-LM before 2021-08-30). Blocks with GQA or multi-head
  // attention (QKV, the dense MLP's first GEMM) and the vocabulary head.
  bool wgrad_overlap = true;
  // Megatron-Core's activation_func_fp8_input_store (MemoryOptions::activation_fp8_input_store).
  bool activation_fp8_input_store = false;
};

// How a collective sits among a pass's compute pieces beyond the default (the next piece waits for
// it; TensorParallelOptions::overlap shifts that by one for the tensor-parallel group's):
inline constexpr unsigned char kBesideNext = 1;     // runs beside the next piece; the one after waits
inline constexpr unsigned char kAfterPrevious = 2;  // its flows also wait for the previous collective
                                                    // of its group in the pass (a ring's next step)
inline constexpr unsigned char kNoFlows = 4;        // no transfer: only a boundary between two pieces

// One piece of a layer's pass on one device of a group of t.
struct TpPiece {
  bool collective = false;
  // Compute: per-device kernels (per sample), timed by layer_times on the layer's device.
  std::vector<Kernel> kernels;
  // Collective: its kind and the bytes per sample of the whole tensor (the all-reduced tensor, the
  // all-gather's output, the reduce-scatter's input).
  CollectiveKind kind = CollectiveKind::AllReduce;
  double bytes = 0;
  // The group the collective runs over (the tensor-parallel group, or an MoE block's expert groups,
  // core/moe.h). For an all-to-all, `bytes` is what one device sends in all (its share for each
  // peer follows the peers' expert loads).
  CommGroup group = CommGroup::Tensor;
  // Scales with the device's expert load (ep x its expert-parallel rank's load, 1 when balanced):
  // the experts' compute, and the expert tensor-parallel collectives around it.
  bool expert_load = false;
  // An all-to-all that returns the experts' outputs to the tokens' devices (the combine, and the
  // backward's second all-to-all): each device sends back to each peer what that peer sent it.
  bool combine = false;
  // An expert-parallel all-to-all of the DeepEP dispatcher (MoeDispatcher::DeepEP): the routing draw it
  // de-duplicates (experts 0 otherwise); `bytes` stays the top_k copies a device routes.
  RoutingDraw deduplicates;
  unsigned char flags = 0;  // kBesideNext | kAfterPrevious | kNoFlows
};

// A layer under tensor parallelism, on one device of the group.
struct TpLayer {
  std::vector<TpPiece> forward;   // in execution order
  std::vector<TpPiece> backward;  // in execution order (the layer's backward)
  std::vector<Kernel> recompute;  // selective recomputation: the forward kernels the backward re-runs
  // Context parallelism: bytes per sample of the exchange buffers the backward holds beside its
  // workspace (core/context_parallel.h; set_core_extras in tensor_parallel.cc says which).
  double cp_workspace = 0;
  double parameters = 0;  // per device
  double parameter_bytes = 0;
  // Of which expert weights (MoE blocks): their gradients reduce over the expert data-parallel group.
  double expert_parameters = 0, expert_parameter_bytes = 0;
  // MoE blocks: the experts' activations kept for the backward, bytes per sample at balanced load
  // (a device holds its load factor times this), beside stash_none / stash_selective.
  double expert_stash = 0, expert_stash_selective = 0;
  // Activation bytes per sample kept from F to B on one device, by recomputation mode
  // (Korthikanti et al., Table 2, at 2 bytes per element, scaled to the precision).
  double stash_none = 0, stash_selective = 0, stash_full = 0;
  // Of stash_none + expert_stash and stash_selective + expert_stash_selective: the bytes per sample
  // that activation_fp8_input_store saves (0 without it).
  double fp8_store_saved = 0, fp8_store_saved_selective = 0;
  // A tied layer's (Layer::tied_to) shared weight as this device would hold a copy of it, split as
  // `parameters` is.
  double tied_parameters = 0;
};

// Fails when the layer has no defined split for t > 1, or when t does not divide what Megatron
// splits (heads, KV heads, FFN width, vocabulary; the sequence with SP), or an MoE block's experts do
// not split over `e` (check_moe), or t > 1 without sequence parallelism on an MoE block (Megatron
// requires it), or cp does not split it as o.context's algorithm needs (check_context_parallel). The
// message names the layer. Under context parallelism (c.cp > 1) the layer runs on s / cp tokens and a
// block's attention core exchanges K/V over the context-parallel group (core/context_parallel.h):
//   p2p forward:  [.. QKV] ring step 0 (beside) [step 0] ring step 1 (beside) [step 1] ..
//                 [step cp - 2] | [step cp - 1, projection ..], each ring step after the previous;
//   p2p backward: [.. projection] K/V step (beside) [step 0] K/V + dK/dV steps (beside) ..
//                 [step cp - 2] | [step cp - 1] dK/dV to the owner [QKV ..];
//   all_gather:   [.. QKV] all-gather K, V [core, projection ..]; backward: all-gather K, V [core]
//                 reduce-scatter dK, dV [QKV ..];
//   a2a:          [.. QKV] all-to-all Q, K, V [core] all-to-all O [projection ..]; backward the mirror.
Result<TpLayer> tensor_parallel_layer(const Layer& l, int t, const TensorParallelOptions& o,
                                      Precision precision, const ExpertSizes& e = {},
                                      const ContextRank& c = {});

// The parameter tensors a layer keeps on a device of an expert-parallel group of `ep`, as a gradient
// hook or PyTorch's AccumulateGrad sees them (one kernel each: GradAccumulation, core/memory.h).
// Transformer and MoE blocks as Megatron builds them: QKV (MLA: its down projections, norms and up
// projections), the output projection, the MLP's first GEMM (gate and up in one tensor) and second,
// each with a bias where the block has biases, two norms (with a bias where the block has biases:
// LayerNorm, else RMSNorm); an MoE block's router and its E / ep local experts' two GEMMs (and the
// shared experts' two). Any other layer with parameters: one tensor (its weights and bias as one, a
// lower bound where it has several).
double parameter_tensors(const Layer& l, int ep = 1);

// The per-device kernels of a transformer layer for group size t without SP, all pieces together:
// what a builder uses for a decoder block (t = 1) so that one formula costs it everywhere. An MoE
// block's (TensorSplitKind::MoeBlock) on one device holding every expert, balanced, with the MoE
// options' kernels (router and permutation fusion, Transformer Engine's op fuser: MoeOptions; by
// default Megatron-Bridge's recipes').
std::vector<Kernel> transformer_kernels(const TensorSplit& s, Precision precision, bool router_fusion = true,
                                        bool permute_fusion = true, bool fused_grouped_mlp = false);
// The parameters of a Transformer or MoE block on one device of a group of 1 (all of them), and the
// parameters one token uses (MoE: top_k routed experts, the shared experts, the router).
double block_parameters(const TensorSplit& s);
double block_active_parameters(const TensorSplit& s);

// The per-device kernels of a vocabulary-parallel language-model head (TensorSplitKind::VocabHead)
// for group size t: the logits' GEMM over V/t columns, then the cross-entropy's three fp32 passes
// over those logits (read, exponentiate, normalise; two launches each way). A builder uses t = 1, so
// the head costs the same at every t.
std::vector<Kernel> vocab_head_kernels(const TensorSplit& s, int t, double weight_bytes, Precision precision);

// Megatron-LM's padded vocabulary under tensor parallelism t > 1: the smallest multiple of 128 t at
// least `vocabulary` (`--make-vocab-size-divisible-by`, default 128, times t: Megatron's
// _vocab_size_with_padding), so that every rank holds whole rows; GPT-2's 50,257 becomes 50,432 at
// t = 2 and 51,200 at t = 8. At t = 1 pipegrid keeps the model's own vocabulary (Megatron would pad
// 50,257 to 50,304: 0.09% more head, not modelled).
double megatron_padded_vocabulary(double vocabulary, int t);

}  // namespace pipegrid
