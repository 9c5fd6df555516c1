// piper: a Piper-style planner (Tarnawski, Narayanan, Phanishayee, "Piper: Multidimensional Planner
// for DNN Parallelization", NeurIPS 2021), our interpretation (docs/piper.md says what is from the
// paper, what is assumed and what is left out):
//
// - Stages are contiguous ranges of the workload's topological order (coarsened to at most kPiperBlocks
//   blocks of about equal compute when the model has more layers). Each stage chooses its own
//   tensor-parallel degree t and data-parallel degree d: d replicas, each a group of t devices, t d
//   consecutive devices of the cluster. t > 1 only where every layer of the stage has a tensor-parallel
//   split (core/tensor_parallel.h decides, Megatron's divisibility rules included), at least one of them
//   a split layer (a transformer block, the embedding or the head), and where each group of t devices
//   lies in one machine (Cluster::machine_of). d divides the micro-batch (replicas take whole samples).
// - A dynamic programme over (first layer of the rest of the pipeline, devices the rest uses, stages
//   after, capped at m - 1) minimises the pipeline's bottleneck: the largest stage time per micro-batch
//   (Piper's time-per-sample at a fixed micro-batch size), ties by the sum over stages, then by fewer
//   devices. The pipeline is packed at the end of the device list: the last stage on the last devices.
//   A stage's time per micro-batch of b samples:
//     compute   forward + backward (+ recomputation) of one device of a group at b / d samples
//               (stage_costs of core/lower.h, the lowering's own per-device costs);
//     TP        each of the group's collectives: latency + ring_flow_bytes / bandwidth of the group's
//               slowest ring hop (latency: the slowest hop's);
//     transfer  to a next stage: the activation forward and its gradient back, b / (t d) samples' worth
//               of the boundary's bytes per device, over the route from the stage's last device to the
//               next stage's first;
//     DP        (ring all-reduce of each device's parameter bytes over the d replicas, 2 (d - 1) / d x
//               bytes / slowest hop + 2 (d - 1) latencies, + the optimizer step) / m.
//   Memory per device: static memory (ZeRO-1 shards the optimizer state over d) + in-flight
//   micro-batches x stash + recomputed + workspace (stage_costs' quantities), in flight min(m, stages
//   after + 1) for 1F1B (m for GPipe), within the smallest capacity of the stage's devices.
// - Every micro-batching of the request is planned; each plan is lowered with 1F1B (or the strategy's
//   schedule), timed by the analytic evaluator, the best kPiperJudged judged (SimGrid from the CLI), and
//   the fastest that fits memory wins.
#pragma once

#include <vector>

#include "core/planner.h"

namespace pipegrid {

inline constexpr int kPiperBlocks = 48;  // layer blocks stage boundaries choose from

struct PiperStage {
  int first = 0, last = 0;  // [first, last): positions in the workload's topological order
  int t = 1, d = 1;         // tensor-parallel degree, data-parallel replicas
  int first_device = 0;     // devices first_device .. first_device + t d - 1; replica j is t of them
  double time_s = 0;        // per micro-batch, as above
};

struct PiperSolution {
  std::vector<PiperStage> stages;
  double bottleneck_s = 0;  // the largest stage time per micro-batch: the DP's objective
  double sum_s = 0;         // the sum over stages
  int devices = 0;          // devices used
  int blocks = 0;           // layer blocks the boundaries chose from
  long long explored = 0;   // stage options evaluated
};

// The DP for one micro-batching. Fails when no stage assignment fits memory (the message says why) or
// when the cost model fails on a layer.
Result<PiperSolution> piper_partition(const PlanRequest& r, MicroBatching mb);

}  // namespace pipegrid
