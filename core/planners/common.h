// Helpers shared by planners: a candidate plan from a partitioner and a schedule, its analytic
// score, and the choice among candidates (analytic ranking, then the judge on the finalists).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/collectives.h"
#include "core/planner.h"

namespace pipegrid {

inline constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The order the dynamic programmes (dapple, piper) keep partial plans in: the smaller slowest stage
// first, equal within a relative 1e-12, then the smaller sum of stage times. `e` has slowest and sum.
template <class E>
bool better(double slowest, double sum, const E& e) {
  constexpr double eps = 1e-12;
  if (slowest < e.slowest * (1 - eps)) return true;
  return slowest <= e.slowest * (1 + eps) && sum < e.sum * (1 - eps);
}

// A plan being compared: lowered, and timed by the analytic evaluator (and maybe the judge).
struct Candidate {
  Plan plan;
  TaskGraph graph;
  bool fits = false;        // every device within its memory
  double analytic = 0;      // analytic evaluator's iteration time (s)
  double judged = 0;        // the judge's (or the analytic one without a judge)
  bool was_judged = false;  // pick() had the request's judge time it
  double peak_memory = 0;   // the fullest device's peak (bytes): pick() prefers the smaller on a tie
};

// Routes between pairs of network nodes, each computed once (a table of every pair is devices^2
// routes: 19 GB at 16,384 devices). A pair that cannot be routed (the cluster was validated, so never
// in practice) gets an empty Route and its error is kept for the caller to report after its search.
class RouteCache {
 public:
  explicit RouteCache(const Cluster& c) : router_(c) {}
  const Route& operator()(int from, int to);
  // The slowest hop of the ring devices[0] -> devices[1] -> ... -> devices[0] (none below 2 devices),
  // as ring_link_cost (core/collectives.h) but over the cached routes.
  LinkCost ring(const std::vector<int>& devices);
  const std::optional<Error>& error() const { return error_; }

 private:
  Router router_;
  std::unordered_map<uint64_t, Route> cache_;
  std::optional<Error> error_;
};

// Where stage boundaries may fall along a topological order whose layers cost `unit` each (any unit):
// the first position of every block, then unit.size(). One block per layer up to `max_blocks` layers;
// else a block ends where the running cost passes k / max_blocks of the total (by layer count when
// the total is 0), so zero-cost layers join their neighbours.
std::vector<int> cost_blocks(const std::vector<double>& unit, int max_blocks);

// A scored candidate as a TriedPlan (`what` describes it).
TriedPlan tried_plan(const Candidate& c, std::string what);

// Partitions with `partitioner` and schedules with `scheduler` for `mb`. `stages` and `replicas`
// override the strategy's when non-zero (replicas may be kAnyReplicas); with replicas > 1 every
// stage must get that many devices.
Result<Plan> partition_and_schedule(const PlanRequest& r, const PartitionStrategy& partitioner,
                                    const ScheduleStrategy& scheduler, MicroBatching mb, int stages = 0,
                                    int replicas = 0);

// Sets the expert-parallel and expert tensor-parallel sizes of the stages that hold MoE blocks from
// the strategy (etp 0: the tensor-parallel size); fails when ep x etp does not divide a stage's devices.
Status apply_expert_parallel(const PlanRequest& r, Partition& p);

// partition_and_schedule, then lower_plan: a candidate not scored yet.
Result<Candidate> make_candidate(const PlanRequest& r, const PartitionStrategy& partitioner,
                                 const ScheduleStrategy& scheduler, MicroBatching mb, int stages = 0,
                                 int replicas = 0);

// The busiest link of a partition, in seconds per micro-batch of `micro_batch_size` samples: every
// stage edge's activations (forward) and gradients (backward) between the pairs of replicas that
// share samples (as the lowering sends them), routed by `router` as the replay routes them, summed per
// link direction (both directions on a shared link) and divided by the link's bandwidth. Every
// micro-batch crosses that link once forward and once backward, so a pipeline's steady state takes
// at least this long per micro-batch. Fails if two devices that exchange data are not connected.
Result<double> busiest_link_time(const Partition& p, double micro_batch_size, const Cluster& c,
                                 const Router& router);

// bapipe's ranking of a partition of p stages run as `mb`: (m + p - 1) x max(the partition's
// predicted slowest stage, busiest_link_time). Fails as busiest_link_time does.
Result<double> pipeline_estimate(const Partition& part, int p, MicroBatching mb, const Cluster& c,
                                 const Router& router);

// The replica count of the first stage whose replicas would split the plan's micro-batches into
// fractional samples (whole_samples_per_replica fails), or none.
std::optional<int> fractional_split(const Plan& p);

// Times a candidate with the analytic evaluator (sets fits, analytic and judged).
Status score(const PlanRequest& r, Candidate& c);

// Builds the candidate's schedule with `scheduler` (its plan's partition and micro-batches, one chunk),
// lowers the plan (lower_plan) and scores it.
Status schedule_and_score(const PlanRequest& r, const ScheduleStrategy& scheduler, Candidate& c);

// The analytic ranking pick() uses: a candidate that fits memory first, then the shorter analytic time.
bool ranks_before(const Candidate& a, const Candidate& b);

// Ranks scored candidates analytically (those that fit memory first), has the request's judge time
// the best `judged` of them plus those flagged in `always`, and returns the winner's index: fits
// memory first, then the fastest by the judge (the analytic time without one).
Result<size_t> pick(std::vector<Candidate>& all, const std::vector<char>& always, const PlanRequest& r,
                    size_t judged);

}  // namespace pipegrid
