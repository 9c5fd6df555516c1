// bapipe: the partition step of the BaPipe-style strategy (BaPipe, Zhao et al. 2020; only its
// abstract is known, so this is an interpretation: ../shared/reference/papers.md, README).
//
// Given a schedule, m micro-batches of b samples, p = `stages` and r = `replicas`: contiguous
// stages of layers (topological order), stage i data-parallel on devices [i r, (i + 1) r) (each
// replica takes b / r samples), minimising the slowest stage, where a stage's time per
// micro-batch is the slowest replica's F + B (devices may differ: heterogeneous GPU and FPGA cost
// models) plus its ring all-reduce amortised over the m micro-batches, under every device's
// memory: static + in-flight x stash + the backward's workspace <= capacity, with in-flight = m
// for gpipe and min(p - i, m) for 1f1b. Exact for that objective: costs grow with the layer range,
// so for a target time the greedy longest-first stages decide feasibility, and a bisection on the
// target finds the optimum. Transfers between stages overlap compute and are left to the
// evaluation that compares candidates (core/experiment.cc explores schedules x micro-batch sizes x
// p x r and keeps the fastest plan by the analytic evaluator).
#include <fmt/format.h>

#include <chrono>
#include <limits>

#include "core/partitioners/common.h"
#include "core/units.h"
#include "core/strategy.h"

namespace pipegrid {

Result<Partition> partition_bapipe(const PartitionRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  const Workload& w = r.workload;
  const int p = r.stages, reps = std::max(1, r.replicas);
  const int D = static_cast<int>(r.cluster.devices.size());
  if (p < 1 || p * reps > D)
    return Error{fmt::format("bapipe: {} stages x {} replicas need {} devices, the cluster has {}", p, reps, p * reps, D)};
  const std::vector<int> order = topological_order(w);
  const int n = static_cast<int>(order.size());
  if (p > n) return Error{fmt::format("bapipe: {} stages need at least {} layers, the workload has {}", p, p, n)};
  const double share = r.micro_batch_size / reps;
  const int m = r.micro_batches;

  // Per device used: prefix sums of F + B over the order, at the replica's share.
  std::vector<std::vector<double>> time(p * reps, std::vector<double>(n + 1, 0.0));
  for (int d = 0; d < p * reps; ++d)
    for (int k = 0; k < n; ++k) {
      Result<PassTimes> t = layer_times(w.layer(order[k]), w.precision, r.cluster.devices[d].spec, share);
      if (!t) return Error{fmt::format("bapipe: on {}: {}", r.cluster.devices[d].name, t.error().message)};
      time[d][k + 1] = time[d][k] + t->forward + t->backward();
    }
  std::vector<double> params(n + 1, 0), pbytes(n + 1, 0), stash(n + 1, 0);
  for (int k = 0; k < n; ++k) {
    const Layer& l = w.layer(order[k]);
    params[k + 1] = params[k] + l.parameters;
    pbytes[k + 1] = pbytes[k] + l.parameter_bytes;
    stash[k + 1] = stash[k] + l.stash_bytes;
  }
  // Ring all-reduce within each stage's group, from the routes between consecutive devices.
  Router router(r.cluster);
  std::vector<double> ring_bw(p, std::numeric_limits<double>::infinity()), ring_lat(p, 0), capacity(p, 0);
  for (int i = 0; i < p; ++i) {
    capacity[i] = std::numeric_limits<double>::infinity();
    for (int j = 0; j < reps; ++j) {
      const int d = i * reps + j;
      capacity[i] = std::min(capacity[i], r.cluster.devices[d].spec.memory_bytes);
      if (reps == 1) continue;
      Result<Route> route = router.route(d, i * reps + (j + 1) % reps);
      if (!route) return route.error();
      ring_bw[i] = std::min(ring_bw[i], route->bandwidth);
      ring_lat[i] = std::max(ring_lat[i], route->latency);
    }
  }
  const bool gpipe = r.schedule == "gpipe";
  auto stage_time = [&](int i, int j, int k) {
    double t = 0;
    for (int x = 0; x < reps; ++x) t = std::max(t, time[i * reps + x][k] - time[i * reps + x][j]);
    if (reps > 1) {
      const double bytes = pbytes[k] - pbytes[j];
      t += (2.0 * (reps - 1) * ring_lat[i] + 2.0 * (reps - 1) / reps * bytes / ring_bw[i]) / m;
    }
    return t;
  };
  // Memory of stage i holding [j, k), with its largest layer output as the backward's workspace.
  auto fits = [&](int i, int j, int k, double largest_output) {
    MemoryBytes st = static_memory(params[k] - params[j], pbytes[k] - pbytes[j], r.memory);
    if (r.memory.zero1) st[static_cast<int>(MemoryCategory::OptimizerState)] /= reps;
    const int in_flight = gpipe ? m : std::min(p - i, m);
    return total(st) + (in_flight * (stash[k] - stash[j]) + largest_output) * share <= capacity[i];
  };
  // Greedy longest stages under target T; the cut points, or empty if infeasible.
  auto feasible = [&](double target) {
    std::vector<int> bounds{0};
    int j = 0;
    for (int i = 0; i < p; ++i) {
      const int last_allowed = n - (p - 1 - i);
      int k = j;
      double largest = 0;
      while (k < last_allowed) {
        const double out = std::max(largest, w.layer(order[k]).output_bytes);
        if (stage_time(i, j, k + 1) > target || !fits(i, j, k + 1, out)) break;
        largest = out;
        ++k;
      }
      if (k == j) return std::vector<int>{};
      if (i == p - 1 && k != n) return std::vector<int>{};
      bounds.push_back(k);
      j = k;
    }
    return bounds;
  };
  double hi = 0;
  for (int i = 0; i < p; ++i) hi = std::max(hi, stage_time(i, 0, n));
  hi = hi * (1 + 1e-9) + 1e-30;
  std::vector<int> bounds = feasible(hi);
  if (bounds.empty())
    return Error{fmt::format("bapipe: no {}-stage partition (x {} replicas) fits the devices' memory", p, reps)};
  double lo = 0;
  for (int it = 0; it < 100 && hi - lo > 1e-12 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (std::vector<int> b = feasible(mid); !b.empty()) {
      hi = mid;
      bounds = std::move(b);
    } else {
      lo = mid;
    }
  }
  std::vector<int> stage_of(w.layer_count(), -1);
  std::vector<std::vector<int>> devices(p);
  for (int i = 0; i < p; ++i) {
    for (int k = bounds[i]; k < bounds[i + 1]; ++k) stage_of[order[k]] = i;
    for (int x = 0; x < reps; ++x) devices[i].push_back(i * reps + x);
  }
  Result<Partition> part = make_partition(w, stage_of, devices, r.cluster.devices.size());
  if (!part) return part.error();
  add_sequence_edges(*part);
  part->plan.predicted_time_per_stage_s = hi;
  for (int i = 0; i < p; ++i) part->plan.predicted_stage_time_s.push_back(stage_time(i, bounds[i], bounds[i + 1]));
  part->plan.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  part->plan.summary =
      fmt::format("bapipe: {} stages x {} replicas, slowest stage {} per micro-batch", p, reps, format_time(hi));
  return part;
}

}  // namespace pipegrid
