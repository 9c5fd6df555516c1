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
#include <bit>
#include <chrono>
#include <limits>

#include "core/collectives.h"
#include "core/partitioners/common.h"
#include "core/strategy.h"
#include "core/units.h"

namespace pipegrid {

Result<Partition> partition_bapipe(const PartitionRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  const Workload& w = r.workload;
  const int p = r.stages;
  const bool any = r.replicas == kAnyReplicas;
  const int fixed = any ? 0 : std::max(1, r.replicas);
  const int D = static_cast<int>(r.cluster.devices.size());
  if (p < 1 || (any ? p : p * fixed) > D)
    return any ? Error{fmt::format("bapipe: {} stages need {} devices, the cluster has {}", p, p, D)}
               : Error{fmt::format("bapipe: {} stages x {} replicas need {} devices, the cluster has {}", p,
                                   fixed, p * fixed, D)};
  const std::vector<int> order = topological_order(w);
  const int n = static_cast<int>(order.size());
  if (p > n)
    return Error{fmt::format("bapipe: {} stages need at least {} layers, the workload has {}", p, p, n)};
  const int m = r.micro_batches;
  // Replica counts a stage may take.
  std::vector<int> counts;
  // Only counts that give every replica whole samples of the micro-batch.
  if (any) {
    for (int c = 1; c <= D - (p - 1); ++c)
      if (whole_samples_per_replica(r.micro_batch_size, c)) counts.push_back(c);
  } else {
    if (!whole_samples_per_replica(r.micro_batch_size, fixed))
      return Error{
          fmt::format("bapipe: {} replicas would split each micro-batch of {} samples into {} samples "
                      "each; a replica count must divide the micro-batch size",
                      fixed, r.micro_batch_size, r.micro_batch_size / fixed)};
    counts.push_back(fixed);
  }

  // time[c][d][k]: prefix sums of F + B over the order on device d at a share of b / c samples.
  std::vector<std::vector<std::vector<double>>> time(D + 1);
  for (int c : counts) {
    time[c].assign(D, std::vector<double>(n + 1, 0.0));
    for (int d = 0; d < D; ++d)
      for (int k = 0; k < n; ++k) {
        Result<PassTimes> t =
            layer_times(w.layer(order[k]), w.precision, r.cluster.devices[d].spec, r.micro_batch_size / c);
        if (!t) return Error{fmt::format("bapipe: on {}: {}", r.cluster.devices[d].name, t.error().message)};
        time[c][d][k + 1] = time[c][d][k] + t->forward + t->backward();
      }
  }
  std::vector<double> params(n + 1, 0), pbytes(n + 1, 0), stash(n + 1, 0);
  for (int k = 0; k < n; ++k) {
    const Layer& l = w.layer(order[k]);
    params[k + 1] = params[k] + l.parameters;
    pbytes[k + 1] = pbytes[k] + l.parameter_bytes;
    stash[k + 1] = stash[k] + l.stash_bytes;
  }
  // largest(j, k): the largest layer output in [j, k) (the backward's workspace), from a sparse
  // table (level h holds the maxima of runs of 2^h layers): n log n memory, not n^2.
  std::vector<std::vector<double>> runs(1, std::vector<double>(n));
  for (int k = 0; k < n; ++k) runs[0][k] = w.layer(order[k]).output_bytes;
  for (int h = 1; (1 << h) <= n; ++h) {
    runs.emplace_back(n - (1 << h) + 1);
    for (int k = 0; k + (1 << h) <= n; ++k)
      runs[h][k] = std::max(runs[h - 1][k], runs[h - 1][k + (1 << (h - 1))]);
  }
  auto largest = [&](int j, int k) {
    if (k <= j) return 0.0;
    const int h = std::bit_width(static_cast<unsigned>(k - j)) - 1;
    return std::max(runs[h][j], runs[h][k - (1 << h)]);
  };
  // Per group of c devices from a: ring all-reduce bandwidth and latency (routes between
  // consecutive devices) and the smallest memory.
  struct Group {
    LinkCost ring;
    double capacity = std::numeric_limits<double>::infinity();
  };
  Router router(r.cluster);
  std::vector<std::vector<Group>> groups(D, std::vector<Group>(D + 1));
  for (int a = 0; a < D; ++a)
    for (int c : counts) {
      if (a + c > D) continue;
      Group& g = groups[a][c];
      for (int x = 0; x < c; ++x) {
        g.capacity = std::min(g.capacity, r.cluster.devices[a + x].spec.memory_bytes);
        if (c == 1) continue;
        Result<Route> route = router.route(a + x, a + (x + 1) % c);
        if (!route) return route.error();
        g.ring.add_hop(route->latency, route->bandwidth);
      }
    }
  const bool gpipe = r.schedule == "gpipe";
  // Stage [j, k) on devices [a, a + c).
  auto stage_time = [&](int a, int c, int j, int k) {
    double t = 0;
    for (int x = 0; x < c; ++x) t = std::max(t, time[c][a + x][k] - time[c][a + x][j]);
    if (c > 1) t += closed_form::ring_allreduce(c, pbytes[k] - pbytes[j], groups[a][c].ring) / m;
    // The stage's optimizer step, once per iteration like the all-reduce (slowest replica).
    double step = 0;
    for (int x = 0; x < c; ++x)
      step = std::max(step, w.optimizer_step_s >= 0
                                ? w.optimizer_step_s
                                : optimizer_step_time(params[k] - params[j], r.memory, w.precision,
                                                      r.cluster.devices[a + x].spec));
    return t + step / m;
  };
  auto fits = [&](int i, int a, int c, int j, int k) {
    MemoryBytes st = static_memory(params[k] - params[j], pbytes[k] - pbytes[j], r.memory);
    if (r.memory.zero1) st[static_cast<int>(MemoryCategory::OptimizerState)] /= c;
    const int in_flight = gpipe ? m : std::min(p - i, m);
    return total(st) + (in_flight * (stash[k] - stash[j]) + largest(j, k)) * (r.micro_batch_size / c) <=
           groups[a][c].capacity;
  };
  // For a target: reach[i][d] = the longest prefix of the order that i stages on the first d
  // devices cover (-1: none), with the step that got there. Returns the stages (first layer,
  // first device, device count), or empty if the target is infeasible.
  struct Step {
    int covered = -1, from_devices = -1;
  };
  struct Placed {
    int j, k, a, c;
  };
  auto feasible = [&](double target) {
    std::vector<std::vector<Step>> reach(p + 1, std::vector<Step>(D + 1));
    reach[0][0].covered = 0;
    for (int i = 0; i < p; ++i) {
      const int last_allowed = n - (p - 1 - i);  // every later stage keeps one layer at least
      for (int a = 0; a <= D; ++a) {
        const int j = reach[i][a].covered;
        if (j < 0) continue;
        for (int c : counts) {
          if (a + c > D) break;
          // Longest stage from j: costs grow with k, so bisect on the first k that fails.
          int lo = j, hi = last_allowed;  // [j+1 .. lo] pass; (hi, last_allowed] fail
          if (lo >= hi) continue;
          while (lo < hi) {
            const int mid = lo + (hi - lo + 1) / 2;
            if (stage_time(a, c, j, mid) <= target && fits(i, a, c, j, mid))
              lo = mid;
            else
              hi = mid - 1;
          }
          if (lo == j) continue;
          Step& to = reach[i + 1][a + c];
          if (lo > to.covered) to = {lo, a};
        }
      }
    }
    std::vector<Placed> out;
    int end = -1;
    for (int d = 0; d <= D && end < 0; ++d)  // the fewest devices that reach the end
      if (reach[p][d].covered == n) end = d;
    if (end < 0) return out;
    for (int i = p, d = end; i > 0; --i) {
      const Step& s = reach[i][d];
      const int a = s.from_devices;
      out.push_back({reach[i - 1][a].covered, s.covered, a, d - a});
      d = a;
    }
    std::reverse(out.begin(), out.end());
    return out;
  };
  // The slowest any stage can be (every layer, any group): every plan meets it.
  double hi = 0;
  for (int a = 0; a < D; ++a)
    for (int c : counts)
      if (a + c <= D) hi = std::max(hi, stage_time(a, c, 0, n));
  hi = hi * (1 + 1e-9) + 1e-30;
  std::vector<Placed> plan = feasible(hi);
  if (plan.empty())
    return any ? Error{fmt::format("bapipe: no {}-stage partition fits the devices' memory", p)}
               : Error{fmt::format("bapipe: no {}-stage partition (x {} replicas) fits the devices' memory",
                                   p, fixed)};
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
  std::vector<int> stage_of(w.layer_count(), -1);
  std::vector<std::vector<int>> devices(p);
  double slowest = 0;
  std::vector<double> stage_times;
  for (int i = 0; i < p; ++i) {
    const Placed& s = plan[i];
    for (int k = s.j; k < s.k; ++k) stage_of[order[k]] = i;
    for (int x = 0; x < s.c; ++x) devices[i].push_back(s.a + x);
    stage_times.push_back(stage_time(s.a, s.c, s.j, s.k));
    slowest = std::max(slowest, stage_times.back());
  }
  Result<Partition> part = make_partition(w, stage_of, devices, r.cluster.devices.size());
  if (!part) return part.error();
  add_sequence_edges(*part);
  part->plan.predicted_time_per_stage_s = slowest;
  part->plan.predicted_stage_time_s = std::move(stage_times);
  part->plan.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string reps;
  for (int i = 0; i < p; ++i) reps += fmt::format("{}{}", i ? " " : "", plan[i].c);
  part->plan.summary = fmt::format("bapipe: {} stages, replicas {}, slowest stage {} per micro-batch", p,
                                   reps, format_time(slowest));
  return part;
}

}  // namespace pipegrid
