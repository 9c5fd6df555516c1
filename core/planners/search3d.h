// A search over 3D configurations (tensor x pipeline x data parallelism, micro-batch size, schedule
// and interleaving, recomputation, sequence parallelism, distributed optimizer) for a transformer
// model on a homogeneous cluster, ranked by the analytic evaluator (core/evaluate.h). Pure core: no
// SimGrid; the caller replays the best candidates (tools/cli/search.cc). docs/3d-search.md says what is
// enumerated and what is left out, and why.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/cluster.h"
#include "core/context_parallel.h"
#include "core/experiment.h"
#include "core/lower.h"
#include "core/memory.h"
#include "core/metrics.h"
#include "core/moe.h"
#include "core/result.h"

namespace pipegrid {

struct Search3dOptions {
  int global_batch = 0;  // samples per iteration (Megatron's --global-batch-size); required
  // The axes; an empty list means every value the rules allow.
  std::vector<int> tensor_parallel;    // t
  std::vector<int> pipeline;           // p
  std::vector<int> micro_batch_sizes;  // b, per replica (Megatron's --micro-batch-size)
  std::vector<std::string> schedules = {"1f1b", "interleaved-1f1b", "zb-h1", "zb-h2"};
  std::vector<int> chunks = {2, 3, 4};  // v for interleaved-1f1b
  std::vector<Recompute> recompute = {Recompute::None, Recompute::Selective, Recompute::Full};
  std::vector<bool> sequence_parallel = {false, true};
  std::vector<bool> distributed_optimizer = {false, true};
  // Mixture-of-experts workloads only (docs/3d-search.md, "Expert parallelism"): the expert-parallel
  // sizes ep (dividing the routed experts and t x d), the expert tensor-parallel sizes etp (dividing
  // the expert FFN width and t x d / ep, at most a node), and the token dispatchers; empty: every value
  // the rules allow. Ignored (and left out of the labels) for dense workloads.
  std::vector<int> expert_parallel;
  std::vector<int> expert_tensor_parallel;
  std::vector<MoeDispatcher> dispatchers = {MoeDispatcher::AllToAll, MoeDispatcher::AllGather};
  // Megatron-Core's all-to-all overlap (moe.overlap, --overlap-moe-expert-parallel-comm) off and/or on;
  // empty: the base experiment's setting alone, not an axis.
  std::vector<bool> moe_overlap;
  // Context parallelism (docs/3d-search.md, "Context parallelism"): the sizes cp and the attention's
  // exchange algorithms. Empty sizes: 1, and every cp > 1 that leaves each rank at least
  // kSearch3dCpMinTokens tokens of the sequence; an axis only for cp > 1.
  std::vector<int> context_parallel;
  std::vector<CpAlgorithm> cp_algorithms = {CpAlgorithm::P2P, CpAlgorithm::AllGather, CpAlgorithm::AllToAll};
  // Rank every candidate by lowering its whole task graph (every replica, every TP rank, every
  // micro-batch) for the analytic evaluator, instead of the one-replica estimate (Search3dEstimator):
  // the reference the estimate is tested against, slow at scale (GPT-3 175B on 1,024 GPUs: hours).
  bool exact = false;
  // Candidates estimated at once (threads), from kSearch3dThreadedFrom candidates on (below, one:
  // a thread costs more than it saves). Results do not depend on it.
  int threads = 2;
  // Called after each candidate (done, total) from the calling thread.
  std::function<void(size_t, size_t)> progress;
};

inline constexpr size_t kSearch3dThreadedFrom = 256;
// The fewest tokens per context-parallel rank the default cp axis tries: published long-context
// configurations keep 8k-32k per rank (docs/3d-search.md); half the smallest.
inline constexpr double kSearch3dCpMinTokens = 4096;

struct Search3dCandidate {
  int t = 1, p = 1, d = 1;
  int b = 1;              // micro-batch size per replica
  int micro_batches = 1;  // global / (b d)
  std::string schedule;
  int v = 1;  // chunks per rank (interleaved-1f1b), else 1
  Recompute recompute = Recompute::None;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  // Mixture-of-experts workloads (moe): expert parallelism of the MoE blocks (core/moe.h).
  bool moe = false;
  int ep = 1, etp = 1;
  MoeDispatcher dispatcher = MoeDispatcher::AllToAll;
  bool moe_overlap = false;  // the all-to-alls overlapped with another micro-batch's compute (moe.overlap)
  // Context parallelism: each replica's sequence over cp groups of t devices (core/context_parallel.h);
  // t cp p d devices in all.
  int cp = 1;
  CpAlgorithm cp_algorithm = CpAlgorithm::P2P;
  // Megatron-Core's uneven split (--account-for-embedding-in-pipeline-split and -loss-): the embedding
  // and the loss counted as one block each, so the first and last model chunks hold one block fewer;
  // tried where p x v does not divide the blocks and does divide the blocks + 2.
  bool uneven = false;
  // Where p x v divides neither the blocks nor the blocks + 2: Megatron-Core's explicit layout
  // (search3d_layout); empty: none.
  std::string layout;
  // Analytic evaluation.
  double iteration_time_s = 0;
  double throughput_samples_per_s = 0;
  double mfu = 0;  // 6 x parameters (MoE: active) x tokens per iteration / (time x devices x peak)
  double peak_memory_bytes = 0;  // the largest device's peak
  TimeBreakdown breakdown;       // the mean over the used devices
  // "t2 p2 d4 b1 1f1b none" etc. (MoE: "... d4 ep8 etp1 b1 ... alltoall", with moe_overlap "... alltoall
  // a2a-overlap"; uneven: "... 1f1b uneven none";
  // a layout: "... 1f1b layout none")
  std::string label() const;
};

struct Search3dResult {
  std::vector<Search3dCandidate> ranked;  // the feasible candidates, fastest first
  // Combinations of the axes not ranked, by reason ("does not fit device memory", ...): never silent.
  std::map<std::string, size_t> left_out;
  size_t combinations = 0;  // every combination of the axes considered (ranked + left out)
  size_t evaluated = 0;     // lowered and evaluated
  double parameters = 0;    // the model's (MoE: the active parameters, core/model_flops.h)
  double tokens_per_iteration = 0;
  double peak_flops = 0;  // per device, at the workload's math precision
};

// The experiment of one candidate: `base` (workload, cluster, optimizer) with the candidate's strategy
// and memory options (megatron partitioner, micro_batch_size b x d, micro_batches global / (b d)).
Experiment search3d_experiment(const Experiment& base, const Search3dCandidate& c);
// The megatron partitioner's split of a candidate: even, (uneven) the embedding and the loss counted
// as one block each, or its layout.
MegatronSplit search3d_split(const Search3dCandidate& c);
// A layout of `blocks` transformer blocks and `mtp` multi-token-prediction modules over `stages` stages
// where no even or accounted split fits (a faithful-in-spirit generalisation of Megatron-Core's
// accounting, docs/3d-search.md): the embedding, the loss and each module one slot each, every stage
// the same number of slots, the remainder one more on the middle stages (then the first); the modules
// with the loss on the last stage. Megatron-Core's notation ("Et*3|t*4|t*2mL"); empty where a stage
// would hold nothing or the last stage's slots could not hold the modules.
std::string search3d_layout(int blocks, int mtp, int stages);

// One folded pass of a grouped stage in the 3D search's estimate: its compute alone and its
// collectives' exposed time by group (tensor, context, expert), which the other pass of an overlapped
// pair (DualPipe) can hide.
struct Search3dPassParts {
  double compute = 0, tp = 0, cp = 0, ep = 0;
  double collectives() const { return tp + cp + ep; }
};

// The one-replica estimate of a candidate (docs/3d-search.md, "How a candidate is costed"). The d
// replicas of a stage and the t ranks of a group run alike, so one pipeline is lowered: one device
// per pipeline rank (rank 0 of replica 0, Megatron's placement), its micro-batch b, each tensor-parallel
// pass one task whose time is the pass's chain of compute pieces and ring flows on the group's routes
// (exactly as the lowering chains them when the ranks are alike), the pipeline transfers 1/t of an
// activation between representatives. The analytic evaluator runs it; then each stage's data-parallel
// all-reduce starts when its last backward ends, in closed form (concurrent_ring_time over the t rings
// of d devices, or with multi-ring their multi_ring_orders of 1/m of the bytes each, a device's stages one
// after another), and the optimizer step (on 1/d of the state with the distributed optimizer) follows.
// Memory: the representatives' peaks. Exact against the whole graph where replicas and ranks do not contend
// for links (tests/tools/search3d_test.cc measures the difference on small cases).
struct Search3dEstimate {
  double iteration_time_s = 0;
  double peak_memory_bytes = 0;  // the largest device's peak
  bool fits = true;
  // False when a lower bound on memory (static memory + one micro-batch's stash, re-materialised
  // activations and workspace) is already above a device's capacity: not lowered, no times.
  bool lowered = true;
  TimeBreakdown breakdown;  // the mean over the representatives (every device is like one)
};
class Search3dEstimator {
 public:
  explicit Search3dEstimator(const Experiment& base);
  Result<Search3dEstimate> estimate(const Search3dCandidate& c);
  // The candidate's TP-folded replay (docs/3d-search.md, "TP-folded replays"): every replica and
  // pipeline rank, but each tensor-parallel group as its rank 0 alone, whose passes carry the group's
  // collectives as the estimate folds them (tp_pass_time); pipeline transfers carry 1/t of an
  // activation and each data-parallel ring 1/t of a stage's gradients between the groups' ranks 0,
  // on the real routes. t times fewer devices busy and no TP flows: for SimGrid when the whole graph
  // is too large to replay in time. Equal to the whole graph where the other ranks' flows use links
  // of their own (a TP group filling a node on a rail-optimised fabric).
  Result<PreparedRun> tp_folded(const Search3dCandidate& c);

 private:
  // One plan of the candidate on the groups' ranks 0 (the estimate's with replicas = 1, tp_folded's
  // with replicas = d): stages, schedule, per-stage costs with the TP collectives folded in, each
  // stage's pipeline rank and the TP time folded into one F and one B.
  struct FoldedPlan {
    Partition part;
    Schedule sched;
    std::vector<std::vector<StageCost>> costs;
    std::vector<int> rank_of;
    // Per stage, in one F and one B of the representative: TP, CP and expert groups' exposed time.
    std::vector<double> tp_exposed, cp_exposed, ep_exposed;
    // Per stage and pass (0: F, 1: B, the input gradient when split), of grouped stages only.
    std::vector<std::array<Search3dPassParts, 2>> passes;
    // Per overlapped pair of the schedule (the forward's stage, the backward's), of grouped stages: the
    // two passes' time with their pieces interleaved (each one's collectives beside the other's compute).
    std::map<std::pair<int, int>, double> pair_times;
    MemoryOptions memory;
  };
  Result<FoldedPlan> folded_plan(const Search3dCandidate& c, int replicas);
  // The overlapped pairs of fp's schedule in its lowered graph g, shortened to their interleaved time
  // (FoldedPlan::pair_times); what they hide per pipeline rank, by group.
  static std::map<int, Search3dPassParts> overlap_pairs(const Search3dCandidate& c, const FoldedPlan& fp,
                                                        TaskGraph& g);
  // folded_plan's steps: the per-stage costs with the TP collectives folded in (cached), and the plan
  // with every replica.
  Status fold_costs(const Search3dCandidate& c, FoldedPlan& fp);
  Status replicate(const Search3dCandidate& c, int replicas, const PartitionStrategy& partitioner,
                   const ScheduleStrategy& scheduler, FoldedPlan& fp);
  // The data-parallel all-reduce of each stage of the plan (DualPipe: a stage with its mirror,
  // `mirror_of`, counted on the first of the two), and of `bytes` over pipeline rank `rank`'s replicas, with
  // those of rank `mirror` after them where it is not -1 (cached).
  Result<std::pair<std::vector<double>, std::vector<double>>> dp_allreduces(
      const Search3dCandidate& c, const FoldedPlan& fp, const std::vector<int>& mirror_of);
  Result<double> dp_allreduce(const Search3dCandidate& c, int rank, int mirror, double bytes,
                              CollectiveKind kind);
  // MoE: the expert gradients' reduction over the expert data-parallel groups of pipeline rank `rank`
  // (the ep x etp rings of t d / (ep etp) devices at once, with rank `mirror`'s where it is not -1; cached).
  Result<double> expert_allreduce(const Search3dCandidate& c, int rank, int mirror, double bytes,
                                  CollectiveKind kind);
  // The rings' time at once, each carrying `bytes` (with multi-ring: each group's rings over its node's
  // NICs, 1/m of the bytes each).
  Result<double> rings_time(const std::vector<std::vector<int>>& groups, double bytes, CollectiveKind kind);

 public:
  // A tied weight's gradient all-reduce (partition.h TiedCopy) between two pipeline ranks' devices,
  // every replica's and tensor-parallel rank's pair at once: its time.
  struct TiedReduce {
    int copy_rank = 0, source_rank = 0;
    double time = 0;
  };

 private:
  Result<std::vector<TiedReduce>> tied_reduces(const Search3dCandidate& c, const FoldedPlan& fp);

  Experiment base_;
  Router router_;  // base_.cluster's, its route cache kept across candidates
  // Stage costs by (t, p, v, b, recompute, sequence parallelism, and for MoE d, ep, etp, dispatcher): the
  // same for every d (dense), schedule and optimizer sharding on a homogeneous cluster. Data-parallel
  // all-reduce times by (t, d, pipeline rank, bytes, kind, and for expert gradients ep x etp).
  std::map<std::tuple<int, int, int, int, int, bool, int, int, int, int, int, int>,
           std::vector<std::vector<StageCost>>>
      costs_;
  std::map<std::tuple<int, int, int, int, double, CollectiveKind, int>, double> allreduce_;
};

// Errors: no transformer blocks, a heterogeneous cluster, a global batch < 1, an unknown schedule, a
// hierarchical all-reduce without `exact` (the estimate times ring and multi-ring only).
Result<Search3dResult> search3d(const Experiment& base, const Search3dOptions& o);

// Spearman's rank correlation of two equally long samples (ties get their average rank).
double spearman(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace pipegrid
