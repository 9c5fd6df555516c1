#include "core/nccl_tuning.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace pipegrid {
namespace {
namespace nccl_2_21 {

// NCCL 2.21.5 (src/graph/tuning.cc at tag v2.21.5-1), protocols in the order LL, LL128, Simple;
// latencies in us, bandwidths in GB/s (1e9 bytes/s).
constexpr int kProtocols = 3;
constexpr std::array<double, kProtocols> kTreeBase{6.8, 14.0, 0.0};
constexpr std::array<double, kProtocols> kRingBase{6.6, 14.0, 8.4};
constexpr std::array<double, kProtocols> kTreeNvlink{0.6, 1.25, 28.0};
constexpr std::array<double, kProtocols> kTreePci{1.0, 1.9, 28.0};
constexpr std::array<double, kProtocols> kTreeNet{5.0, 8.5, 28.0};
constexpr std::array<double, kProtocols> kRingNvlink{0.6, 1.9, 3.4};
constexpr std::array<double, kProtocols> kRingPci{1.0, 2.5, 5.7};
constexpr std::array<double, kProtocols> kRingNet{2.7, 4.0, 14.0};
constexpr double kNetOverhead = 1.0;  // us, Intel and other CPUs (x 3 for Simple)
// Per-channel caps by generation (Volta, Ampere, Hopper) and machines (1, 2, 3 or more).
constexpr double kTreeCap[3][3] = {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}};
constexpr double kTreeLl128Cap[3][3] = {{20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 29.0}};
constexpr double kRingLl128Cap[3] = {20.0, 20.0, 36.7};
// llMaxBw: on one machine by generation (Volta, Ampere, Hopper); across machines the Intel row.
constexpr double kLlMaxOneMachine[3] = {39.0, 87.7, 141.0};
constexpr double kLlMaxAcross[2] = {39.0, 20.4};  // 2 machines, 3 or more
// The tree's correction by floor(log2(bytes / 64)) (64 B .. 256 MiB), per protocol.
constexpr double kTreeCorrection[kProtocols][23] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9}};

int log2_floor(double x) {
  int l = 0;
  while (x >= 2) {
    x /= 2;
    ++l;
  }
  return l;
}

}  // namespace nccl_2_21
}  // namespace

GpuGeneration gpu_generation(std::string_view kind) {
  if (kind == "v100") return GpuGeneration::Volta;
  if (kind.substr(0, 4) == "a100") return GpuGeneration::Ampere;
  return GpuGeneration::Hopper;
}

NcclModelTime nccl_allreduce_model(const NcclModelInput& in, double bytes) {
  using namespace nccl_2_21;
  const int n = in.ranks, N = std::max(1, in.nodes), gen = static_cast<int>(in.generation);
  const int col = std::min(N, 3) - 1;
  const double C = in.channels, w = in.channel_bw / 1e9;
  const double wt = (in.tree_channel_bw > 0 ? in.tree_channel_bw : in.channel_bw) / 1e9;
  const double ll_max = N == 1 ? kLlMaxOneMachine[gen] : kLlMaxAcross[N == 2 ? 0 : 1];
  const auto& tree_hop = in.nvlink ? kTreeNvlink : kTreePci;
  const auto& ring_hop = in.nvlink ? kRingNvlink : kRingPci;
  const int size_index = log2_floor(bytes / 64);
  NcclModelTime best{std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
  for (int p = 0; p < kProtocols; ++p) {
    // Ring.
    const double steps = 2.0 * (n - 1), inter_steps = N > 1 ? 2.0 * N : 0.0;
    const double overhead = N > 1 ? kNetOverhead * (p == 2 ? 3 : 1) : 0.0;
    double ring_lat =
        kRingBase[p] + (steps - inter_steps) * std::max(ring_hop[p], overhead) + inter_steps * kRingNet[p];
    if (p == 2 && N > 1 && bytes / (2 * C * n) >= 64) ring_lat *= 1.4;
    double ring_bw = C * w;
    if (p == 0) ring_bw = std::min(ll_max, ring_bw * 0.5);
    if (p == 1) ring_bw = std::min(ring_bw * (n / N < 2 ? 0.7 : 0.92), C * kRingLl128Cap[gen]);
    ring_bw *= n / steps;
    // Tree.
    const double tree_lat = kTreeBase[p] + 2 * ((n / N - 1) * tree_hop[p] + log2_floor(N) * kTreeNet[p]);
    double tree_bw = std::min(0.92 * C * wt, C * kTreeCap[gen][col]);
    if (p == 0) tree_bw = std::min(tree_bw / 3.8, ll_max);
    if (p == 1)
      tree_bw = std::min(tree_bw * (N == 1 ? 7.0 / 9.0 : 120.0 / 128.0), C * kTreeLl128Cap[gen][col]);
    tree_bw *= 0.5;
    if (size_index < 23) tree_bw *= kTreeCorrection[p][size_index];
    best.ring = std::min(best.ring, (ring_lat + bytes / (1000 * ring_bw)) * 1e-6);
    best.tree = std::min(best.tree, (tree_lat + bytes / (1000 * tree_bw)) * 1e-6);
  }
  return best;
}

}  // namespace pipegrid
