#include "core/experiment.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/evaluate.h"
#include "core/lower.h"
#include "core/metrics.h"
#include "core/strategy.h"
#include "core/validate.h"

namespace pipegrid {

std::vector<std::string> device_names(const Cluster& c) {
  std::vector<std::string> names;
  names.reserve(c.devices.size());
  for (const Device& d : c.devices) names.push_back(d.name);
  return names;
}

namespace {

// One (micro-batch size, micro-batch count): partition, schedule, validate, lower, deadlock check.
// `stages` and `replicas` override the strategy's when non-zero (bapipe's exploration; replicas may
// be kAnyReplicas).
Result<PreparedRun> prepare_one(const Experiment& e, const PartitionStrategy& partitioner,
                                const ScheduleStrategy& scheduler, double micro_batch_size, int m,
                                int stages = 0, int replicas = 0) {
  PreparedRun run{};
  run.micro_batch_size = micro_batch_size;
  run.micro_batches = m;
  run.schedule_name = std::string(scheduler.name);
  const int chunks = std::max(1, e.strategy.chunks);
  if (stages <= 0) stages = e.strategy.stages;
  if (replicas == 0) replicas = std::max(1, e.strategy.replicas);  // kAnyReplicas passes through
  if (stages == 0)
    stages = static_cast<int>(
        std::min(e.cluster.devices.size() / std::max(1, replicas), e.workload.layer_count() / chunks));
  const auto t0 = std::chrono::steady_clock::now();
  Result<Partition> part = partitioner.build({e.workload, e.cluster, stages, run.micro_batch_size, chunks, m,
                                              e.memory, scheduler.name, replicas, e.strategy.planner});
  run.planning_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!part) return part.error();
  run.partition = std::move(*part);
  if (replicas > 1)
    for (size_t st = 0; st < run.partition.stage_count(); ++st)
      if (run.partition.stage(st).devices.size() != static_cast<size_t>(replicas))
        return Error{
            fmt::format("partitioner {} does not place {} replicas per stage (stage {} has {} devices)",
                        partitioner.name, replicas, st, run.partition.stage(st).devices.size())};

  ScheduleRequest req{run.partition, e.cluster.devices.size(), m,
                      chunks,        e.strategy.schedule_text, e.strategy.schedule_source};
  Result<Schedule> sched = scheduler.build(req);
  if (!sched) return sched.error();
  run.schedule = std::move(*sched);

  const std::vector<std::string> names = device_names(e.cluster);
  if (Status s = validate_schedule(run.schedule, run.partition, m, names); !s) return s.error();
  LoweringOptions lo;
  lo.micro_batches = m;
  lo.micro_batch_size = run.micro_batch_size;
  lo.memory = e.memory;
  lo.allreduce = e.strategy.allreduce;
  Result<TaskGraph> g = lower(e.workload, e.cluster, run.partition, run.schedule, lo);
  if (!g) return g.error();
  run.graph = std::move(*g);
  if (Status s = check_deadlock_free(run.graph, run.schedule, names); !s) return s.error();
  return run;
}

// (micro-batch size, count) pairs to try: every size dividing the mini-batch, or the one given.
std::vector<std::pair<double, int>> micro_batch_options(const Experiment& e) {
  std::vector<std::pair<double, int>> out;
  if (e.strategy.mini_batch > 0) {
    for (int b = 1; b <= e.strategy.mini_batch; ++b)
      if (e.strategy.mini_batch % b == 0) out.emplace_back(b, e.strategy.mini_batch / b);
  } else {
    out.emplace_back(e.micro_batch_size > 0 ? e.micro_batch_size : e.workload.micro_batch_size,
                     e.strategy.micro_batches);
  }
  return out;
}

struct Scored {
  PreparedRun run;
  bool fits = false;
  double analytic = 0;  // analytic evaluator's iteration time
  double judged = 0;    // the judge's (or the analytic one without a judge)
};

Result<Scored> score(const Experiment& e, PreparedRun run) {
  Result<Timeline> t = evaluate(run.graph, e.cluster);
  if (!t) return t.error();
  const Metrics m = compute_metrics(e.cluster, run.graph, *t);
  return Scored{std::move(run), m.feasible(), m.iteration_time_s, m.iteration_time_s};
}

bool better(const Scored& a, const Scored& b) {
  return (a.fits && !b.fits) || (a.fits == b.fits && a.judged < b.judged);
}

// Ranks scored candidates analytically, has the judge time the best `judged` of them plus those
// flagged `always`, and returns the winner's index.
Result<size_t> pick(std::vector<Scored>& all, const std::vector<char>& always, const Experiment& e,
                    const PlanJudge* judge, size_t judged) {
  std::vector<size_t> order(all.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return (all[a].fits && !all[b].fits) || (all[a].fits == all[b].fits && all[a].analytic < all[b].analytic);
  });
  std::vector<size_t> finalists;
  for (size_t k = 0; k < order.size(); ++k)
    if (k < judged || always[order[k]]) finalists.push_back(order[k]);
  if (judge)
    for (size_t i : finalists) {
      Result<double> t = judge->iteration_time(e.cluster, all[i].run.graph);
      if (!t) return t.error();
      all[i].judged = *t;
    }
  size_t best = finalists.front();
  for (size_t i : finalists)
    if (better(all[i], all[best])) best = i;
  return best;
}

// BaPipe-style exploration: schedules x micro-batch sizes x stage counts x replica counts. Every
// candidate is partitioned (core/partitioners/bapipe.cc) and ranked by the pipeline estimate
// (m + p - 1) x slowest stage; the best by that estimate and the uniform baselines (equal layer
// counts, one stage per device, each schedule and micro-batch size: BaPipe's space contains them)
// are lowered and run by the analytic evaluator; the judge (SimGrid from the CLI) then times the
// best few and the baselines, and the fastest that fits memory is kept.
// Free per-stage replica counts are searched up to this many devices (the search grows as D^3 per
// stage count; above it only uniform counts are tried).
constexpr int kFreeReplicasUpTo = 32;

Result<PreparedRun> explore_bapipe(const Experiment& e, const PartitionStrategy& bapipe,
                                   const PlanJudge* judge) {
  std::vector<const ScheduleStrategy*> schedules;
  if (e.strategy.schedule_given) {
    schedules.push_back(*find_schedule(e.strategy.schedule));
  } else {
    for (const char* s : {"gpipe", "1f1b"}) schedules.push_back(*find_schedule(s));
  }
  struct Candidate {
    const ScheduleStrategy* schedule;
    double b;
    int m, p, r;  // r: replicas per stage, or kAnyReplicas
    double estimate;
    std::string replicas;  // per stage, as chosen
  };
  std::vector<Candidate> candidates;
  const int D = static_cast<int>(e.cluster.devices.size());
  const int n = static_cast<int>(e.workload.layer_count());
  double planning = 0;
  int tried = 0;
  std::optional<Error> last_error;
  for (const ScheduleStrategy* s : schedules) {
    for (auto [b, m] : micro_batch_options(e)) {
      for (int p = 1; p <= std::min(D, n); ++p) {
        // Uniform replica counts r, then (small clusters) free counts per stage, which also
        // contain the uniform ones but are ranked by the same estimate, so both stay candidates.
        std::vector<int> rs;
        for (int r = 1; p * r <= D; ++r) rs.push_back(r);
        if (p < D && D <= kFreeReplicasUpTo) rs.push_back(kAnyReplicas);
        for (int r : rs) {
          ++tried;
          const auto t0 = std::chrono::steady_clock::now();
          Result<Partition> part = bapipe.build({e.workload, e.cluster, p, b, 1, m, e.memory, s->name, r});
          planning += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (!part) {
            last_error = part.error();
            continue;
          }
          std::string counts;
          for (size_t st = 0; st < part->stage_count(); ++st)
            counts += fmt::format("{}{}", st ? " " : "", part->stage(st).devices.size());
          candidates.push_back({s, b, m, p, r, (m + p - 1) * part->plan.predicted_time_per_stage_s, counts});
        }
      }
    }
  }
  if (candidates.empty())
    return Error{fmt::format(
        "bapipe: no plan fits the devices' memory ({} combinations of schedule, micro-batch size, "
        "stages and replicas tried; e.g. {})",
        tried, last_error ? last_error->message : "none")};
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.estimate < b.estimate; });
  constexpr size_t kAnalytic = 12, kJudged = 4;
  std::vector<Scored> scored;
  std::vector<char> baseline;
  std::vector<std::string> labels;
  for (size_t i = 0; i < candidates.size() && i < kAnalytic; ++i) {
    const Candidate& c = candidates[i];
    Result<PreparedRun> run = prepare_one(e, bapipe, *c.schedule, c.b, c.m, c.p, c.r);
    if (!run) return run.error();
    planning += run->planning_seconds;
    Result<Scored> s = score(e, std::move(*run));
    if (!s) return s.error();
    scored.push_back(std::move(*s));
    baseline.push_back(0);
    labels.push_back(c.r == kAnyReplicas
                         ? fmt::format("{}, {} micro-batches of {}, {} stages, replicas {} (per stage)",
                                       c.schedule->name, c.m, c.b, c.p, c.replicas)
                         : fmt::format("{}, {} micro-batches of {}, {} stages x {} replicas",
                                       c.schedule->name, c.m, c.b, c.p, c.r));
  }
  const PartitionStrategy& uniform = **find_partitioner("uniform");
  for (const ScheduleStrategy* s : schedules) {
    for (auto [b, m] : micro_batch_options(e)) {
      Result<PreparedRun> run = prepare_one(e, uniform, *s, b, m, std::min(D, n), 1);
      if (!run) continue;  // the baseline may not exist (e.g. fewer layers than devices): nothing to beat
      Result<Scored> sc = score(e, std::move(*run));
      if (!sc) return sc.error();
      scored.push_back(std::move(*sc));
      baseline.push_back(1);
      labels.push_back(fmt::format("uniform + {}, {} micro-batches of {}", s->name, m, b));
    }
  }
  Result<size_t> best = pick(scored, baseline, e, judge, kJudged);
  if (!best) return best.error();
  Scored& w = scored[*best];
  std::string names;
  for (const ScheduleStrategy* s : schedules)
    names += fmt::format("{}{}", names.empty() ? "" : ", ", s->name);
  w.run.sweep = fmt::format(
      "bapipe explored {} plans (schedules {}; {} micro-batch sizes; 1..{} stages x replicas{}), {} fit "
      "memory; {} "
      "analytically evaluated with the uniform baselines{}; chosen: {}{} ({} {:.6g} s{})",
      tried, names, micro_batch_options(e).size(), std::min(D, n),
      D <= kFreeReplicasUpTo ? ", uniform and per stage" : ", uniform", candidates.size(),
      std::min(candidates.size(), kAnalytic),
      judge ? fmt::format(", the best {} and the baselines judged by {}", kJudged, judge->name()) : "",
      baseline[*best] ? "the baseline " : "", labels[*best], judge ? judge->name() : "analytic", w.judged,
      w.fits ? "" : ", over memory");
  w.run.planning_seconds = planning;
  return std::move(w.run);
}

}  // namespace

Result<PreparedRun> prepare(const Experiment& e, const PlanJudge* judge) {
  if (Status s = validate(e.cluster); !s) return s.error();
  if (Status s = check_acyclic(e.workload); !s) return s.error();
  if (e.strategy.micro_batches < 1)
    return Error{fmt::format("expected at least 1 micro-batch, got {}", e.strategy.micro_batches)};
  auto partitioner = find_partitioner(e.strategy.partitioner);
  if (!partitioner) return partitioner.error();
  auto scheduler = find_schedule(e.strategy.schedule);
  if (!scheduler) return scheduler.error();
  if ((*partitioner)->name == "bapipe") return explore_bapipe(e, **partitioner, judge);
  if (e.strategy.mini_batch <= 0) {
    const double b = e.micro_batch_size > 0 ? e.micro_batch_size : e.workload.micro_batch_size;
    return prepare_one(e, **partitioner, **scheduler, b, e.strategy.micro_batches);
  }
  // Every micro-batch size dividing the mini-batch: ranked by the analytic evaluator, the best
  // few judged again; plans that fit memory first.
  std::vector<Scored> scored;
  std::optional<Error> first_error;
  std::string sweep;
  double planning = 0;
  for (auto [b, m] : micro_batch_options(e)) {
    Result<PreparedRun> run = prepare_one(e, **partitioner, **scheduler, b, m);
    if (!run) {
      if (!first_error) first_error = Error{fmt::format("micro-batch size {}: {}", b, run.error().message)};
      sweep += fmt::format("{}{}: no plan", sweep.empty() ? "" : "; ", b);
      continue;
    }
    planning += run->planning_seconds;
    Result<Scored> s = score(e, std::move(*run));
    if (!s) return s.error();
    sweep += fmt::format("{}{}: {:.6g} s{}", sweep.empty() ? "" : "; ", b, s->analytic,
                         s->fits ? "" : " (over memory)");
    scored.push_back(std::move(*s));
  }
  if (scored.empty()) return *first_error;
  Result<size_t> best = pick(scored, std::vector<char>(scored.size(), 0), e, judge, 3);
  if (!best) return best.error();
  PreparedRun run = std::move(scored[*best].run);
  run.sweep = fmt::format("micro-batch sizes tried (analytic iteration time): {}{}", sweep,
                          judge ? fmt::format("; the best 3 judged by {}", judge->name()) : "");
  run.planning_seconds = planning;
  return run;
}

}  // namespace pipegrid
