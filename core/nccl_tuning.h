// Part of the collectives module (core/collectives.h): which all-reduce algorithm NCCL picks.
//
// NCCL times every algorithm and protocol it may use for a collective with a latency-bandwidth model
// of its own (src/graph/tuning.cc) and runs the fastest: time = latency + bytes / bandwidth, with
// per-algorithm base and per-hop latencies, per-channel bandwidth caps and, for trees, a
// size-dependent correction. pipegrid restates that model for the two algorithms it simulates for an
// all-reduce across machines, NCCL's ring (one per NIC: AllReduceAlgorithm::MultiRing) and its double
// binary tree (AllReduceAlgorithm::Tree), with the constants of NCCL 2.21.5 (tag v2.21.5-1, commit
// ab2b89c4), over its three protocols (LL, LL128, Simple), and picks as NCCL does (the smaller time;
// the tree on a tie). The model decides only which algorithm runs; its time is then the simulated
// network's. Not modelled: CollNet / SHARP, NVLS (NVLink SHARP), PAT, a tuner plug-in, NCCL_ALGO.
// Interpretations (docs/clusters.md): the channels are one per NIC, their bandwidth the route's
// between machines (both graphs' w; on two machines the tree's may reach twice it, as NCCL's search
// allows, up to the intra-machine route's); the CPU is Intel (its llMaxBw row and 1 us net overhead);
// a GPU later than Hopper, or not NVIDIA's, takes Hopper's caps (2.21.5 has no newer row).
#pragma once

#include <string_view>

namespace pipegrid {

enum class GpuGeneration { Volta, Ampere, Hopper };
// The generation of a catalog GPU kind ("v100" Volta, "a100*" Ampere, the rest Hopper).
GpuGeneration gpu_generation(std::string_view kind);

struct NcclModelInput {
  int ranks = 0;               // devices in the collective
  int nodes = 0;               // machines they sit on
  int channels = 1;            // NCCL's channels found by its search (pipegrid: one per NIC)
  double channel_bw = 0;       // bytes/s per channel between machines (w)
  double tree_channel_bw = 0;  // the tree graph's w (0: channel_bw)
  bool nvlink = true;          // intra-machine hops on NVLink (else PCI)
  GpuGeneration generation = GpuGeneration::Hopper;
};

struct NcclModelTime {
  double ring = 0;  // seconds, NCCL's ring at its best protocol
  double tree = 0;  // seconds, NCCL's tree at its best protocol
  bool tree_wins() const { return tree <= ring; }
};

// NCCL 2.21.5's modelled all-reduce times of `bytes` for the ring and the tree (each at the protocol
// that minimises it). Latency (us): ring b + (2 (n - 1) - 2 N) max(h_intra, o) + 2 N h_net, x 1.4 for
// Simple when bytes / (2 C n) >= 64 (NCCL's ring plateau; o = 1 us, x 3 for Simple); tree
// b + 2 ((n / N - 1) h_intra + floor(log2 N) h_net). Bandwidth: ring C w (LL: min(C w / 2, llMaxBw),
// LL128: min(0.92 C w, C cap)) x n / (2 (n - 1)); tree min(0.92 C w, C cap_tree) (LL: / 3.8, min
// llMaxBw; LL128: x 120/128 (7/9 on one machine), min C cap) x 0.5 x the tree correction for the size.
// Requires nodes >= 1 and ranks >= 2.
NcclModelTime nccl_allreduce_model(const NcclModelInput& in, double bytes);

}  // namespace pipegrid
