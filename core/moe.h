// Mixture-of-experts training with expert parallelism, as Megatron-Core runs it (megatron/core/
// transformer/moe/README.md; "MoE Parallel Folding", Liu et al., arXiv 2504.14960):
//  - the attention part of a stage keeps its t x d devices in tensor-parallel groups of t (rank order
//    tp-cp-dp within the stage); the MoE part regroups the same devices as etp x ep x edp, expert
//    tensor parallelism fastest, then expert parallelism, then expert data parallelism (Megatron's
//    expert RankGenerator with the same order string), so an expert-parallel group may span
//    data-parallel replicas;
//  - each device holds E / ep routed experts, each split etp ways; shared experts and the router are
//    the dense part (shared experts split over the tensor-parallel group like a dense MLP);
//  - tokens: a device routes its b s / t tokens (sequence parallelism: Megatron requires it for MoE
//    under t > 1); each token goes to top_k experts. The all-to-all dispatcher sends each copy to
//    the expert's device (all-to-all over the expert-parallel group), all-gathers them over the
//    expert tensor-parallel group when etp > 1, runs the experts, reduce-scatters (etp > 1) and
//    sends the results back (the combine all-to-all). The all-gather dispatcher all-gathers every
//    token of the expert and expert-tensor group instead, and reduce-scatters the outputs.
//  - gradients of expert weights reduce over the expert data-parallel group (devices with the same
//    etp and ep rank), the others over the data-parallel group as before.
// Routing imbalance is data: the share of token copies each expert receives (balanced, a Zipf law, or
// a measured histogram) gives each expert-parallel rank's load, which scales both its expert compute
// and the all-to-all bytes sent to it (expert_loads); a capacity factor drops what exceeds capacity.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "core/workload.h"

namespace pipegrid {

// How tokens reach the experts (Megatron-Core's --moe-token-dispatcher-type: alltoall, allgather, and
// flex, whose DeepEP backend de-duplicates tokens (DeepEP): core/collectives.h
// deduplicated_dispatch_bytes and docs/moe.md, "DeepEP").
enum class MoeDispatcher : unsigned char { AllToAll, AllGather, DeepEP };
std::string_view to_string(MoeDispatcher d);  // "alltoall", "allgather", "deepep"
inline constexpr std::string_view kMoeDispatcherNames[] = {"alltoall", "allgather", "deepep"};
std::optional<MoeDispatcher> parse_dispatcher(std::string_view name);  // one of kMoeDispatcherNames

// How balanced routing draws a token's experts (as Megatron's --moe-router-force-load-balancing does):
// top_k of `experts` uniformly without replacement; with group-limited routing (DeepSeek-V2/V3's
// n_group / topk_group, Megatron's --moe-router-num-groups / --moe-router-group-topk), first
// `top_groups` of `groups` equal groups of consecutive experts, then top_k among their experts.
struct RoutingDraw {
  int experts = 0, top_k = 0;
  int groups = 1, top_groups = 1;  // 1, 1: no group limit
  bool limited() const { return groups > 1 && top_groups < groups; }
};
RoutingDraw routing_draw(const MoeShape& m);  // a block's draw (groups 0: no limit)
// Whether `held` consecutive experts starting at a multiple of `held` sit inside one group or cover
// whole groups (what routed_hit_probability takes under a group limit).
bool aligned_with_groups(const RoutingDraw& r, int held);
// The probability that a token's experts include at least one of `held` consecutive experts (those
// of one device or one node): 1 - C(E - g, k) / C(E, k) without a group limit; with one, over the
// number j of the c groups the experts span that the token picks (hypergeometric, C(c, j) C(G - c,
// M - j) / C(G, M)), the chance that none of its k experts among the M E / G is one of the j x held
// by c held (x: the held experts per group spanned).
double routed_hit_probability(const RoutingDraw& r, int held);

struct MoeOptions {
  MoeDispatcher dispatcher = MoeDispatcher::AllToAll;
  // Megatron's --moe-expert-capacity-factor: an expert takes at most cf x (its balanced share) of the
  // token copies, the rest are dropped (before the dispatch); 0: dropless (Megatron's default).
  double capacity_factor = 0;
  // The share of token copies each routed expert receives (sums to 1); empty: balanced (1 / E each,
  // what the published benchmarks force with --moe-router-force-load-balancing).
  std::vector<double> expert_shares;
  // How the lowering writes an expert-parallel all-to-all whose pairs all exchange alike (balanced
  // routing): one flow per pair, or node-aggregated, two flows per device instead of ep - 1
  // (core/collectives.h append_node_aggregated_all_to_all: equal on its own, up to 0.3% slower measured
  // where other traffic shares its links; docs/moe.md). Auto: pairwise up to
  // kAutoAggregateAllToAllFlows flows of all-to-all in the iteration, node-aggregated above.
  enum class AllToAllFlows : unsigned char { Auto, Pairwise, ByNode };
  AllToAllFlows all_to_all = AllToAllFlows::Auto;
  // Megatron-Core's --moe-router-fusion (the score function, top-k and routing map as one kernel) and
  // --moe-permute-fusion (Transformer Engine's fused permutation, chunk sort and un-permutation): the
  // all-to-all dispatcher's kernel launches per MoE layer (core/block_kernels.h, MoeLaunches). On by
  // default, as Megatron-Bridge's performance recipes set them.
  bool router_fusion = true, permute_fusion = true;
  // Transformer Engine's op fuser runs the experts' MLP (Megatron-Core's
  // --use-transformer-engine-op-fuser, core_v0.18 and later with Transformer Engine 2.14 or later):
  // fc2's bias scaled by the routing probabilities and GPT-OSS's clamped GLU inside its fused kernels,
  // so neither has eager PyTorch kernels, and in mxfp8 each grouped GEMM's input quantized by one
  // grouped kernel, not per expert (core/block_kernels.h, MoeLaunches). Off by default.
  bool fused_grouped_mlp = false;
};
inline constexpr size_t kAutoAggregateAllToAllFlows = size_t{1} << 22;

// The parallel sizes of a stage's MoE part: ep and etp (the expert data-parallel size follows from
// the stage's devices).
struct ExpertSizes {
  int ep = 1, etp = 1;
};

// Zipf's law over `experts` experts (share of the k-th most popular proportional to 1 / k^exponent),
// the most popular first; exponent 0 is balanced.
std::vector<double> zipf_shares(int experts, double exponent);

// The fraction of all token copies each expert-parallel rank receives (size ep): rank x holds experts
// [x E/ep, (x+1) E/ep). With a capacity factor, each expert's share is capped at cf / E (the rest is
// dropped, so the fractions sum to less than 1). Balanced and dropless: exactly 1 / ep each.
std::vector<double> expert_loads(const MoeOptions& o, int experts, int ep);
// The share of all token copies kept (1: none dropped): expert_loads' sum.
double kept_copy_share(const MoeOptions& o, int experts);

// The routed experts of a workload's MoE blocks (0: none; the zoo's MoE models have one count).
double routed_experts(const Workload& w);
RoutingDraw moe_routing(const Workload& w);  // the first MoE block's routing draw (experts 0: none)
// Whether some MoE block's experts run eager PyTorch kernels outside their fused ones as Megatron-Core's
// TEGroupedMLP runs them: fc2's bias (biases) or GPT-OSS's clamped GLU (core/block_kernels.cc), which
// MoeOptions::fused_grouped_mlp takes away: "fc2's bias", "the GLU's clamp", both joined by "and", or
// "" for none.
std::string eager_expert_work(const Workload& w);
// Whether some MoE block's experts are gated, so that their weighted activation is torch.compile's
// kernel (KernelClass::Compiled; core/block_kernels.cc) unless MoeOptions::fused_grouped_mlp.
bool compiled_expert_activation(const Workload& w);

// The load imbalance the loads give: the busiest rank's load over the mean (1: balanced).
double load_imbalance(const std::vector<double>& loads);

// Checks a MoE block's shape against the sizes (E divisible by ep, the expert FFN by etp, top-k <= E)
// and the routing (as many shares as experts, none negative, summing to 1 within 1e-6); the DeepEP
// dispatcher takes balanced routing only, dropless or with a capacity factor >= 1 (its
// de-duplication follows from uniform draws). The message names the layer.
Status check_moe(const Layer& l, const ExpertSizes& e, const MoeOptions& o);

// Megatron-Core's conditions for its all-to-all overlap (--overlap-moe-expert-parallel-comm,
// TransformerConfig.__post_init__ in megatron/core/transformer/transformer_config.py): expert
// parallelism (ep > 1), the alltoall or flex (deepep) dispatcher, and with a pipeline (p > 1) a
// virtual pipeline (here: the interleaved schedule; 1F1B's adjacent forward and backward would hold
// each forward's output until the paired backward ends, a serialised pipeline). DualPipe and
// DualPipeV pair their chunks themselves. Where the pairing would find no pair (one micro-batch;
// zb-h1 and zb-h2 without a pipeline, whose order is F B W), the overlap would change nothing.
// micro_batches 0: not known yet. nullopt when they hold, else what fails.
std::optional<std::string> moe_overlap_refusal(int ep, MoeDispatcher dispatcher, int stages,
                                               std::string_view schedule, int micro_batches = 0);

// The groups of a stage's devices, as positions in the stage's device list (position r = j t + i for
// replica j, tensor-parallel rank i): the tensor-parallel group of t, and the MoE part's groups.
enum class CommGroup : unsigned char {
  Tensor,           // t consecutive positions
  Expert,           // the expert-parallel group: ep positions of stride etp
  ExpertTensor,     // the expert tensor-parallel group: etp consecutive positions
  ExpertAndTensor,  // both: etp x ep positions (the all-gather dispatcher's group)
  Context,          // the context-parallel group: cp positions of stride t within a replica
};
std::string_view to_string(CommGroup g);
// The members of position r's group, in rank order (ring order for the collectives); cp: the
// context-parallel size (positions (j cp + c) t + i, core/partition.h).
std::vector<int> group_members(CommGroup g, int r, int t, const ExpertSizes& e, int cp = 1);
// Position r's rank in the expert-parallel group.
inline int expert_rank(int r, const ExpertSizes& e) {
  return (r / e.etp) % e.ep;
}

}  // namespace pipegrid
