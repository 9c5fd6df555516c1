#include "core/planners/common.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "core/evaluate.h"
#include "core/lower.h"
#include "core/metrics.h"
#include "core/moe.h"

namespace pipegrid {
namespace {

// Faster by more than rounding (1e-9 of the time): a plan's last-bit difference (GPipe 0.049 s against
// 1F1B 0.04900000000000001 s) is no reason to prefer it (pick() breaks such ties).
bool better(const Candidate& a, const Candidate& b) {
  return (a.fits && !b.fits) || (a.fits == b.fits && a.judged < b.judged * (1 - 1e-9));
}

}  // namespace

Status apply_expert_parallel(const PlanRequest& r, Partition& p) {
  const StrategySpec& s = r.strategy;
  const int ep = std::max(1, s.expert_parallel);
  const int etp = s.expert_tensor_parallel > 0 ? s.expert_tensor_parallel : std::max(1, s.tensor_parallel);
  for (size_t st = 0; st < p.stage_count(); ++st) {
    Stage& stage = p.graph[st];
    bool moe = false;
    for (int l : stage.layers) moe = moe || r.workload.layer(l).split.kind == TensorSplitKind::MoeBlock;
    if (!moe) continue;  // dense stages keep their tensor-parallel groups only
    const int n = static_cast<int>(stage.devices.size());
    if (n % (ep * etp) != 0)
      return Error{
          fmt::format("expert_parallel {} x expert_tensor_parallel {} = {} does not divide stage {}'s {} "
                      "devices (t x d = {} x "
                      "{}): Megatron folds the MoE layers' etp x ep x edp over the same devices",
                      ep, etp, ep * etp, st, n, stage.tensor_parallel, stage.replicas())};
    stage.expert_parallel = ep;
    stage.expert_tensor_parallel = etp;
  }
  return {};
}

Result<Plan> partition_and_schedule(const PlanRequest& r, const PartitionStrategy& partitioner,
                                    const ScheduleStrategy& scheduler, MicroBatching mb, int stages,
                                    int replicas) {
  const StrategySpec& s = r.strategy;
  Plan plan{};
  plan.micro_batch_size = mb.size;
  plan.micro_batches = mb.count;
  plan.schedule_name = std::string(scheduler.name);
  plan.partitioner = std::string(partitioner.name);
  const int chunks = std::max(1, s.chunks);
  const int T = std::max(1, s.tensor_parallel), cp = std::max(1, s.context_parallel), G = T * cp;
  if (stages <= 0) stages = s.stages;
  if (replicas == 0) replicas = std::max(1, s.replicas);  // kAnyReplicas passes through
  if (stages == 0)
    stages = static_cast<int>(
        std::min(r.cluster.devices.size() / G / std::max(1, replicas), r.workload.layer_count() / chunks));
  // Under tensor (and context) parallelism the partitioner places groups: it sees one device per group
  // (its first) and its plan's device q becomes the group q G .. q G + G - 1, G = t x cp.
  Cluster groups;
  if (G > 1) {
    if (r.cluster.devices.size() % G != 0)
      return Error{cp == 1 ? fmt::format("tensor_parallel {} does not divide the cluster's {} devices", T,
                                         r.cluster.devices.size())
                           : fmt::format("tensor_parallel {} x context_parallel {} = {} does not divide the "
                                         "cluster's {} devices",
                                         T, cp, G, r.cluster.devices.size())};
    for (size_t d = 0; d < r.cluster.devices.size(); d += G) groups.devices.push_back(r.cluster.devices[d]);
  }
  // A schedule file places the stages as its rows run them (torch's V schedules: stages s and
  // 2p - 1 - s on rank s); a file that places them otherwise than one rule is left to the validator.
  std::vector<int> placed;
  if (scheduler.reads_file && replicas > 0)
    if (Result<Schedule> file = parse_schedule_csv(s.schedule_text, s.schedule_source))
      placed = file_stage_ranks(*file, stages, chunks, G * replicas);
  const auto t0 = std::chrono::steady_clock::now();
  Result<Partition> part =
      partitioner.build({r.workload, G > 1 ? groups : r.cluster, stages, mb.size, chunks, mb.count, r.memory,
                         scheduler.name, replicas, s.partitioner_options, std::move(placed)});
  plan.planning_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!part) return part.error();
  plan.partition = std::move(*part);
  if (G > 1)
    for (size_t st = 0; st < plan.partition.stage_count(); ++st) {
      Stage& stage = plan.partition.graph[st];
      std::vector<int> devices;
      for (int q : stage.devices)
        for (int i = 0; i < G; ++i) devices.push_back(q * G + i);
      stage.devices = std::move(devices);
      stage.tensor_parallel = T;
      stage.context_parallel = cp;
    }
  if (Status e = apply_expert_parallel(r, plan.partition); !e) return e.error();
  if (s.moe_overlap) {
    const Parallelism par = parallelism(plan.partition);
    if (auto why = moe_overlap_refusal(par.expert, s.moe.dispatcher, par.pipeline, scheduler.name, mb.count))
      return Error{"moe.overlap: " + *why};
  }
  if (s.partitioner_options.round_robin)
    for (size_t st = 0; st < plan.partition.stage_count(); ++st) {
      Stage& stage = plan.partition.graph[st];
      stage.round_robin = true;
      if (stage.replicas() > mb.count)
        return Error{fmt::format(
            "stage {} has {} round-robin replicas but there are {} micro-batches: replicas past the {} would "
            "idle; use at least {} micro-batches, or replica_mode: split",
            st, stage.replicas(), mb.count, mb.count, stage.replicas())};
    }
  if (replicas > 1)
    for (size_t st = 0; st < plan.partition.stage_count(); ++st)
      if (plan.partition.stage(st).replicas() != replicas)
        return Error{
            fmt::format("partitioner {} does not place {} replicas per stage (stage {} has {} devices)",
                        partitioner.name, replicas, st, plan.partition.stage(st).devices.size())};

  // The schedule and the task graph grow as micro-batches x stage replicas: refused before either is
  // built when above the limit (counted with 2 passes; lower() counts again with the schedule's).
  if (Status st = check_task_count(count_tasks(plan.partition, mb.count, 2, s.allreduce), plan.partition,
                                   mb.count, 2);
      !st)
    return st.error();
  ScheduleRequest req{plan.partition,  r.cluster.devices.size(), mb.count,     chunks,
                      s.schedule_text, s.schedule_source,        s.moe_overlap};
  Result<Schedule> sched = scheduler.build(req);
  if (!sched) return sched.error();
  plan.schedule = std::move(*sched);
  keep_round_robin_turns(plan.schedule, plan.partition);
  if (s.moe_overlap) {
    pair_forward_backward(plan.schedule);
    bool paired = false;
    for (const auto& d : plan.schedule.paired) paired = paired || std::find(d.begin(), d.end(), 1) != d.end();
    if (!paired)
      return Error{fmt::format(
          "the MoE all-to-all overlap (moe.overlap) pairs a micro-batch's forward with another's backward, "
          "and this schedule ({}, {} micro-batch{}) has no such pair: it would change nothing; expected "
          "overlap false, or a schedule that runs a forward just before another micro-batch's backward "
          "(at least 2 micro-batches)",
          scheduler.name, mb.count, mb.count == 1 ? "" : "es")};
  }
  return plan;
}

Result<Candidate> make_candidate(const PlanRequest& r, const PartitionStrategy& partitioner,
                                 const ScheduleStrategy& scheduler, MicroBatching mb, int stages,
                                 int replicas) {
  Result<Plan> plan = partition_and_schedule(r, partitioner, scheduler, mb, stages, replicas);
  if (!plan) return plan.error();
  Result<TaskGraph> g = lower_plan(r, *plan);
  if (!g) return g.error();
  Candidate c;
  c.plan = std::move(*plan);
  c.graph = std::move(*g);
  return c;
}

Result<double> busiest_link_time(const Partition& p, double micro_batch_size, const Cluster& c,
                                 const Router& router) {
  std::unordered_map<size_t, double> load;  // bytes per micro-batch, by link channel
  auto add = [&](int from, int to, double bytes) -> Status {
    Result<Route> route = router.route(from, to);
    if (!route) return route.error();
    for (const Hop& h : route->hops) load[link_channel(c, h)] += bytes;
    return {};
  };
  for (size_t s = 0; s < p.stage_count(); ++s) {
    for (int t : p.successors(static_cast<int>(s))) {
      const double bytes = p.graph[boost::edge(s, t, p.graph).first].bytes_per_sample * micro_batch_size;
      if (bytes <= 0) continue;
      const std::vector<int>& from = p.stage(s).devices;
      const std::vector<int>& to = p.stage(t).devices;
      const int n = static_cast<int>(from.size()), m = static_cast<int>(to.size());
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < m; ++j) {
          const double share = replica_overlap(i, n, j, m);
          if (share <= 0 || from[i] == to[j]) continue;
          if (Status st = add(from[i], to[j], share * bytes); !st) return st.error();  // activations
          if (Status st = add(to[j], from[i], share * bytes); !st) return st.error();  // gradients
        }
    }
  }
  double busiest = 0;
  for (const auto& [key, bytes] : load) busiest = std::max(busiest, bytes / c.links[key / 2].bandwidth);
  return busiest;
}

Result<double> pipeline_estimate(const Partition& part, int p, MicroBatching mb, const Cluster& c,
                                 const Router& router) {
  Result<double> link = busiest_link_time(part, mb.size, c, router);
  if (!link) return link.error();
  return (mb.count + p - 1) * std::max(part.plan.predicted_time_per_stage_s, *link);
}

const Route& RouteCache::operator()(int from, int to) {
  const uint64_t key = (static_cast<uint64_t>(from) << 32) | static_cast<uint32_t>(to);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  Result<Route> rt = router_.route(from, to);
  if (!rt) {
    if (!error_) error_ = rt.error();
    return cache_.emplace(key, Route{}).first->second;
  }
  return cache_.emplace(key, std::move(*rt)).first->second;
}

LinkCost RouteCache::ring(const std::vector<int>& devices) {
  LinkCost cost;
  const size_t n = devices.size();
  for (size_t i = 0; n > 1 && i < n; ++i) {
    const int from = devices[i], to = devices[(i + 1) % n];
    add_ring_hop(cost, router_.cluster(), from, to, (*this)(from, to));
  }
  return cost;
}

std::vector<int> cost_blocks(const std::vector<double>& unit, int max_blocks) {
  const int n = static_cast<int>(unit.size());
  double total = 0;
  for (double u : unit) total += u;
  std::vector<int> start{0};
  double run = 0;
  for (int q = 0; q + 1 < n; ++q) {
    run += unit[q];
    const int b = static_cast<int>(start.size());
    if (n <= max_blocks || (b < max_blocks && (total <= 0 ? q + 1 >= static_cast<double>(n) * b / max_blocks
                                                          : run >= total * b / max_blocks)))
      start.push_back(q + 1);
  }
  start.push_back(n);
  return start;
}

TriedPlan tried_plan(const Candidate& c, std::string what) {
  TriedPlan t;
  t.what = std::move(what);
  t.micro_batch_size = c.plan.micro_batch_size;
  t.micro_batches = c.plan.micro_batches;
  t.stages = static_cast<int>(c.plan.partition.stage_count());
  t.analytic_s = c.analytic;
  t.judged_s = c.was_judged ? c.judged : -1;
  t.fits = c.fits;
  return t;
}

std::optional<int> fractional_split(const Plan& p) {
  for (size_t s = 0; s < p.partition.stage_count(); ++s)
    if (const int c = p.partition.stage(s).replicas();  // t x cp devices share a replica's samples
        !p.partition.stage(s).round_robin && !whole_samples_per_replica(p.micro_batch_size, c))
      return c;
  return std::nullopt;
}

Status score(const PlanRequest& r, Candidate& c) {
  Result<Timeline> t = evaluate(c.graph, r.cluster);
  if (!t) return t.error();
  const Metrics m = compute_metrics(r.cluster, c.graph, *t);
  c.fits = m.feasible();
  c.analytic = c.judged = m.iteration_time_s;
  c.peak_memory = 0;
  for (const DeviceMetrics& d : m.devices) c.peak_memory = std::max(c.peak_memory, d.peak_memory_bytes);
  return {};
}

Status schedule_and_score(const PlanRequest& r, const ScheduleStrategy& scheduler, Candidate& c) {
  ScheduleRequest req{c.plan.partition,         r.cluster.devices.size(),  c.plan.micro_batches, 1,
                      r.strategy.schedule_text, r.strategy.schedule_source};
  Result<Schedule> sched = scheduler.build(req);
  if (!sched) return sched.error();
  c.plan.schedule = std::move(*sched);
  keep_round_robin_turns(c.plan.schedule, c.plan.partition);
  Result<TaskGraph> g = lower_plan(r, c.plan);
  if (!g) return g.error();
  c.graph = std::move(*g);
  return score(r, c);
}

bool ranks_before(const Candidate& a, const Candidate& b) {
  return (a.fits && !b.fits) || (a.fits == b.fits && a.analytic < b.analytic);
}

Result<size_t> pick(std::vector<Candidate>& all, const std::vector<char>& always, const PlanRequest& r,
                    size_t judged) {
  std::vector<size_t> order(all.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ranks_before(all[a], all[b]); });
  std::vector<size_t> finalists;
  for (size_t k = 0; k < order.size(); ++k)
    if (k < judged || always[order[k]]) finalists.push_back(order[k]);
  if (r.judge)
    for (size_t i : finalists) {
      Result<double> t = r.judge->iteration_time(r.cluster, all[i].graph);
      if (!t) return t.error();
      all[i].judged = *t;
      all[i].was_judged = true;
    }
  // On a tie (neither better) the smaller peak memory wins (1F1B over GPipe: min(p - i, m) micro-batches
  // in flight, not m), then the candidate generated first, not the one whose time rounded lower.
  size_t best = finalists.front();
  for (size_t i : finalists) {
    const bool tie = !better(all[i], all[best]) && !better(all[best], all[i]);
    if (better(all[i], all[best]) || (tie && (all[i].peak_memory < all[best].peak_memory ||
                                              (all[i].peak_memory == all[best].peak_memory && i < best))))
      best = i;
  }
  return best;
}

}  // namespace pipegrid
