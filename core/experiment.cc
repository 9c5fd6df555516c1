#include "core/experiment.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/backends.h"
#include "core/fold.h"
#include "core/lower.h"
#include "core/validate.h"

namespace pipegrid {

std::vector<std::string> device_names(const Cluster& c) {
  std::vector<std::string> names;
  names.reserve(c.devices.size());
  for (const Device& d : c.devices) names.push_back(d.name);
  return names;
}

namespace {

LoweringOptions lowering_options(const PlanRequest& r, const Plan& p) {
  LoweringOptions lo;
  lo.micro_batches = p.micro_batches;
  lo.micro_batch_size = p.micro_batch_size;
  lo.memory = r.memory;
  lo.allreduce = r.strategy.allreduce;
  lo.tensor_parallel = tensor_parallel_options(r.strategy, r.memory);
  lo.dp_overlap = r.strategy.dp_overlap;
  lo.gradient_reduce_bytes = r.strategy.gradient_reduce_bytes;
  return lo;
}

}  // namespace

Result<TaskGraph> lower_plan(const PlanRequest& r, const Plan& p, bool prove_deadlock_free) {
  const std::vector<std::string> names = device_names(r.cluster);
  if (Status s = validate_schedule(p.schedule, p.partition, p.micro_batches, names); !s) return s.error();
  Result<TaskGraph> g = lower(r.workload, r.cluster, p.partition, p.schedule, lowering_options(r, p));
  if (!g) return g.error();
  // Tasks are not renumbered in execution order any more: with jemalloc as the allocator that cost
  // more than it saved, even at 1,024 devices (docs/speed.md, "Tasks kept in the lowering's order").
  if (!prove_deadlock_free) return g;
  // Deadlock freedom, proved once by a topological pass (core/validate.h); only a graph that fails it
  // is run again symbolically, for the exact message.
  std::vector<int32_t> order = execution_order(*g);
  if (order.size() != g->tasks.size()) {
    Status s = check_deadlock_free(*g, p.schedule, names);
    return s ? Error{"internal error: the task graph does not run to completion"} : s.error();
  }
  return g;
}

namespace {

// Every micro-batch size dividing the mini-batch, or the one given.
std::vector<MicroBatching> micro_batchings(const Experiment& e) {
  std::vector<MicroBatching> out;
  if (e.strategy.mini_batch > 0) {
    for (int b = 1; b <= e.strategy.mini_batch; ++b)
      if (e.strategy.mini_batch % b == 0) out.push_back({static_cast<double>(b), e.strategy.mini_batch / b});
  } else {
    out.push_back({e.micro_batch_size > 0 ? e.micro_batch_size : e.workload.micro_batch_size,
                   e.strategy.micro_batches});
  }
  return out;
}

// The device kind the placement is for: the cluster's, which the catalog must cover (one kind: a
// layer carries measured times for one device kind).
Result<const DeviceSpec*> placement_device(const Cluster& c, const BackendRequest& r) {
  const DeviceSpec* device = nullptr;
  for (const Device& d : c.devices) {
    const bool covered = std::any_of(r.catalog.backends.begin(), r.catalog.backends.end(),
                                     [&](const Backend& b) { return runs_on(b, d.spec.kind); });
    if (!covered) continue;
    if (device && device->kind != d.spec.kind)
      return Error{
          fmt::format("{}: the cluster has devices of kinds \"{}\" and \"{}\" with backends in {}; placement "
                      "supports one device kind per experiment",
                      r.where, device->kind, d.spec.kind, r.catalog_name)};
    device = &d.spec;
  }
  if (!device)
    return Error{
        fmt::format("{}: no backend of {} runs on the cluster's device kinds", r.where, r.catalog_name)};
  return device;
}

}  // namespace

Status place_backends(Experiment& e) {
  if (!e.backends) return {};
  const BackendRequest& r = *e.backends;
  Result<const DeviceSpec*> device = placement_device(e.cluster, r);
  if (!device) return device.error();
  PlacementOptions o;
  // A backend in `use` for another device kind would be dropped without a word: name it.
  for (int b : r.allowed) {
    const Backend& backend = r.catalog.backends[static_cast<size_t>(b)];
    if (!runs_on(backend, (*device)->kind))
      return Error{
          fmt::format("{}: use: backend \"{}\" runs on device kind \"{}\", not on the cluster's \"{}\"",
                      r.where, backend.name, backend.device_kind, (*device)->kind)};
    o.allowed.push_back(b);
  }
  o.batch = e.micro_batch_size > 0 ? e.micro_batch_size : e.workload.micro_batch_size;
  Result<Placement> placed = place(e.workload, r.catalog, **device, o);
  if (!placed) return Error{fmt::format("{}: {}", r.where, placed.error().message)};
  Result<Workload> w = apply_placement(e.workload, *placed, r.catalog, **device, o);
  if (!w) return Error{fmt::format("{}: {}", r.where, w.error().message)};
  e.workload = std::move(*w);
  e.backends.reset();
  return {};
}

std::string strategy_label(const Experiment& e, const PreparedRun& run) {
  if (run.planner == kDefaultPlanner)
    return run.partitioner.empty() ? e.strategy.partitioner : run.partitioner;
  if (run.partitioner.empty() || run.partitioner == run.planner) return run.planner;
  return fmt::format("{} (stages by {})", run.planner, run.partitioner);
}

namespace {

// Whether some stage has context or expert parallelism: group flows other than tensor-parallel ones.
bool other_group_flows(const Partition& p) {
  for (size_t s = 0; s < p.stage_count(); ++s) {
    const Stage& st = p.stage(s);
    if (st.context_parallel > 1 || st.expert_parallel > 1 || st.expert_tensor_parallel > 1) return true;
  }
  return false;
}

// The routes of f (lowered with every fold tried), f lowered again with less folded where they do not
// allow it: tensor-parallel ranks kept apart where their rings share links but the group flows are
// private; replica j's tensor-parallel flows alone copied where context- or expert-parallel flows share
// links (FoldLayout::tensor_only). Where no group flow may be copied, the caller lowers without them.
Result<FoldRoutes> refold(const PlanRequest& r, const PreparedRun& run, const LoweringOptions& lo,
                          FoldedGraph& f) {
  auto again = [&](FoldOptions o) -> Result<FoldRoutes> {
    Result<FoldedGraph> g = lower_folded(r.workload, r.cluster, run.partition, run.schedule, lo, o);
    if (!g) return g.error();
    f = std::move(*g);
    return fold_routes(r.cluster, run.partition, f);
  };
  Result<FoldRoutes> routes = fold_routes(r.cluster, run.partition, f);
  if (routes && f.layout.ranks_folded > 1 && routes->groups_private && !routes->ranks_private)
    routes = again({.groups = true, .ranks = false});
  if (routes && !routes->groups_private && other_group_flows(run.partition))
    routes = again({.groups = true, .ranks = false, .tensor_only = true});
  return routes;
}

// By default, no fold that would replay more than a third of the whole graph (every replica's group
// flows on shared links): where the replicas' group flows meet other traffic unevenly the check
// fails, and its failure costs a second replay. GPT-3 175B's t = 4 search candidates on 1,024 A100s
// fold to 47-50% of their tasks; three of four were not exact (docs/scale.md). Sets run.whole_because.
// `at_least`: counted before lowering, a lower bound.
bool too_much_folded(size_t replayed, size_t whole, PreparedRun& run, bool at_least = false) {
  if (3 * replayed <= whole) return false;
  run.whole_because =
      fmt::format("no replica fold: it would replay {}{} of the {} tasks (--fold tries it anyway)",
                  at_least ? "at least " : "", replayed, whole);
  return true;
}

// The folded lowering of run's plan (prepare's GraphForm), or nothing with run.whole_because saying why;
// an error only for a schedule that does not validate.
Status lower_folded_plan(const PlanRequest& r, PreparedRun& run, GraphForm form) {
  const std::vector<std::string> names = device_names(r.cluster);
  if (Status s = validate_schedule(run.schedule, run.partition, run.micro_batches, names); !s) return s;
  const LoweringOptions lo = lowering_options(r, run);
  const size_t least = form == GraphForm::FoldedIfLarge ? kFoldThresholdTasks : 0;
  Result<FoldedGraph> f = lower_folded(r.workload, r.cluster, run.partition, run.schedule, lo,
                                       {.groups = true, .ranks = true}, least);
  if (!f) {
    run.whole_because = "no replica fold (" + f.error().message + ")";
    return {};
  }
  if (f->graph.tasks.empty()) return {};  // below the threshold: the whole graph, nothing to say
  Result<FoldRoutes> routes = refold(r, run, lo, *f);
  if (!routes) return routes.error();
  if (form == GraphForm::FoldedIfLarge && !routes->unlike.empty()) {
    run.whole_because = "no replica fold: " + routes->unlike + " (--fold tries it anyway)";
    return {};
  }
  if (!routes->groups_private && routes->groups_time_shared && f->layout.ranks_folded > 1 &&
      (form == GraphForm::Folded || !lo.dp_overlap)) {
    // The rank fold needs rings of their own: the replica fold alone, its routes found again.
    Result<FoldedGraph> g =
        lower_folded(r.workload, r.cluster, run.partition, run.schedule, lo,
                     {.groups = true, .ranks = false, .tensor_only = f->layout.tensor_only});
    if (!g) return g.error();
    f = std::move(g);
    routes = fold_routes(r.cluster, run.partition, *f);
    if (!routes) return routes.error();
  }
  // With dp_overlap the reductions start during a backward (the first stage's buckets, an interleaved
  // chunk's at its own last backward) and meet its group flows at any size worth folding: the check
  // would refuse the copy after a wasted replay (264 s instead of 238 s on 18,432 GB300s). Tried only
  // under --fold.
  const bool try_time_shared = routes->groups_time_shared && (form == GraphForm::Folded || !lo.dp_overlap);
  if (!routes->groups_private && try_time_shared) {
    f->layout.time_shared = true;  // copied, their links' other traffic checked after the replay
  } else if (!routes->groups_private) {
    // Replica j's group flows share links, or run on links unlike replica 0's.
    // At least these tasks and every replica's group flows (more where ranks were folded): decline by
    // that count before lowering it, which at 131,040 GPUs cost a minute and 17 GB for nothing.
    if (form == GraphForm::FoldedIfLarge &&
        too_much_folded(f->graph.tasks.size() + f->layout.copied_flows, f->layout.whole_tasks, run, true)) {
      if (routes->groups_time_shared)
        run.whole_because +=
            "; with dp_overlap the gradient reductions share the group flows' links during "
            "the backward";
      return {};
    }
    f = lower_folded(r.workload, r.cluster, run.partition, run.schedule, lo, {.groups = false});
    if (!f) return f.error();
  }
  if (form == GraphForm::FoldedIfLarge && too_much_folded(f->graph.tasks.size(), f->layout.whole_tasks, run))
    return {};
  run.graph = std::move(f->graph);
  run.fold = std::move(f->layout);
  return {};
}

}  // namespace

Result<PreparedRun> prepare(const Experiment& e, const PlanJudge* judge, bool prove_deadlock_free,
                            GraphForm form) {
  if (e.backends) {
    auto placed = std::make_shared<Experiment>(e);
    if (Status s = place_backends(*placed); !s) return s.error();
    Result<PreparedRun> run = prepare(*placed, judge, prove_deadlock_free, form);
    if (run) run->placed_workload = std::shared_ptr<const Workload>(placed, &placed->workload);
    return run;
  }
  if (Status s = validate(e.cluster); !s) return s.error();
  if (Status s = check_acyclic(e.workload); !s) return s.error();
  if (e.strategy.micro_batches < 1)
    return Error{fmt::format("expected at least 1 micro-batch, got {}", e.strategy.micro_batches)};
  Result<const PlannerInfo*> planner = planner_for(e.strategy);
  if (!planner) return planner.error();
  const PlanRequest request{e.workload, e.cluster, e.strategy, e.memory, micro_batchings(e), judge};
  Result<Plan> plan = (*planner)->plan(request);
  if (!plan) return plan.error();
  PreparedRun run;
  static_cast<Plan&>(run) = std::move(*plan);
  run.planner = std::string((*planner)->name);
  if (run.partitioner.empty()) run.partitioner = run.planner;
  if (form != GraphForm::Whole) {
    if (Status s = lower_folded_plan(request, run, form); !s) return s.error();
    if (run.fold) return run;
  }
  Result<TaskGraph> graph = lower_plan(request, run, prove_deadlock_free);
  if (!graph && !run.whole_because.empty() &&  // a plan too large: say why the fold did not spare it
      graph.error().message.find("too large") != std::string::npos)
    return Error{fmt::format("{} ({})", graph.error().message, run.whole_because)};
  if (!graph) return graph.error();
  run.graph = std::move(*graph);
  return run;
}

Status lower_whole(const Experiment& e, PreparedRun& run) {
  const Workload& w = run.placed_workload ? *run.placed_workload : e.workload;
  const PlanRequest request{w, e.cluster, e.strategy, e.memory, micro_batchings(e), nullptr};
  run.graph = TaskGraph{};
  run.fold.reset();
  Result<TaskGraph> graph = lower_plan(request, run, /*prove_deadlock_free=*/false);
  if (!graph) return graph.error();
  run.graph = std::move(*graph);
  return {};
}

}  // namespace pipegrid
