// The per-device kernels of a Transformer or MoE block's parts, per sample, under tensor parallelism
// t (and for MoE, expert parallelism), named by what they compute. One source for every builder (at
// t = 1) and for tensor_parallel_layer (core/tensor_parallel.h), so a block costs the same wherever
// it runs. Internal to core: the pieces and collectives are tensor_parallel.h's.
#pragma once

#include <vector>

#include "core/moe.h"
#include "core/workload.h"

namespace pipegrid::blocks {

Kernel kernel(KernelClass cls, double fwd, double bwd_in, double bwd_w, double fwd_bytes, double bwd_bytes,
              double weight_bytes = 0, double calls = 1);
Kernel scaled(Kernel k, double f);

// Activation bytes kept from the forward to the backward (Korthikanti et al., arXiv 2205.05198,
// section 4.1), in 2-byte units per sample: `unsplit` is divided by t under sequence parallelism only,
// `split` always, `replicated` never (tensors every device of the group computes whole, e.g. MLA's
// latents), `scores` (the attention core's 5 a s^2, none with FlashAttention) always.
//
// The `*_fp8` parts (included in the three above) are the inputs of GEMMs an fp8 training runs in fp8:
// Transformer Engine keeps only their column-wise quantized copy for the weight gradient (Linear,
// LayerNormLinear, GroupedLinear; v2.x), fp8_saved_bytes(precision) per element instead of two.
struct Stash {
  double unsplit = 0, split = 0, replicated = 0, scores = 0;
  double unsplit_fp8 = 0, split_fp8 = 0, replicated_fp8 = 0;
  Stash& operator+=(const Stash& o) {
    unsplit += o.unsplit, split += o.split, replicated += o.replicated, scores += o.scores;
    unsplit_fp8 += o.unsplit_fp8, split_fp8 += o.split_fp8, replicated_fp8 += o.replicated_fp8;
    return *this;
  }
};

// Self-attention: LN1, the projections to Q, K, V (grouped-query attention with TensorSplit::kv_heads
// and head_dim; multi-head latent attention with TensorSplit::mla), rotary embeddings, the core, the
// output projection, dropout and residual.
struct Attention {
  Kernel ln1;
  std::vector<Kernel> qkv;  // the projections before the core
  // Between the projections and the core: Qwen3's q/k norms (TensorSplit::qk_norm), then the rotary
  // embedding.
  std::vector<Kernel> rotary;
  Kernel core, softmax_dropout, proj, dropout_residual;
  double parameters = 0;
  Stash stash;
  // MLA: LN1 runs apart from the down projections (Megatron-Core's MLA layer spec; Transformer Engine
  // fuses a GQA block's LN1 into its QKV GEMM), and the up projections with the rotary embedding, and
  // the Q, K and V they write (`split` units, whole-group): what recompute_modules `layernorm` and
  // `mla_up_proj` re-run and discard.
  bool norm_apart = false;
  std::vector<Kernel> up_proj;
  double up_proj_stash = 0;
};
Attention attention(const TensorSplit& sp, int t, bool sequence_parallel, Precision precision);

// The dense MLP (up, activation, down; gated: gate and up) of width `ffn`, with LN2, dropout and
// residual.
struct Mlp {
  Kernel ln2, up, act, down, dropout_residual;
  double parameters = 0;
  Stash stash;
};
Mlp mlp(const TensorSplit& sp, double ffn, int t, bool sequence_parallel, Precision precision);

// The MoE MLP on one device: LN2, the router (a GEMM to E logits, then softmax or sigmoid and top-k,
// in fp32), the permutation of the device's b s / t tokens into top_k copies, the experts' grouped
// GEMMs on what the device receives (balanced: etp x top_k x s / t token copies, each expert's
// FFN split etp ways), the un-permutation (the weighted sum of the copies), shared experts (a dense
// MLP split t ways) and the dropout and residual. `expert` kernels and `expert_stash` are for
// balanced routing: a device with load factor lambda (ep x its rank's load) runs lambda x them.
// The compute streams Transformer Engine's grouped GEMM spreads its per-expert cuBLAS calls over
// (transformer_engine/common/util/multi_stream.cpp, v2.9: num_compute_streams = 4).
inline constexpr double kGroupedGemmStreams = 4;

// The all-to-all dispatcher's kernels around the experts as Megatron-Core launches them, counted from
// its source (core_v0.16.0, the same at v0.15.0; Transformer Engine v2.12's fused permutation): per
// MoE layer, besides the router's gating GEMM, the experts' GEMMs and the NCCL calls, forward
//   score, top-k, probabilities and routing map: 11 kernels (fp32 logits; router.py, moe_utils.py
//     topk_softmax_with_capacity), fused 1; backward 4 (gather, softmax, top-k's zeros and scatter),
//     fused 1;
//   the dispatcher's preprocessing: 6 kernels and 4 device-to-host copies of the token counts
//     (token_dispatcher.py preprocess, _maybe_dtoh_and_synchronize), forward only; the gating GEMM's
//     gradient cast back and forth (4) and the two branches' gradients added (1), backward only;
//   permutation: about 14 kernels (two masked_selects), fused 4; backward about 6, fused 1;
//   the received copies sorted by local expert and sorted back (more than one local expert):
//     3 kernels, fused 5; backward 3, fused 2, each moving every received copy through memory;
//   un-permutation: 2 kernels, fused 1; backward 1.
// The forward's extra launches beyond the stylised route / permute / unpermute kernels go to
// forward-only kernels, the backward's to backward-only ones (a pass with no work launches nothing).
struct MoeLaunches {
  bool router_fusion = true, permute_fusion = true;
  bool apply = false;  // the all-to-all dispatcher's counts; false: the stylised kernels alone
  // The experts' MLP fused by Transformer Engine's op fuser (MoeOptions::fused_grouped_mlp): no eager
  // kernels for GPT-OSS's clamp or fc2's bias.
  bool fused_grouped_mlp = false;
};

struct Moe {
  Kernel ln2, router, route, permute, unpermute, dropout_residual;
  // The dispatcher's launches beyond route, permute and unpermute (MoeLaunches): before the dispatch
  // (score, top-k, preprocessing, permutation), between the all-to-alls (sort and unsort, with their
  // memory traffic) and after the combine (un-permutation); each list holds forward-only and
  // backward-only kernels.
  std::vector<Kernel> before_dispatch, between, after_combine;
  // fc1, the activation, fc2 (grouped GEMMs over the device's experts), then fc2's bias where the
  // experts have biases (Megatron-Core's TEGroupedMLP._apply_bias).
  std::vector<Kernel> expert;
  std::vector<Kernel> activation;  // what moe_act recomputes: GPT-OSS's clamp, the fused activation
  bool shared = false;
  Mlp shared_mlp;
  double dense_parameters = 0;        // router and norm (replicated), shared experts (1/t)
  double expert_parameters = 0;       // E / ep experts, 1 / etp of each
  Stash stash;                        // the router's and permutation's, the shared experts'
  double expert_stash_bytes = 0;      // bytes per sample of the experts' activations (balanced)
  double expert_act_bytes = 0;        // of which the activation's output (the second GEMM's input)
  double expert_act_input_bytes = 0;  // and the activation's input (the first GEMM's output)
  double token_bytes = 0;             // bytes per sample of one device's tokens (b s / t x h): what the
                                      // dispatch sends per copy, x top_k
};
Moe moe(const TensorSplit& sp, int t, bool sequence_parallel, const ExpertSizes& e, Precision precision,
        const MoeLaunches& launches = {});

// Stash bytes per sample on one device of t, the fp8 parts at fp8_saved_bytes(precision) per element.
double stash_bytes(const Stash& s, int t, bool sequence_parallel, Precision precision);

}  // namespace pipegrid::blocks
