// What each stage costs on each of its devices for one micro-batch slice: pass times (as programs of
// compute pieces and collectives under tensor parallelism), activation memory under each
// recomputation mode, parameters. The lowering (core/lower.h) turns these into tasks; the planners
// and the 3D search's estimate read them too.
#pragma once

#include <vector>

#include "core/cluster.h"
#include "core/collectives.h"
#include "core/device.h"
#include "core/memory.h"
#include "core/partition.h"
#include "core/result.h"
#include "core/tensor_parallel.h"
#include "core/workload.h"

namespace pipegrid {

// A pass of a tensor-parallel stage on one device: compute pieces separated by the group's
// collectives (core/tensor_parallel.h), merged across the stage's layers.
struct TpProgram {
  std::vector<double> compute;            // seconds; kinds.size() + 1 pieces
  std::vector<CollectiveKind> kinds;      // the collectives between them
  std::vector<double> bytes;              // each collective's whole tensor, for the replica's slice (an
                                          // all-to-all: what this device sends in all)
  std::vector<CommGroup> groups;          // the group each runs over (core/moe.h)
  std::vector<char> combines;             // all-to-alls: 1 for a combine (TpPiece::combine)
  std::vector<RoutingDraw> deduplicates;  // all-to-alls: TpPiece::deduplicates
  std::vector<unsigned char> flags;       // TpPiece::flags (kBesideNext, kAfterPrevious, kNoFlows)
  size_t collectives() const { return kinds.size(); }
};

// Per stage and replica: what one micro-batch slice costs, under a recomputation mode.
//  - stash: what a forward keeps until its backward (W when split): all layers' stash bytes
//    (none), the stage's input only (full), or the selective stash bytes (selective);
//  - recompute: what the backward re-materialises first (full: every layer's stash; selective:
//    the part not stashed) and the forward time it re-runs; held until the stash is freed;
//  - workspace: the backward's own transient, the activation gradient of the stage's largest
//    layer output, from the start to the end of each B.
struct StageCost {
  PassTimes times;               // for the replica's slice of the micro-batch
  double stash_bytes = 0;        // activations kept from F to B (or W), for the slice
  double recompute_bytes = 0;    // re-materialised at the start of B
  double recompute_s = 0;        // extra forward time paid by B
  double workspace_bytes = 0;    // held during each B
  double parameters = 0;         // count, with the copies of tied weights the device keeps (TiedCopy)
  double parameter_tensors = 0;  // their tensors (core/tensor_parallel.h: parameter_tensors)
  double parameter_bytes = 0;
  // Of which expert weights (MoE blocks), reduced over the expert data-parallel group.
  double expert_parameters = 0, expert_parameter_bytes = 0;
  // Of which copies of tied weights (partition.h TiedCopy), all-reduced with their source's devices.
  double tied_parameters = 0;
  double expert_load = 1;  // MoE: this device's load factor (ep x its expert-parallel rank's load)
  // Tensor parallelism (the stage's tensor_parallel > 1): F, B and B's input-gradient part (split
  // backward) as programs; B's include the forward (with its collectives) under full recomputation
  // and the attention core's forward under selective recomputation. Empty otherwise.
  TpProgram tp_forward, tp_backward, tp_backward_input;
};

// cost[s][j] for device j of stage s (replica j without tensor parallelism). Under tensor
// parallelism, memory follows Korthikanti et al. (arXiv 2205.05198, Table 2): per transformer layer
// and sample, s h (10 + 24/t + 5 a s / (h t)) x 2-byte units without recomputation, s h (34 + 5 a s /
// h) / t with sequence parallelism, the attention core's 5 a s^2 dropped under selective
// recomputation, and 2 s h (the layer's input) under full recomputation, which re-materialises one
// layer at a time (recompute_bytes: the largest layer's activations).
Result<std::vector<std::vector<StageCost>>> stage_costs(const Workload& w, const Cluster& c,
                                                        const Partition& p, double micro_batch_size,
                                                        Recompute recompute = Recompute::None,
                                                        const TensorParallelOptions& tp = {});

// The parameters a device keeping a copy of tied layer `index` of stage `st` holds (partition.h
// TiedCopy): the shared weight split as under the stage's tensor parallelism.
Result<double> tied_copy_parameters(const Workload& w, const Stage& st, int index,
                                    const TensorParallelOptions& tp);

}  // namespace pipegrid
