// A training run, not an iteration: failures, checkpoints and restarts over the time to a target, as a
// seeded Monte Carlo on the replayed iteration time, and the closed forms it is checked against
// (docs/goodput.md).
//
// The process (Daly's restart-dump model, FGCS 22, 2006): the run's useful compute W (iterations x the
// healthy iteration time) is cut into segments of τ (the checkpoint interval, whole iterations), each
// followed by a blocking checkpoint write δ. Failures of the job arrive as a Poisson process of rate
// 1/M (M: the job's mean time between failures, the sum of its components' rates). A failure loses
// the segment in progress (its compute and any partial checkpoint) and costs a restart R (detection,
// re-scheduling, re-initialisation, checkpoint load), during which failures can strike too and start
// the restart again. Nothing else is modelled: no degraded iterations between failures, no spare
// capacity, every restart returns the same cluster.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"

namespace pipegrid {

// A class of failing components: `count` of them in the job, each failing `per_day` times a day.
struct FailureClass {
  std::string name;  // "GPU", "node", "network switch or cable", ...
  double per_day = 0;
  double count = 0;
  double rate_per_s() const { return per_day * count / 86400.0; }
};

// The job's mean time between failures: 1 / the sum of its classes' rates (infinity with none).
double job_mtbf_s(const std::vector<FailureClass>& classes);

struct RunModel {
  double work_s = 0;      // W: useful compute to the target (iterations x iteration time)
  double interval_s = 0;  // τ: compute between checkpoints
  double write_s = 0;     // δ: a checkpoint's blocking write
  double restart_s = 0;   // R: from a failure to training again
  double mtbf_s = 0;      // M: the job's mean time between failures (infinity: none)
};

// Daly's expected wall-clock time for one segment of `compute_s` followed by a write: M e^{R/M}
// (e^{(compute + δ)/M} - 1) (exact for the process above); compute + δ without failures.
double daly_segment_time_s(double compute_s, const RunModel& m);
// The expected wall-clock time of the whole run: the full segments and the last, shorter one.
double daly_run_time_s(const RunModel& m);
// Daly's higher-order optimum interval: sqrt(2 δ M) [1 + sqrt(δ / (2M)) / 3 + (δ / (2M)) / 9] - δ for
// δ < 2M, else M; Young's first-order sqrt(2 δ M).
double daly_optimal_interval_s(double write_s, double mtbf_s);
double young_interval_s(double write_s, double mtbf_s);
// The interval that minimises the expected time per unit of work (daly_segment_time_s / τ), searched
// over whole multiples of `step_s` (an iteration), between one step and the whole run.
double best_interval_s(RunModel m, double step_s);

// Kokolis et al.'s first-order expected ETTR (arXiv 2410.21680, as transcribed: docs/goodput.md):
// (1 - (u0 + Δt / 2) / M) / (1 + δ / Δt), with u0 the restart and M = 1 / (N_nodes r_f); half an
// interval of work lost per failure, no failures during restarts. It agrees with Daly's exact form
// to first order in (R + τ) / M.
double first_order_ettr(const RunModel& m);

// Where a run's time went, averaged over the trials (seconds).
struct RunTime {
  double wall_s = 0;
  double compute_s = 0;     // useful: W
  double checkpoint_s = 0;  // completed checkpoint writes
  double rework_s = 0;      // compute and partial writes lost to failures
  double restart_s = 0;     // restarts, including restarts cut short by a failure
  double failures = 0;
};

struct MonteCarlo {
  RunTime mean;
  double wall_sd_s = 0;        // the trials' standard deviation of the wall time
  double wall_ci95_s = 0;      // half-width of the mean's 95% confidence interval (1.96 sd / sqrt(n))
  std::vector<double> wall_s;  // every trial's wall time
  double ettr() const { return mean.wall_s > 0 ? mean.compute_s / mean.wall_s : 0; }
};

// `trials` runs of the process above, seeded: the same seed gives the same answer.
Result<MonteCarlo> simulate_run(const RunModel& m, int trials, uint64_t seed);

}  // namespace pipegrid
