// The block profile the contiguous planners rank stages with: a topological order of the layers cut
// into contiguous blocks (one layer each, or coarser), with per-block prefix sums of what a stage's
// memory and all-reduce depend on, each block's largest output, and the bytes per sample crossing
// every block boundary. Shared by bapipe's partitioner, dapple, piper and luo, which differ in how
// coarse their blocks are (piper takes only the cut bytes: its other sums are per device of a
// tensor-parallel group, from stage_costs, per (t, share)).
//
// Not in it, and why: compute times, which each planner times its own way. bapipe's partitioner adds
// each layer's forward, then its backward, to a prefix per device and replica share; dapple sums a
// block's F + B first, then adds it (with one layer per block the two still round differently, and
// the plans must not change); luo adds recomputation and its backward alone per device class and
// keeps a layer that a device cannot run as an infinite time; piper takes the lowering's stage_costs
// per (tensor-parallel degree, share), TP collectives included. graphpipe sums over a
// series-parallel tree's runs of branches, which are not ranges of one order.
#pragma once

#include <vector>

#include "core/cluster.h"
#include "core/result.h"
#include "core/workload.h"

namespace pipegrid {

class BlockProfile {
 public:
  // Blocks of `order` (a topological order of w's layers) starting at positions `start` (increasing,
  // start[0] = 0, then order.size() last: B + 1 entries for B blocks).
  BlockProfile(const Workload& w, const std::vector<int>& order, std::vector<int> start);
  // One block per layer.
  BlockProfile(const Workload& w, const std::vector<int>& order);

  int blocks() const { return static_cast<int>(start_.size()) - 1; }
  // First position of block k in the order (k = blocks(): the order's size).
  int start(int k) const { return start_[k]; }
  const std::vector<int>& starts() const { return start_; }

  // Sums over blocks [j, k): parameters (count), parameter bytes, stash bytes per sample, and the
  // stash per sample under selective recomputation (a layer without a selective stash counts its
  // full stash). Each a difference of prefix sums, summed block by block in the order. The
  // parameters add the copy of a tied weight (Layer::tied_to) whose tied layer is in [j, k) and
  // whose source is not (partition.h TiedCopy).
  double parameters(int j, int k) const { return parameters_[k] - parameters_[j] + tied_copy(j, k, false); }
  double parameter_bytes(int j, int k) const {
    return parameter_bytes_[k] - parameter_bytes_[j] + tied_copy(j, k, true);
  }
  // Of which the copies of tied weights (parameters, or their bytes), at t = 1.
  double tied_copy(int j, int k, bool bytes) const;
  double stash(int j, int k) const { return stash_[k] - stash_[j]; }
  double selective_stash(int j, int k) const { return selective_[k] - selective_[j]; }
  // Block k's largest output bytes per sample, and the largest over blocks [j, k) (0 when k <= j).
  double largest_output(int k) const { return runs_[0][k]; }
  double largest_output(int j, int k) const;
  // Bytes per sample crossing the boundary before block k: outputs of layers before it read by a
  // layer at or after it (k = 0: the model's input, input_bytes_per_sample; k = blocks(): 0).
  double cut(int k) const { return cut_[k]; }

 private:
  std::vector<int> start_;
  std::vector<double> parameters_, parameter_bytes_, stash_, selective_, cut_;  // B + 1 each
  std::vector<std::vector<double>> runs_;  // runs_[h][k]: the largest output of blocks [k, k + 2^h)
  struct Tie {
    int block = 0, source_block = -1;  // the tied layer's and its source's blocks (-1: not in the order)
    double parameters = 0, bytes = 0;
  };
  std::vector<Tie> ties_;
};

// 0, 1, ..., n: one block per position of an order of n layers.
std::vector<int> one_block_per_layer(int n);

// Blocks of about equal compute for the planners that coarsen (dapple, piper): F + B of each layer on
// `device` at one sample, cut by cost_blocks (core/planners/common.h) into at most `max_blocks`.
// Fails as layer_times does, the message naming the device.
Result<std::vector<int>> compute_blocks(const Workload& w, const std::vector<int>& order,
                                        const Device& device, int max_blocks);

}  // namespace pipegrid
