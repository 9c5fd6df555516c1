// The 3D search's one-replica estimate (search3d.h, docs/3d-search.md "How a candidate is costed"):
// one pipeline of one device per stage, the tensor-parallel collectives as delays inside each pass,
// the data-parallel all-reduce in closed form.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

#include "core/collectives.h"
#include "core/device.h"
#include "core/evaluate.h"
#include "core/lower.h"
#include "core/planners/search3d.h"
#include "core/strategy.h"
#include "core/tensor_parallel.h"

namespace pipegrid {
namespace {

// A tensor-parallel pass on rank 0 of its group, as the lowering's chain of compute pieces and ring
// flows runs it when every rank of the group is alike: flow x leaves once piece x has run on both
// of its ends (the same time by symmetry) and takes the route's latency + its bytes / bandwidth,
// queued behind the group's previous flow on the same links (FIFO, as the evaluator); piece x + 1
// waits for it (with overlap, piece x + 2 does). Returns the pass's time.
double tp_pass_time(const TpProgram& prog, const LinkCost& route, int T, bool overlap) {
  const size_t n = prog.collectives();
  std::vector<double> done(n, 0.0);
  double end = 0, link_free = 0;
  for (size_t k = 0; k <= n; ++k) {
    double start = end;
    if (!overlap && k >= 1) start = std::max(start, done[k - 1]);
    if (overlap && k >= 2) start = std::max(start, done[k - 2]);
    if (overlap && k == n && n >= 1) start = std::max(start, done[n - 1]);
    end = start + prog.compute[k];
    if (k < n) {
      const double hold = ring_flow_bytes(prog.kinds[k], prog.bytes[k], T) / route.bandwidth;
      const double begin = std::max(end, link_free);
      link_free = begin + hold;
      done[k] = begin + route.latency + hold;
    }
  }
  return end;
}

// Each stage edge carries 1/T of an activation: what each rank of a group sends to the same rank of
// the next.
void divide_edge_bytes(Partition& p, int T) {
  for (auto [it, end] = boost::edges(p.graph); it != end; ++it) p.graph[*it].bytes_per_sample /= T;
}

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

}  // namespace

Search3dEstimator::Search3dEstimator(const Experiment& base) : base_(base), router_(base_.cluster) {}

Result<Search3dEstimator::FoldedPlan> Search3dEstimator::folded_plan(const Search3dCandidate& c,
                                                                     int replicas) {
  const Workload& w = base_.workload;
  const Cluster& cl = base_.cluster;
  const int T = c.t, d = c.d, p = c.p, m = c.micro_batches;
  const size_t D = cl.devices.size();
  // Pipeline rank r's representative: rank 0 of replica 0, device (r d) T in Megatron's order.
  auto rep = [&](int rank) { return rank * d * T; };

  // The plan of one replica without tensor parallelism: the megatron partitioner and the schedule,
  // pipeline rank r on device r, then moved to its representative.
  Result<const PartitionStrategy*> partitioner = find_partitioner("megatron");
  if (!partitioner) return partitioner.error();
  Result<const ScheduleStrategy*> scheduler = find_schedule(c.schedule);
  if (!scheduler) return scheduler.error();
  FoldedPlan fp;
  fp.memory = base_.memory;
  fp.memory.recompute = c.recompute;
  fp.memory.zero1 = false;  // sharded below, over the d replicas
  Result<Partition> part =
      (*partitioner)
          ->build({w, cl, p, static_cast<double>(c.b), c.v, m, fp.memory, (*scheduler)->name, 1, {}});
  if (!part) return part.error();
  Result<Schedule> sched = (*scheduler)->build({*part, D, m, c.v, {}, {}});
  if (!sched) return sched.error();
  const size_t S = part->stage_count();
  fp.rank_of.resize(S);
  for (size_t s = 0; s < S; ++s) {
    Stage& st = part->graph[s];
    if (st.devices.size() != 1) return Error{"internal error: a one-replica stage on several devices"};
    fp.rank_of[s] = st.devices[0];
    st.devices = {rep(fp.rank_of[s])};
  }
  std::vector<std::vector<Action>> moved(D);
  for (int r = 0; r < p && static_cast<size_t>(r) < sched->device_actions.size(); ++r)
    moved[rep(r)] = std::move(sched->device_actions[r]);
  sched->device_actions = std::move(moved);
  fp.part = std::move(*part);
  fp.sched = std::move(*sched);
  if (Status s = fold_costs(c, fp); !s) return s.error();
  if (replicas > 1)
    if (Status s = replicate(c, replicas, **partitioner, **scheduler, fp); !s) return s.error();
  return fp;
}

// Per-device costs of each stage of fp's one-replica plan: under tensor parallelism, of rank 0 of
// replica 0's group, with each pass's collectives folded into the pass (tp_pass_time), and each
// rank's 1/T of an activation sent to the same rank of the next group.
Status Search3dEstimator::fold_costs(const Search3dCandidate& c, FoldedPlan& fp) {
  const int T = c.t, d = c.d;
  auto rep = [&](int rank, int tp_rank) { return rank * d * T + tp_rank; };
  const size_t S = fp.part.stage_count();
  fp.tp_exposed.assign(S, 0.0);  // per stage: TP time in one F and one B of rank 0
  const TensorParallelOptions tpo{c.sequence_parallel, base_.strategy.tp_overlap};
  const auto key = std::make_tuple(T, c.p, c.v, c.b, static_cast<int>(c.recompute), c.sequence_parallel);
  auto cached = costs_.find(key);
  if (cached == costs_.end()) {
    Partition groups = fp.part;  // under tensor parallelism, replica 0's groups
    if (T > 1)
      for (size_t s = 0; s < S; ++s) {
        Stage& st = groups.graph[s];
        st.devices.clear();
        for (int i = 0; i < T; ++i) st.devices.push_back(rep(fp.rank_of[s], i));
        st.tensor_parallel = T;
      }
    auto r = stage_costs(base_.workload, base_.cluster, groups, c.b, c.recompute, tpo);
    if (!r) return r.error();
    cached = costs_.emplace(key, std::move(*r)).first;
  }
  if (T == 1) {
    for (const auto& x : cached->second) fp.costs.push_back({x[0]});
    return {};
  }
  // The group's ring: rank i to rank i + 1; the slowest of its routes stands for all.
  std::vector<int> group(T);
  for (int i = 0; i < T; ++i) group[i] = rep(0, i);
  Result<LinkCost> route = ring_link_cost(router_, group);
  if (!route) return route.error();
  const bool split = fp.sched.split_backward;
  for (size_t s = 0; s < S; ++s) {
    StageCost sc = cached->second[s][0];
    const double f = tp_pass_time(sc.tp_forward, *route, T, tpo.overlap);
    const TpProgram& bprog = split ? sc.tp_backward_input : sc.tp_backward;
    const double b = tp_pass_time(bprog, *route, T, tpo.overlap);
    fp.tp_exposed[s] = (f - sum(sc.tp_forward.compute)) + (b - sum(bprog.compute));
    sc.times.forward = f;
    // The lowering runs recompute_s + backward() (+ W when split) for a stage without TP.
    sc.times.backward_input = split ? b : b - sc.times.backward_weight;
    sc.recompute_s = 0;
    sc.tp_forward = sc.tp_backward = sc.tp_backward_input = {};
    fp.costs.push_back({std::move(sc)});
  }
  divide_edge_bytes(fp.part, T);
  return {};
}

// fp's plan with every replica: the partitioner's d devices of a stage, replica j of pipeline rank r
// moved to its representative, each with rank 0's costs.
Status Search3dEstimator::replicate(const Search3dCandidate& c, int replicas,
                                    const PartitionStrategy& partitioner, const ScheduleStrategy& scheduler,
                                    FoldedPlan& fp) {
  const int T = c.t, d = c.d, m = c.micro_batches;
  const size_t D = base_.cluster.devices.size(), S = fp.part.stage_count();
  auto rep = [&](int rank, int replica) { return (rank * d + replica) * T; };
  Result<Partition> all = partitioner.build({base_.workload,
                                             base_.cluster,
                                             c.p,
                                             static_cast<double>(c.b) * replicas,
                                             c.v,
                                             m,
                                             fp.memory,
                                             scheduler.name,
                                             replicas,
                                             {}});
  if (!all) return all.error();
  Result<Schedule> all_sched = scheduler.build({*all, D, m, c.v, {}, {}});
  if (!all_sched) return all_sched.error();
  if (all->stage_count() != S) return Error{"internal error: the replicated plan has other stages"};
  std::map<int, std::pair<int, int>> where;  // partitioner's device -> (pipeline rank, replica)
  for (size_t s = 0; s < S; ++s) {
    Stage& st = all->graph[s];
    if (st.devices.size() != static_cast<size_t>(replicas))
      return Error{"internal error: a replicated stage on another number of devices"};
    for (int j = 0; j < replicas; ++j) {
      auto [it, fresh] = where.emplace(st.devices[j], std::make_pair(fp.rank_of[s], j));
      if (!fresh && it->second != std::make_pair(fp.rank_of[s], j))
        return Error{"internal error: the replicated plan places its stages otherwise"};
      st.devices[j] = rep(fp.rank_of[s], j);
    }
    fp.costs[s].assign(static_cast<size_t>(replicas), fp.costs[s][0]);
  }
  std::vector<std::vector<Action>> moved(D);
  for (const auto& [dev, at] : where)
    if (static_cast<size_t>(dev) < all_sched->device_actions.size())
      moved[rep(at.first, at.second)] = std::move(all_sched->device_actions[dev]);
  all_sched->device_actions = std::move(moved);
  if (T > 1) divide_edge_bytes(*all, T);
  fp.part = std::move(*all);
  fp.sched = std::move(*all_sched);
  return {};
}

Result<PreparedRun> Search3dEstimator::tp_folded(const Search3dCandidate& c) {
  Result<FoldedPlan> fp = folded_plan(c, c.d);
  if (!fp) return fp.error();
  LoweringOptions lo;
  lo.micro_batches = c.micro_batches;
  lo.micro_batch_size = static_cast<double>(c.b) * c.d;
  lo.memory = fp->memory;
  lo.memory.zero1 = c.distributed_optimizer;  // the lowering shards the optimizer over the d replicas
  lo.allreduce = base_.strategy.allreduce;
  lo.dp_overlap = base_.strategy.dp_overlap;
  lo.gradient_reduce_bytes = base_.strategy.gradient_reduce_bytes;
  lo.costs = &fp->costs;
  Result<TaskGraph> g = lower(base_.workload, base_.cluster, fp->part, fp->sched, lo);
  if (!g) return g.error();
  PreparedRun run;
  run.partition = std::move(fp->part);
  run.schedule = std::move(fp->sched);
  run.schedule_name = c.schedule;
  run.partitioner = "megatron";
  run.micro_batch_size = lo.micro_batch_size;
  run.micro_batches = c.micro_batches;
  run.graph = std::move(*g);
  run.planner = "search (TP-folded)";
  return run;
}

namespace {

// A lower bound on each representative's peak before anything is lowered: its static memory and, in
// the backward pass of one of its stages, that micro-batch's stash, what it re-materialises and its
// workspace. Returns the estimate of a candidate that cannot fit (not lowered), or none.
std::optional<Search3dEstimate> over_memory(const Search3dCandidate& c,
                                            const std::vector<std::vector<StageCost>>& costs,
                                            const std::vector<int>& rank_of, const MemoryOptions& memory,
                                            const Cluster& cl) {
  std::map<int, MemoryBytes> statics;
  std::map<int, double> transient;
  for (size_t s = 0; s < costs.size(); ++s) {
    const StageCost& sc = costs[s][0];
    MemoryBytes st = static_memory(sc.parameters, sc.parameter_bytes, memory);
    if (c.distributed_optimizer) st[static_cast<int>(MemoryCategory::OptimizerState)] /= c.d;
    for (int k = 0; k < kMemoryCategoryCount; ++k) statics[rank_of[s]][k] += st[k];
    transient[rank_of[s]] =
        std::max(transient[rank_of[s]], sc.stash_bytes + sc.recompute_bytes + sc.workspace_bytes);
  }
  Search3dEstimate over;
  for (const auto& [rank, bytes] : statics) {
    const double bound = total(bytes) + transient[rank];
    if (bound > cl.devices[rank * c.d * c.t].spec.usable_memory()) {
      over.fits = over.lowered = false;
      over.peak_memory_bytes = std::max(over.peak_memory_bytes, bound);
    }
  }
  if (over.fits) return std::nullopt;
  return over;
}

// When each stage's gradients are ready (its last backward pass, B or W when split, ends) and, under
// bucketed overlap, where the first stage's last backward pass starts.
struct GradientsReady {
  std::vector<double> ready;  // per stage
  bool bucketed = false;      // strategy dp_overlap, as lower() builds it
  int buckets = 1;            // the first stage's
  double start0 = 0;
};

GradientsReady gradients_ready(const TaskGraph& g, const Timeline& tl, size_t S, bool dp_overlap, int d,
                               double first_stage_parameters) {
  GradientsReady out;
  out.ready.assign(S, 0.0);
  size_t last0 = SIZE_MAX;  // the first stage's last backward task (its last piece)
  for (size_t i = 0; i < g.tasks.size(); ++i) {
    const Task& t = g.tasks[i];
    if (t.kind == TaskKind::Backward || t.kind == TaskKind::Weight) {
      out.ready[t.stage] = std::max(out.ready[t.stage], tl.end[i]);
      if (t.stage == 0 && (last0 == SIZE_MAX || tl.end[i] >= tl.end[last0])) last0 = i;
    }
  }
  // The first stage's buckets follow its last backward pass, which starts where that pass's first
  // piece starts.
  out.bucketed = dp_overlap && d > 1 && last0 != SIZE_MAX;
  out.buckets = out.bucketed ? dp_buckets(first_stage_parameters, d) : 1;
  if (out.bucketed) {
    out.start0 = tl.start[last0];
    const Task& l = g.tasks[last0];
    for (size_t i = 0; i < g.tasks.size(); ++i) {
      const Task& t = g.tasks[i];
      if (t.stage == 0 && t.kind == l.kind && t.micro_batch == l.micro_batch && t.device == l.device)
        out.start0 = std::min(out.start0, tl.start[i]);
    }
  }
  return out;
}

// Per pipeline rank, after its data-parallel all-reduces: when its optimizer step ends, how long it
// takes, the all-reduce time exposed after its last gradients, and when those were ready.
struct RankEnd {
  double step_end = 0, step = 0, dp_exposed = 0, last_ready = 0;
};

// Each stage's data-parallel all-reduce (`ar`) once its gradients are ready (a device's stages, with
// interleaving, one after another in the order they become ready; the first stage's in buckets under
// overlap), then the optimizer step. Per pipeline rank.
std::map<int, RankEnd> rank_ends(const Search3dCandidate& c, const Workload& w, const DeviceSpec& spec,
                                 const std::vector<std::vector<StageCost>>& costs,
                                 const std::vector<int>& rank_of, const MemoryOptions& memory,
                                 const GradientsReady& gr, const std::vector<double>& ar) {
  // rank -> (ready, all-reduce, start of the last backward, buckets)
  std::map<int, std::vector<std::tuple<double, double, double, int>>> per_device;
  std::map<int, double> step_parameters;
  for (size_t s = 0; s < costs.size(); ++s) {
    step_parameters[rank_of[s]] += costs[s][0].parameters;
    const bool b0 = gr.bucketed && s == 0;
    per_device[rank_of[s]].emplace_back(gr.ready[s], ar[s], b0 ? gr.start0 : gr.ready[s],
                                        b0 ? gr.buckets : 1);
  }
  std::map<int, RankEnd> ends;
  for (auto& [rank, list] : per_device) {
    std::sort(list.begin(), list.end());
    double t = 0, last = 0;
    for (auto [r, a, from, k] : list) {
      // K buckets, bucket i ready once (i + 1) / K of the last backward (from .. r) has run, each
      // all-reduced after the one before (lower.h); one bucket: ready at r.
      for (int i = 0; i < k; ++i) t = std::max(t, from + (i + 1) * (r - from) / k) + a / k;
      last = std::max(last, r);
    }
    const double params = step_parameters[rank] / (c.distributed_optimizer ? c.d : 1);
    const double step =
        w.optimizer_step_s >= 0 ? w.optimizer_step_s : optimizer_step_time(params, memory, w.precision, spec);
    const double start = std::max(t, last);
    ends[rank] = RankEnd{start + step, step, start - last, last};
  }
  return ends;
}

// The representatives' breakdown with the TP collectives, the closed-form all-reduce and the step in
// (the mean over them), their peak memory and whether they fit.
void fill_breakdown(const Search3dCandidate& c, const Metrics& pm, const std::vector<int>& rank_of,
                    const std::vector<double>& tp_exposed, const std::map<int, RankEnd>& ends,
                    Search3dEstimate& est) {
  const double pipeline_end = pm.iteration_time_s;
  int used = 0;
  for (size_t dev = 0; dev < pm.devices.size(); ++dev) {
    const DeviceMetrics& dm = pm.devices[dev];
    if (!dm.used) continue;
    est.peak_memory_bytes = std::max(est.peak_memory_bytes, dm.peak_memory_bytes);
    if (dm.peak_memory_bytes > dm.capacity_bytes) est.fits = false;
    const int rank = static_cast<int>(dev) / (c.d * c.t);
    double tp = 0;
    for (size_t s = 0; s < rank_of.size(); ++s)
      if (rank_of[s] == rank) tp += c.micro_batches * tp_exposed[s];
    const auto it = ends.find(rank);
    const RankEnd e = it == ends.end() ? RankEnd{} : it->second;
    TimeBreakdown b = dm.breakdown;
    b.compute_s -= tp;
    b.tensor_parallel_s += tp;
    b.bubble_s -= pipeline_end - e.last_ready;  // the pipeline's trailing idle, replaced:
    b.data_parallel_s += e.dp_exposed;
    b.optimizer_s += e.step;
    b.bubble_s += est.iteration_time_s - e.step_end;
    est.breakdown.compute_s += b.compute_s;
    est.breakdown.optimizer_s += b.optimizer_s;
    est.breakdown.tensor_parallel_s += b.tensor_parallel_s;
    est.breakdown.pipeline_s += b.pipeline_s;
    est.breakdown.data_parallel_s += b.data_parallel_s;
    est.breakdown.bubble_s += b.bubble_s;
    ++used;
  }
  if (used > 0)
    for (double* x : {&est.breakdown.compute_s, &est.breakdown.optimizer_s, &est.breakdown.tensor_parallel_s,
                      &est.breakdown.pipeline_s, &est.breakdown.data_parallel_s, &est.breakdown.bubble_s})
      *x /= used;
}

}  // namespace

// The data-parallel all-reduce of a stage of pipeline rank `rank`: rank i of each of the d replicas'
// groups (T rings at once), in closed form, cached.
Result<double> Search3dEstimator::dp_allreduce(const Search3dCandidate& c, int rank, double bytes,
                                               CollectiveKind kind) {
  const int T = c.t, d = c.d;
  const Cluster& cl = base_.cluster;
  const auto rkey = std::make_tuple(T, d, rank, bytes, kind);
  if (auto hit = allreduce_.find(rkey); hit != allreduce_.end()) return hit->second;
  // The T groups' rings; with multi-ring each group's m rings (one per NIC of a node) carry 1/m of
  // the bytes each (core/collectives.h), all T m rings at once.
  std::map<size_t, std::vector<std::vector<int>>> rings_by_m;
  for (int i = 0; i < T; ++i) {
    std::vector<int> group;
    for (int j = 0; j < d; ++j) group.push_back((rank * d + j) * T + i);
    if (base_.strategy.allreduce != AllReduceAlgorithm::MultiRing) {
      rings_by_m[1].push_back(std::move(group));
      continue;
    }
    const std::vector<std::vector<size_t>> orders = multi_ring_orders(cl, group);
    for (const std::vector<size_t>& order : orders) {
      std::vector<int>& ring = rings_by_m[orders.size()].emplace_back();
      for (size_t j : order) ring.push_back(group[j]);
    }
  }
  double longest = 0;  // groups of different m (not on a homogeneous cluster): timed apart
  for (const auto& [m, rings] : rings_by_m) {
    Result<double> x = concurrent_ring_time(cl, router_, rings, bytes / static_cast<double>(m), kind);
    if (!x) return x.error();
    longest = std::max(longest, *x);
  }
  return allreduce_.emplace(rkey, longest).first->second;
}

// Each stage's data-parallel all-reduce time (0 without replicas).
Result<std::vector<double>> Search3dEstimator::dp_allreduces(const Search3dCandidate& c,
                                                             const FoldedPlan& fp) {
  std::vector<double> ar(fp.costs.size(), 0.0);
  for (size_t s = 0; s < fp.costs.size() && c.d > 1; ++s) {
    double bytes = base_.strategy.gradient_reduce_bytes > 0
                       ? fp.costs[s][0].parameters * base_.strategy.gradient_reduce_bytes
                       : fp.costs[s][0].parameter_bytes;
    // The distributed optimizer's reduce-scatter under overlap (the lowering's; core/lower.cc).
    const CollectiveKind kind = base_.strategy.dp_overlap && c.distributed_optimizer
                                    ? CollectiveKind::ReduceScatter
                                    : CollectiveKind::AllReduce;
    Result<double> x = dp_allreduce(c, fp.rank_of[s], bytes, kind);
    if (!x) return x.error();
    ar[s] = *x;
  }
  return ar;
}

Result<Search3dEstimate> Search3dEstimator::estimate(const Search3dCandidate& c) {
  const Cluster& cl = base_.cluster;
  Result<FoldedPlan> fp = folded_plan(c, 1);
  if (!fp) return fp.error();
  if (std::optional<Search3dEstimate> over = over_memory(c, fp->costs, fp->rank_of, fp->memory, cl))
    return *over;

  LoweringOptions lo;
  lo.micro_batches = c.micro_batches;
  lo.micro_batch_size = c.b;
  lo.memory = fp->memory;
  lo.allreduce = base_.strategy.allreduce;
  lo.costs = &fp->costs;
  Result<TaskGraph> g = lower(base_.workload, cl, fp->part, fp->sched, lo);
  if (!g) return g.error();
  // The optimizer step comes after the data-parallel all-reduce (rank_ends): none here.
  for (Task& t : g->tasks)
    if (t.kind == TaskKind::Optimizer) t.duration = 0;
  if (c.distributed_optimizer)  // ZeRO-1: the optimizer state sharded over the d replicas
    for (auto& bytes : g->static_memory) bytes[static_cast<int>(MemoryCategory::OptimizerState)] /= c.d;
  Result<Timeline> tl = evaluate(*g, cl, router_);
  if (!tl) return tl.error();
  const Metrics pm = compute_metrics(cl, *g, *tl);

  const GradientsReady gr = gradients_ready(*g, *tl, fp->part.stage_count(), base_.strategy.dp_overlap, c.d,
                                            fp->costs[0][0].parameters);
  Result<std::vector<double>> ar = dp_allreduces(c, *fp);
  if (!ar) return ar.error();
  const std::map<int, RankEnd> ends =
      rank_ends(c, base_.workload, cl.devices[0].spec, fp->costs, fp->rank_of, fp->memory, gr, *ar);
  Search3dEstimate est;
  for (const auto& [rank, e] : ends) est.iteration_time_s = std::max(est.iteration_time_s, e.step_end);
  est.iteration_time_s = std::max(est.iteration_time_s, pm.iteration_time_s);
  // Memory and the breakdown, from the representatives (every replica and rank alike).
  fill_breakdown(c, pm, fp->rank_of, fp->tp_exposed, ends, est);
  return est;
}

}  // namespace pipegrid
