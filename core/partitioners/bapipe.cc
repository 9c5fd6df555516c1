// bapipe: the partition step of the BaPipe-style strategy (BaPipe, Zhao et al. 2020; only its
// abstract is known, so this is an interpretation: docs/reference/papers.md, README).
//
// Given a schedule, m micro-batches of b samples and p = `stages`: contiguous stages of layers
// (topological order), stage i data-parallel on r_i consecutive devices (each replica takes b / r_i
// samples), minimising the slowest stage, where a stage's time per micro-batch is the slowest
// replica's F + B (devices may differ: heterogeneous GPU and FPGA cost models) plus its ring
// all-reduce and optimizer step amortised over the m micro-batches, under every device's memory: static +
// in-flight x stash + the backward's workspace <= capacity, with in-flight = m for gpipe and min(p - i, m)
// for 1f1b. `replicas` >= 1 fixes r_i = replicas (stage i on devices [i r, (i + 1) r)); kAnyReplicas lets
// every stage take its own count (the stages take devices in order from the first; devices left over stay
// idle).
//
// Exact for that objective: costs grow with the layer range, so for a target time a programme over
// (stages placed, devices used) that keeps the longest covered prefix per state decides
// feasibility (a longer prefix leaves a shorter suffix, which never costs more), and a bisection on
// the target finds the optimum. Transfers between stages overlap compute and are left to the
// evaluation that compares candidates (core/experiment.cc explores schedules x micro-batch sizes x
// stages x replicas and keeps the fastest plan by the analytic evaluator).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/collectives.h"
#include "core/partitioners/common.h"
#include "core/planners/block_profile.h"
#include "core/strategy.h"
#include "core/units.h"

namespace pipegrid {
namespace {

// The partition search of one request: its tables, the stage cost and memory check, the programme
// for a target and the bisection on the target.
class BapipeSearch {
 public:
  // Stage [j, k) of the order on devices [a, a + c), as the programme places it.
  struct Placed {
    int j, k, a, c;
  };

  BapipeSearch(const PartitionRequest& r, const std::vector<int>& order)
      : r_(r),
        w_(r.workload),
        order_(order),
        profile_(r.workload, order),
        p_(r.stages),
        any_(r.replicas == kAnyReplicas),
        fixed_(any_ ? 0 : std::max(1, r.replicas)),
        D_(static_cast<int>(r.cluster.devices.size())),
        n_(static_cast<int>(order.size())),
        m_(r.micro_batches),
        gpipe_(r.schedule == "gpipe") {}

  // Replica counts, the compute table and the device groups; fails on a replica count that splits
  // samples, a layer a device cannot cost or devices that are not connected.
  Status init() {
    if (Status s = find_counts(); !s) return s;
    if (Status s = fill_times(); !s) return s;
    return fill_groups();
  }

  // The plan of the smallest slowest stage (empty when none fits memory).
  std::vector<Placed> bisect() const;

  Result<Partition> to_partition(const std::vector<Placed>& plan) const;

 private:
  // Per group of c devices from a: ring all-reduce bandwidth and latency (routes between
  // consecutive devices) and the smallest memory.
  struct Group {
    LinkCost ring;
    double capacity = std::numeric_limits<double>::infinity();
  };
  // reach[i][d] of the programme: the longest prefix covered (-1: none) and the step that got there.
  struct Step {
    int covered = -1, from_devices = -1;
  };

  Status find_counts();
  Status fill_times();
  Status fill_groups();
  double stage_time(int a, int c, int j, int k) const;
  bool fits(int i, int a, int c, int j, int k) const;
  int longest_stage(int i, int a, int c, int j, double target) const;
  std::vector<Placed> feasible(double target) const;
  std::vector<Placed> trace(const std::vector<std::vector<Step>>& reach) const;

  const PartitionRequest& r_;
  const Workload& w_;
  const std::vector<int>& order_;
  const BlockProfile profile_;  // one block per layer
  const int p_;
  const bool any_;
  const int fixed_, D_, n_, m_;
  const bool gpipe_;
  std::vector<int> counts_;  // replica counts a stage may take
  // time_[c][d][k]: prefix sums of F + B over the order on device d at a share of b / c samples.
  std::vector<std::vector<std::vector<double>>> time_;
  std::vector<std::vector<Group>> groups_;  // [a][c]
};

Status BapipeSearch::find_counts() {
  // Only counts that give every replica whole samples of the micro-batch.
  if (any_) {
    for (int c = 1; c <= D_ - (p_ - 1); ++c)
      if (whole_samples_per_replica(r_.micro_batch_size, c)) counts_.push_back(c);
    return {};
  }
  if (!whole_samples_per_replica(r_.micro_batch_size, fixed_))
    return Error{
        fmt::format("bapipe: {} replicas would split each micro-batch of {} samples into {} samples "
                    "each; a replica count must divide the micro-batch size",
                    fixed_, r_.micro_batch_size, r_.micro_batch_size / fixed_)};
  counts_.push_back(fixed_);
  return {};
}

// Not block_compute_prefix: the prefix adds a layer's forward, then its backward (dapple adds their
// sum), and the two round differently; the partitions must stay what they were.
Status BapipeSearch::fill_times() {
  time_.resize(D_ + 1);
  for (int c : counts_) {
    time_[c].assign(D_, std::vector<double>(n_ + 1, 0.0));
    for (int d = 0; d < D_; ++d)
      for (int k = 0; k < n_; ++k) {
        Result<PassTimes> t = device_layer_times(w_.layer(order_[k]), w_.precision, r_.cluster.devices[d],
                                                 r_.micro_batch_size / c);
        if (!t) return Error{fmt::format("bapipe: on {}: {}", r_.cluster.devices[d].name, t.error().message)};
        time_[c][d][k + 1] = time_[c][d][k] + t->forward + t->backward();
      }
  }
  return {};
}

Status BapipeSearch::fill_groups() {
  Router router(r_.cluster);
  groups_.assign(D_, std::vector<Group>(D_ + 1));
  for (int a = 0; a < D_; ++a)
    for (int c : counts_) {
      if (a + c > D_) continue;
      Group& g = groups_[a][c];
      std::vector<int> ring(c);
      for (int x = 0; x < c; ++x) {
        g.capacity = std::min(g.capacity, r_.cluster.devices[a + x].spec.usable_memory());
        ring[x] = a + x;
      }
      Result<LinkCost> cost = ring_link_cost(router, ring);
      if (!cost) return cost.error();
      g.ring = *cost;
    }
  return {};
}

double BapipeSearch::stage_time(int a, int c, int j, int k) const {
  double t = 0;
  for (int x = 0; x < c; ++x) t = std::max(t, time_[c][a + x][k] - time_[c][a + x][j]);
  if (c > 1) t += closed_form::ring_allreduce(c, profile_.parameter_bytes(j, k), groups_[a][c].ring) / m_;
  // The stage's optimizer step, once per iteration like the all-reduce (slowest replica).
  double step = 0;
  for (int x = 0; x < c; ++x)
    step =
        std::max(step, device_step_time(w_, profile_.parameters(j, k), r_.memory, r_.cluster.devices[a + x]));
  return t + step / m_;
}

bool BapipeSearch::fits(int i, int a, int c, int j, int k) const {
  MemoryBytes st = static_memory(profile_.parameters(j, k), profile_.parameter_bytes(j, k), r_.memory);
  if (r_.memory.zero1) st[static_cast<int>(MemoryCategory::OptimizerState)] /= c;
  const int in_flight = gpipe_ ? m_ : std::min(p_ - i, m_);
  return total(st) +
             (in_flight * profile_.stash(j, k) + profile_.largest_output(j, k)) * (r_.micro_batch_size / c) <=
         groups_[a][c].capacity;
}

// The end of the longest stage i from layer j on devices [a, a + c) that meets the target and fits
// (j: none), leaving every later stage one layer at least. Costs grow with the end, so a bisection
// finds the first end that fails.
int BapipeSearch::longest_stage(int i, int a, int c, int j, double target) const {
  int lo = j, hi = n_ - (p_ - 1 - i);  // [j+1 .. lo] pass; (hi, last allowed] fail
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (stage_time(a, c, j, mid) <= target && fits(i, a, c, j, mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// For a target: reach[i][d] = the longest prefix of the order that i stages on the first d devices
// cover, with the step that got there. Returns the stages, or empty if the target is infeasible.
std::vector<BapipeSearch::Placed> BapipeSearch::feasible(double target) const {
  std::vector<std::vector<Step>> reach(p_ + 1, std::vector<Step>(D_ + 1));
  reach[0][0].covered = 0;
  for (int i = 0; i < p_; ++i)
    for (int a = 0; a <= D_; ++a) {
      const int j = reach[i][a].covered;
      if (j < 0) continue;
      for (int c : counts_) {
        if (a + c > D_) break;
        if (j >= n_ - (p_ - 1 - i)) continue;
        const int k = longest_stage(i, a, c, j, target);
        if (k == j) continue;
        Step& to = reach[i + 1][a + c];
        if (k > to.covered) to = {k, a};
      }
    }
  return trace(reach);
}

std::vector<BapipeSearch::Placed> BapipeSearch::trace(const std::vector<std::vector<Step>>& reach) const {
  std::vector<Placed> out;
  int end = -1;
  for (int d = 0; d <= D_ && end < 0; ++d)  // the fewest devices that reach the end
    if (reach[p_][d].covered == n_) end = d;
  if (end < 0) return out;
  for (int i = p_, d = end; i > 0; --i) {
    const Step& s = reach[i][d];
    const int a = s.from_devices;
    out.push_back({reach[i - 1][a].covered, s.covered, a, d - a});
    d = a;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<BapipeSearch::Placed> BapipeSearch::bisect() const {
  // The slowest any stage can be (every layer, any group): every plan meets it.
  double hi = 0;
  for (int a = 0; a < D_; ++a)
    for (int c : counts_)
      if (a + c <= D_) hi = std::max(hi, stage_time(a, c, 0, n_));
  hi = hi * (1 + 1e-9) + 1e-30;
  std::vector<Placed> plan = feasible(hi);
  if (plan.empty()) return plan;
  double lo = 0;
  for (int it = 0; it < 100 && hi - lo > 1e-12 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (std::vector<Placed> b = feasible(mid); !b.empty()) {
      hi = mid;
      plan = std::move(b);
    } else {
      lo = mid;
    }
  }
  return plan;
}

Result<Partition> BapipeSearch::to_partition(const std::vector<Placed>& plan) const {
  std::vector<std::pair<int, int>> ranges;
  std::vector<std::vector<int>> devices(p_);
  double slowest = 0;
  std::vector<double> stage_times;
  for (int i = 0; i < p_; ++i) {
    const Placed& s = plan[i];
    ranges.emplace_back(s.j, s.k);
    for (int x = 0; x < s.c; ++x) devices[i].push_back(s.a + x);
    stage_times.push_back(stage_time(s.a, s.c, s.j, s.k));
    slowest = std::max(slowest, stage_times.back());
  }
  Result<Partition> part = contiguous_stages(w_, order_, ranges, devices, r_.cluster.devices.size());
  if (!part) return part.error();
  part->plan.predicted_time_per_stage_s = slowest;
  part->plan.predicted_stage_time_s = std::move(stage_times);
  std::string reps;
  for (int i = 0; i < p_; ++i) reps += fmt::format("{}{}", i ? " " : "", plan[i].c);
  part->plan.summary = fmt::format("bapipe: {} stages, replicas {}, slowest stage {} per micro-batch", p_,
                                   reps, format_time(slowest));
  return part;
}

}  // namespace

Result<Partition> partition_bapipe(const PartitionRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  const int p = r.stages;
  const bool any = r.replicas == kAnyReplicas;
  const int fixed = any ? 0 : std::max(1, r.replicas);
  const int D = static_cast<int>(r.cluster.devices.size());
  if (p < 1 || (any ? p : p * fixed) > D)
    return any ? Error{fmt::format("bapipe: {} stages need {} devices, the cluster has {}", p, p, D)}
               : Error{fmt::format("bapipe: {} stages x {} replicas need {} devices, the cluster has {}", p,
                                   fixed, p * fixed, D)};
  const std::vector<int> order = topological_order(r.workload);
  const int n = static_cast<int>(order.size());
  if (p > n)
    return Error{fmt::format("bapipe: {} stages need at least {} layers, the workload has {}", p, p, n)};
  BapipeSearch search(r, order);
  if (Status s = search.init(); !s) return s.error();
  const std::vector<BapipeSearch::Placed> plan = search.bisect();
  if (plan.empty())
    return any ? Error{fmt::format("bapipe: no {}-stage partition fits the devices' memory", p)}
               : Error{fmt::format("bapipe: no {}-stage partition (x {} replicas) fits the devices' memory",
                                   p, fixed)};
  Result<Partition> part = search.to_partition(plan);
  if (part)
    part->plan.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return part;
}

}  // namespace pipegrid
