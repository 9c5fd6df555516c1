// A partition: a DAG of stages (Boost.Graph). Each stage holds a convex set of layers and runs on
// one or more devices; several devices are data-parallel replicas that split every micro-batch
// between them and all-reduce their gradients at the end of the iteration. A chain of stages is
// the special case.
#pragma once

#include <boost/graph/adjacency_list.hpp>
#include <vector>

#include "core/result.h"
#include "core/workload.h"

namespace pipegrid {

struct Stage {
  std::vector<int> layers;  // in topological order
  // Cluster device indices: replicas x context_parallel x tensor_parallel of them, in Megatron-Core's
  // rank order tp-cp-dp: position (j cp + c) t + i is tensor-parallel rank i of context-parallel rank c
  // of replica j. Without context parallelism replica j is the tensor-parallel group devices[j t ..
  // j t + t); without either, one device per replica.
  std::vector<int> devices;
  int tensor_parallel = 1;
  // Context parallelism (core/context_parallel.h): each replica's sequence split over cp groups of t.
  int context_parallel = 1;
  // The MoE blocks' expert parallelism over the same devices (core/moe.h): expert-parallel and expert
  // tensor-parallel sizes; ep x etp divides devices.size(). 1 and 1 without MoE.
  int expert_parallel = 1, expert_tensor_parallel = 1;
  // The micro-batches the stage runs: 0 every one; 1 the first half (0 .. m/2 - 1); 2 the second half
  // (DualPipe's two pipelines, core/schedules/dualpipe.cc).
  int route = 0;
  // A stage holding a copy of another stage's layers (DualPipe's second pipeline): the index of that
  // stage; their gradients are reduced together. -1: none.
  int mirror = -1;
  bool runs(int micro_batch, int micro_batches) const {
    return route == 0 || (route == 1) == (micro_batch < micro_batches / 2);
  }
  // Replicas take whole micro-batches in turn (PipeDream's round-robin: micro-batch k on replica
  // k mod replicas) instead of splitting each; only for stages without tensor, context or expert
  // parallelism. A replica then runs every pass of its micro-batches at the full micro-batch size.
  bool round_robin = false;
  // Whether replica j runs micro-batch k (of m).
  bool runs_on(int replica, int micro_batch, int micro_batches) const {
    return runs(micro_batch, micro_batches) && (!round_robin || micro_batch % replicas() == replica);
  }
  // Data-parallel replicas: groups of t x cp devices that share no samples.
  int replicas() const { return static_cast<int>(devices.size()) / (tensor_parallel * context_parallel); }
  // The devices each tensor-parallel rank reduces its gradients with: data x context parallel (Megatron
  // reduces over the dp x cp group).
  int gradient_replicas() const { return static_cast<int>(devices.size()) / tensor_parallel; }
  // A pass of the stage runs as compute pieces separated by group collectives (stage_costs' programs).
  bool grouped() const {
    return tensor_parallel > 1 || context_parallel > 1 || expert_parallel > 1 || expert_tensor_parallel > 1;
  }
};

struct StageEdge {
  double bytes_per_sample = 0;  // activations forward; gradients of the same size backward
};

using StageGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, Stage, StageEdge>;

// What a planner says about the partition it returns (empty for the simple partitioners).
struct PlanNotes {
  double predicted_time_per_stage_s = 0;       // the planner's predicted bottleneck (its own objective)
  std::vector<double> predicted_stage_time_s;  // per stage, same units
  double search_seconds = 0;                   // time spent planning
  int added_dependencies = 0;                  // graphpipe: edges added to make the graph series-parallel
  std::string summary;                         // what it explored, in a line or two
};

struct Partition {
  StageGraph graph;  // stage indices are a topological order: every edge goes from a lower to a higher index
  PlanNotes plan;

  size_t stage_count() const { return boost::num_vertices(graph); }
  const Stage& stage(size_t s) const { return graph[s]; }
  std::vector<int> predecessors(int s) const;
  std::vector<int> successors(int s) const;
  // True when stage i feeds exactly stage i + 1 and nothing else.
  bool is_chain() const;
  // Longest path in stages (number of stages on it).
  int depth() const;
};

// The plan's degrees of parallelism as Megatron-LM names them: t (the largest group), p (pipeline
// ranks: the distinct device sets of the stages), chunks (stages per rank), d (the most replicas).
struct Parallelism {
  int tensor = 1, pipeline = 1, chunks = 1, data = 1;
  int expert = 1, expert_tensor = 1;  // the MoE stages' (1: none)
  int context = 1;                    // context parallelism (1: none)
};
Parallelism parallelism(const Partition& p);

// Builds the stage graph from a layer -> stage map (stages numbered 0 .. S-1) and the devices of
// each stage. Edge bytes = sum of the output bytes of every layer of s that feeds a layer of t.
// Fails on an empty stage, a stage without a device, a device index out of range, or stages that
// are not numbered in a topological order of the stage graph (which also rejects cycles).
Result<Partition> make_partition(const Workload& w, const std::vector<int>& stage_of_layer,
                                 const std::vector<std::vector<int>>& devices_of_stage, size_t device_count);

// Fraction of a micro-batch that replica i of n and replica j of m both hold: replicas split every
// micro-batch into equal contiguous slices, and the lowering sends each pair of replicas of
// consecutive stages the samples they share.
double replica_overlap(int i, int n, int j, int m);

// A layer computing with another layer's weight (Layer::tied_to) on devices that hold no stage with
// that layer: they keep a copy of the weight, with its gradient, optimizer state and step, and
// all-reduce the copy's gradient with the source's devices (Megatron-Core's output-layer copy on the
// last pipeline stage, all-reduced with the first stage's embedding gradient in finalize_model_grads;
// at p = 1 the head and the embedding share one weight). One entry per tied layer that some device
// keeps a copy for.
struct TiedCopy {
  int stage = 0;             // the stage holding the tied layer
  int index = 0;             // its position in that stage's layers
  int source_stage = 0;      // the first stage holding Layer::tied_to
  std::vector<bool> copies;  // per position of `stage`: its device keeps a copy
};
std::vector<TiedCopy> tied_copies(const Workload& w, const Partition& p);
// The bytes of a tied copy's gradient of `parameters` as it is all-reduced: `reduce_bytes` per
// parameter where the strategy sets the reduce's precision (StrategySpec::gradient_reduce_bytes > 0),
// else at the source weight's bytes per parameter (tied_bytes). The lowering and the 3D search's
// estimate both cost it so.
double tied_gradient_bytes(const Workload& w, const Layer& tied, double parameters, double reduce_bytes);

// Makes a sequential pipeline of a partition: adds a zero-byte dependency s -> s + 1 wherever
// consecutive stages have no data edge (a linearised multi-branch model), so the stages run as
// the chain that sequential pipeline parallelism (PipeDream, GPipe, Megatron) executes.
void add_sequence_edges(Partition& p);

// DualPipe's two pipelines from a chain of N stages on N ranks: stages 0 .. N - 1 the chain running
// the first half of the micro-batches, stages N .. 2N - 1 a copy of it running the second half in the
// other direction (stage N + j holds stage j's layers on the devices of stage N - 1 - j, its mirror).
Partition dualpipe_pipelines(const Partition& chain);

}  // namespace pipegrid
