#include "core/planners/block_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "core/device.h"
#include "core/planners/common.h"

namespace pipegrid {

BlockProfile::BlockProfile(const Workload& w, const std::vector<int>& order, std::vector<int> start)
    : start_(std::move(start)) {
  const int B = blocks(), n = static_cast<int>(order.size());
  parameters_.assign(B + 1, 0);
  parameter_bytes_ = stash_ = selective_ = cut_ = parameters_;
  runs_.assign(1, std::vector<double>(B, 0));
  std::vector<int> block_of(n);
  for (int k = 0; k < B; ++k) {
    parameters_[k + 1] = parameters_[k], parameter_bytes_[k + 1] = parameter_bytes_[k];
    stash_[k + 1] = stash_[k], selective_[k + 1] = selective_[k];
    for (int q = start_[k]; q < start_[k + 1]; ++q) {
      const Layer& l = w.layer(order[q]);
      parameters_[k + 1] += l.parameters;
      parameter_bytes_[k + 1] += l.parameter_bytes;
      stash_[k + 1] += l.stash_bytes;
      selective_[k + 1] += l.selective_stash_bytes >= 0 ? l.selective_stash_bytes : l.stash_bytes;
      runs_[0][k] = std::max(runs_[0][k], l.output_bytes);
      block_of[q] = k;
    }
  }
  // Layer q's output crosses every boundary after its block up to the last reader's position; each
  // boundary sums its crossing layers in the order.
  std::vector<int> position(w.layer_count());
  for (int q = 0; q < n; ++q) position[order[q]] = q;
  for (int q = 0; q < n; ++q) {
    int last = q;
    for (auto [it, end] = boost::out_edges(order[q], w.graph); it != end; ++it)
      last = std::max(last, position[boost::target(*it, w.graph)]);
    for (int k = block_of[q] + 1; k < B && start_[k] <= last; ++k) cut_[k] += w.layer(order[q]).output_bytes;
  }
  cut_[0] = w.input_bytes_per_sample;
  for (int q = 0; q < n; ++q)
    if (const Layer& l = w.layer(order[q]); l.tied_to >= 0) {
      const int at = l.tied_to < static_cast<int>(position.size()) ? position[l.tied_to] : -1;
      ties_.push_back({block_of[q], at >= 0 && at < n ? block_of[at] : -1, l.tied_parameters,
                       tied_bytes(w, l, l.tied_parameters)});
    }
  // Sparse table of the blocks' largest outputs (level h: runs of 2^h blocks): B log B, not B^2.
  for (int h = 1; (1 << h) <= B; ++h) {
    runs_.emplace_back(B - (1 << h) + 1);
    for (int k = 0; k + (1 << h) <= B; ++k)
      runs_[h][k] = std::max(runs_[h - 1][k], runs_[h - 1][k + (1 << (h - 1))]);
  }
}

BlockProfile::BlockProfile(const Workload& w, const std::vector<int>& order)
    : BlockProfile(w, order, one_block_per_layer(static_cast<int>(order.size()))) {}

double BlockProfile::tied_copy(int j, int k, bool bytes) const {
  double sum = 0;
  for (const Tie& t : ties_)
    if (t.block >= j && t.block < k && !(t.source_block >= j && t.source_block < k))
      sum += bytes ? t.bytes : t.parameters;
  return sum;
}

double BlockProfile::largest_output(int j, int k) const {
  if (k <= j) return 0.0;
  const int h = std::bit_width(static_cast<unsigned>(k - j)) - 1;
  return std::max(runs_[h][j], runs_[h][k - (1 << h)]);
}

std::vector<int> one_block_per_layer(int n) {
  std::vector<int> start(n + 1);
  for (int q = 0; q <= n; ++q) start[q] = q;
  return start;
}

Result<std::vector<int>> compute_blocks(const Workload& w, const std::vector<int>& order,
                                        const Device& device, int max_blocks) {
  const int n = static_cast<int>(order.size());
  std::vector<double> unit(n);
  for (int q = 0; q < n; ++q) {
    Result<PassTimes> t = layer_times(w.layer(order[q]), w.precision, device.spec, 1);
    if (!t) return Error{fmt::format("on {}: {}", device.name, t.error().message)};
    unit[q] = t->forward + t->backward();
  }
  return cost_blocks(unit, max_blocks);
}

}  // namespace pipegrid
