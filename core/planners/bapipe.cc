// bapipe: the BaPipe-style planner. Explores schedules x micro-batch sizes x stage counts x replica
// counts. Every candidate is partitioned (core/partitioners/bapipe.cc) and ranked by the pipeline
// estimate (m + p - 1) x max(slowest stage, busiest link per micro-batch) (busiest_link_time: the
// partition objective leaves transfers out, and a pipeline is never faster per micro-batch than
// the link that carries most of its boundary traffic; the sum of the two was tried instead and was
// no better on the FPGA what-if study: README). The best by that estimate, the uniform baselines
// (equal layer counts, one stage per device, each schedule and micro-batch size: BaPipe's space
// contains them) and the best data-parallel option (one stage on every device: see below) are
// lowered and run by the analytic evaluator; the judge (SimGrid from the CLI) then times the best few and the
// baselines, and the fastest that fits memory is kept.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "core/planners/common.h"

namespace pipegrid {
namespace {

// Free per-stage replica counts are searched up to this many devices (the search grows as D^3 per
// stage count; above it only uniform counts are tried).
constexpr int kFreeReplicasUpTo = 32;

// The most work a search may take, in the steps estimated below: 2^32, 30 to 75 s at the rates
// measured on the 2-core development machine (docs/commands.md, "Hostile input").
constexpr double kMaxSteps = 4294967296.0;  // 2^32

// The planner's state: the schedules explored, the options (partitions ranked by the estimate) and
// the candidates lowered from them.
class BapipePlanner {
 public:
  BapipePlanner(const PlanRequest& r, std::vector<const ScheduleStrategy*> schedules)
      : r_(r),
        schedules_(std::move(schedules)),
        bapipe_(**find_partitioner("bapipe")),
        D_(static_cast<int>(r.cluster.devices.size())),
        n_(static_cast<int>(r.workload.layer_count())) {}

  Status check_size() const;
  void explore();
  Status no_option() const;
  Status evaluate_options();
  Status add_uniform_baselines();
  Result<Plan> choose();
  bool has_options() const { return !options_.empty(); }

 private:
  struct Option {
    const ScheduleStrategy* schedule;
    MicroBatching mb;
    int p, r;  // r: replicas per stage, or kAnyReplicas
    double estimate;
    std::string replicas;  // per stage, as chosen
  };
  static constexpr size_t kAnalytic = 12, kJudged = 4;
  // The best option of every other stage count evaluated too (see evaluate_options).
  static constexpr size_t kOtherStageCounts = 32;

  void explore_partition(const ScheduleStrategy* s, MicroBatching mb, int p, int k, const Router& router);
  Status add(const Option& o, bool always_judged);
  std::vector<char> judged_always() const;

  const PlanRequest& r_;
  const std::vector<const ScheduleStrategy*> schedules_;
  const PartitionStrategy& bapipe_;
  const int D_, n_;
  std::vector<Option> options_;
  double planning_ = 0;
  int tried_ = 0;
  std::optional<Error> last_error_;
  size_t added_ = 0;  // other stage counts evaluated
  std::vector<Candidate> scored_;
  std::vector<char> baseline_;
  std::vector<std::string> labels_;
};

// The work, estimated before any of it: every (schedule, micro-batch size, stage count p, replica
// count) is partitioned. A partition fills a table of layer times (replica counts x devices x
// layers), then bisects (100 rounds) over a programme whose reachable states are p with a fixed
// replica count k (each a bisection over the layers costing k lookups), or p x devices x replica
// counts with free counts. Measured on the 2-core machine: 7 to 17 ns per step (8 devices x
// 10,000 layers: 1.2e7 steps, 0.3 s; 128 x 10,000: 1.8e9, 14 s; 512 x 2,000: 8.9e9, 152 s).
Status BapipePlanner::check_size() const {
  const int D = D_, n = n_;
  double steps = 0;
  const double log_n = std::log2(static_cast<double>(n) + 1) + 1;
  for (int p = 1; p <= std::min(D, n); ++p) {
    for (int k = 1; p * k <= D; ++k) steps += static_cast<double>(D) * n + 100.0 * p * log_n * k;
    if (p < D && D <= kFreeReplicasUpTo) {
      const double counts = D - p + 1;
      steps += counts * D * n + 100.0 * p * D * counts * log_n;
    }
  }
  steps *= static_cast<double>(schedules_.size() * r_.micro_batchings.size());
  if (steps > kMaxSteps)
    return Error{fmt::format(
        "bapipe: the search would take about {:.3g} steps ({} schedules x {} micro-batch sizes x 1..{} "
        "stages x replica counts, over {} layers and {} devices), above the planner's limit of {:.3g} "
        "(2^32, about a minute); use fewer layers, devices or micro-batch sizes",
        steps, schedules_.size(), r_.micro_batchings.size(), std::min(D, n), n, D, kMaxSteps)};
  return {};
}

void BapipePlanner::explore() {
  const Router router(r_.cluster);
  for (const ScheduleStrategy* s : schedules_)
    for (MicroBatching mb : r_.micro_batchings)
      for (int p = 1; p <= std::min(D_, n_); ++p) {
        // Uniform replica counts, then (small clusters) free counts per stage, which also contain
        // the uniform ones but are ranked by the same estimate, so both stay candidates.
        std::vector<int> rs;
        for (int k = 1; p * k <= D_; ++k)
          if (whole_samples_per_replica(mb.size, k)) rs.push_back(k);  // whole samples per replica
        if (p < D_ && D_ <= kFreeReplicasUpTo) rs.push_back(kAnyReplicas);
        for (int k : rs) explore_partition(s, mb, p, k, router);
      }
  std::stable_sort(options_.begin(), options_.end(),
                   [](const Option& a, const Option& b) { return a.estimate < b.estimate; });
}

void BapipePlanner::explore_partition(const ScheduleStrategy* s, MicroBatching mb, int p, int k,
                                      const Router& router) {
  ++tried_;
  const auto t0 = std::chrono::steady_clock::now();
  Result<Partition> part =
      bapipe_.build({r_.workload, r_.cluster, p, mb.size, 1, mb.count, r_.memory, s->name, k});
  planning_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!part) {
    last_error_ = part.error();
    return;
  }
  Result<double> estimate = pipeline_estimate(*part, p, mb, r_.cluster, router);
  if (!estimate) {
    last_error_ = estimate.error();
    return;
  }
  std::string counts;
  for (size_t st = 0; st < part->stage_count(); ++st)
    counts += fmt::format("{}{}", st ? " " : "", part->stage(st).devices.size());
  options_.push_back({s, mb, p, k, *estimate, counts});
}

// Why there is no option: memory is the usual reason; another one (a layer the device cannot cost)
// is named as such.
Status BapipePlanner::no_option() const {
  const bool memory =
      !last_error_ || last_error_->message.find("fits the devices' memory") != std::string::npos;
  if (!memory)
    return Error{
        fmt::format("bapipe: no plan ({} combinations of schedule, micro-batch size, stages and "
                    "replicas tried): {}",
                    tried_, last_error_->message)};
  return Error{
      fmt::format("bapipe: no plan fits the devices' memory ({} combinations of schedule, micro-batch size, "
                  "stages and replicas tried; e.g. {})",
                  tried_, last_error_ ? last_error_->message : "none")};
}

// Lowers an option, runs the analytic evaluator on it and adds it to the candidates.
Status BapipePlanner::add(const Option& o, bool always_judged) {
  Result<Candidate> c = make_candidate(r_, bapipe_, *o.schedule, o.mb, o.p, o.r);
  if (!c) return c.error();
  planning_ += c->plan.planning_seconds;
  if (Status s = score(r_, *c); !s) return s;
  scored_.push_back(std::move(*c));
  baseline_.push_back(always_judged ? 1 : 0);
  const std::string what = o.r == kAnyReplicas
                               ? fmt::format("{}, {}, {} stages, replicas {} (per stage)", o.schedule->name,
                                             micro_batching_text(o.mb), o.p, o.replicas)
                               : fmt::format("{}, {}, {} stages x {} replicas", o.schedule->name,
                                             micro_batching_text(o.mb), o.p, o.r);
  labels_.push_back(always_judged ? fmt::format("data parallelism ({})", what) : what);
  return {};
}

// The best kAnalytic options by the estimate. The pipeline estimate (m + p - 1) x slowest stage
// ignores what a pipeline of replicated stages adds (transfers between unequal replica groups, the
// all-reduces at its end), so the best twelve by it can all be pipelines of a few stage counts that
// are slower in fact. Two guards:
//  - the best option of every other stage count (up to kOtherStageCounts of them, in the order of
//    their best estimates) is evaluated analytically too and competes for the judged places (on the
//    FPGA what-if study's 510 points, 30 gained up to 1.24x and none lost, for 16% more planning;
//    tests/core/bapipe_test.cc checks the guarantee against a re-enumeration of the options);
//  - data parallelism (one stage on every device), which is in BaPipe's space and is what BaPipe is
//    measured against, is always evaluated and judged, as the uniform baselines are. ResNet-50 on
//    16 U280s with 4x the DSPs: twelve pipelines estimated at 26 ms ran 41 ms, and data
//    parallelism, estimated and run at 28 ms, was never evaluated.
Status BapipePlanner::evaluate_options() {
  for (size_t i = 0; i < options_.size() && i < kAnalytic; ++i)
    if (Status st = add(options_[i], false); !st) return st;
  if (options_.size() <= kAnalytic) return {};
  std::vector<char> seen(static_cast<size_t>(std::min(D_, n_)) + 1, 0);
  for (size_t i = 0; i < kAnalytic; ++i) seen[options_[i].p] = 1;
  seen[1] = 1;  // data parallelism: below, as a baseline
  for (size_t i = kAnalytic; i < options_.size() && added_ < kOtherStageCounts; ++i) {
    if (seen[options_[i].p]) continue;
    seen[options_[i].p] = 1;
    ++added_;
    if (Status st = add(options_[i], false); !st) return st;
  }
  auto dp =
      std::find_if(options_.begin() + kAnalytic, options_.end(), [](const Option& o) { return o.p == 1; });
  if (dp != options_.end())
    if (Status st = add(*dp, true); !st) return st;
  return {};
}

// The uniform baselines: equal layer counts, one stage per device, each schedule and micro-batch
// size.
Status BapipePlanner::add_uniform_baselines() {
  const PartitionStrategy& uniform = **find_partitioner("uniform");
  for (const ScheduleStrategy* s : schedules_) {
    for (MicroBatching mb : r_.micro_batchings) {
      Result<Candidate> c = make_candidate(r_, uniform, *s, mb, std::min(D_, n_), 1);
      if (!c) continue;  // the baseline may not exist (e.g. fewer layers than devices): nothing to beat
      if (Status st = score(r_, *c); !st) return st;
      scored_.push_back(std::move(*c));
      baseline_.push_back(1);
      labels_.push_back(fmt::format("uniform + {}, {}", s->name, micro_batching_text(mb)));
    }
  }
  return {};
}

// Judged: the baselines, the best kJudged of all by the analytic evaluator, and the best kJudged of
// the twelve best by the estimate, as before the other stage counts were added: the analytic
// evaluator and SimGrid can disagree, and an extra candidate must not push out a plan SimGrid
// prefers (one did, GNMT-8 on 64 boards: 11,708 -> 11,366 samples/s).
std::vector<char> BapipePlanner::judged_always() const {
  std::vector<char> always = baseline_;
  std::vector<size_t> top(std::min(options_.size(), kAnalytic));
  for (size_t i = 0; i < top.size(); ++i) top[i] = i;
  std::stable_sort(top.begin(), top.end(),
                   [&](size_t a, size_t b) { return ranks_before(scored_[a], scored_[b]); });
  for (size_t k = 0; k < top.size() && k < kJudged; ++k) always[top[k]] = 1;
  return always;
}

Result<Plan> BapipePlanner::choose() {
  Result<size_t> best = pick(scored_, judged_always(), r_, kJudged);
  if (!best) return best.error();
  std::vector<TriedPlan> candidates;
  for (size_t i = 0; i < scored_.size(); ++i) {
    candidates.push_back(tried_plan(scored_[i], baseline_[i] ? "baseline: " + labels_[i] : labels_[i]));
    if (i == *best) candidates.back().outcome = "chosen";
  }
  Candidate& w = scored_[*best];
  w.plan.tried = std::move(candidates);
  std::string names;
  for (const ScheduleStrategy* s : schedules_)
    names += fmt::format("{}{}", names.empty() ? "" : ", ", s->name);
  w.plan.exploration = fmt::format(
      "bapipe explored {} plans (schedules {}; {} micro-batch sizes; 1..{} stages x replicas{}), {} fit "
      "memory; the best {} and the best of {} other stage counts "
      "analytically evaluated with the uniform and data-parallel baselines{}; chosen: {}{} ({} {:.6g} s{})",
      tried_, names, r_.micro_batchings.size(), std::min(D_, n_),
      D_ <= kFreeReplicasUpTo ? ", uniform and per stage" : ", uniform", options_.size(),
      std::min(options_.size(), kAnalytic), added_,
      r_.judge ? fmt::format(", the best {} and the baselines judged by {}", kJudged, r_.judge->name()) : "",
      baseline_[*best] ? "the baseline " : "", labels_[*best], r_.judge ? r_.judge->name() : "analytic",
      w.judged, w.fits ? "" : ", over memory");
  w.plan.planning_seconds = planning_;
  return std::move(w.plan);
}

}  // namespace

Result<Plan> plan_bapipe(const PlanRequest& r) {
  auto given = find_schedule(r.strategy.schedule);
  if (!given) return given.error();
  std::vector<const ScheduleStrategy*> schedules;
  if (r.strategy.schedule_given) {
    schedules.push_back(*given);
  } else {
    for (const char* s : {"gpipe", "1f1b"}) schedules.push_back(*find_schedule(s));
  }
  BapipePlanner planner(r, std::move(schedules));
  if (Status s = planner.check_size(); !s) return s.error();
  planner.explore();
  if (!planner.has_options()) return planner.no_option().error();
  if (Status s = planner.evaluate_options(); !s) return s.error();
  if (Status s = planner.add_uniform_baselines(); !s) return s.error();
  return planner.choose();
}

}  // namespace pipegrid
