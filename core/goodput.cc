#include "core/goodput.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

namespace pipegrid {

double job_mtbf_s(const std::vector<FailureClass>& classes) {
  double rate = 0;
  for (const FailureClass& c : classes) rate += c.rate_per_s();
  return rate > 0 ? 1.0 / rate : std::numeric_limits<double>::infinity();
}

double daly_segment_time_s(double compute_s, const RunModel& m) {
  if (compute_s <= 0) return 0;
  const double busy = compute_s + m.write_s;
  if (!std::isfinite(m.mtbf_s)) return busy;
  // M e^{R/M} (e^{L/M} - 1), with expm1 for precision when L << M.
  return m.mtbf_s * std::exp(m.restart_s / m.mtbf_s) * std::expm1(busy / m.mtbf_s);
}

namespace {

// The run's whole segments and the compute of its last, shorter one (0: none). Work and interval are
// whole iterations' times, so a quotient within 1e-9 of a whole number is that number: rounding put
// it a hair off, and a hair's remainder would be a last segment with a checkpoint write of its own.
std::pair<double, double> split_run(const RunModel& m) {
  const double q = m.work_s / m.interval_s, whole = std::round(q);
  if (std::abs(q - whole) <= 1e-9 * std::max(1.0, q)) return {whole, 0.0};
  const double full = std::floor(q);
  return {full, m.work_s - full * m.interval_s};
}

}  // namespace

double daly_run_time_s(const RunModel& m) {
  const auto [full, rest] = split_run(m);
  return full * daly_segment_time_s(m.interval_s, m) + daly_segment_time_s(rest, m);
}

double first_order_ettr(const RunModel& m) {
  return (1 - (m.restart_s + m.interval_s / 2) / m.mtbf_s) / (1 + m.write_s / m.interval_s);
}

double young_interval_s(double write_s, double mtbf_s) {
  return std::sqrt(2 * write_s * mtbf_s);
}

double daly_optimal_interval_s(double write_s, double mtbf_s) {
  if (write_s >= 2 * mtbf_s) return mtbf_s;
  const double x = write_s / (2 * mtbf_s);
  return young_interval_s(write_s, mtbf_s) * (1 + std::sqrt(x) / 3 + x / 9) - write_s;
}

double best_interval_s(RunModel m, double step_s) {
  // The expected time per unit of work, S(τ) / τ, is unimodal in τ (the checkpoints' cost against
  // the rework's): a ternary search over the number of steps, then the neighbours. (The whole run's
  // time adds a last, shorter segment whose sawtooth in τ would make the search wander for nothing.)
  auto cost_at = [&](double steps) { return daly_segment_time_s(steps * step_s, m) / (steps * step_s); };
  double lo = 1, hi = std::max(1.0, std::ceil(m.work_s / step_s));
  // At most ~100 rounds below 2^53 steps (a third off each); the bound keeps counts past 2^53, where
  // the thirds stop moving, from looping.
  for (int round = 0; round < 200 && hi - lo > 2; ++round) {
    const double a = std::floor(lo + (hi - lo) / 3), b = std::ceil(hi - (hi - lo) / 3);
    if (cost_at(a) <= cost_at(b))
      hi = b;
    else
      lo = a;
  }
  double best = lo;
  for (int k = 1; k <= 2 && lo + k <= hi; ++k)
    if (cost_at(lo + k) < cost_at(best)) best = lo + k;
  if (cost_at(hi) < cost_at(best)) best = hi;
  return best * step_s;
}

namespace {

// One segment of `compute` and its write, restarted after each failure until it completes.
void run_segment(double compute, const RunModel& m, std::mt19937_64& rng, RunTime& t) {
  std::exponential_distribution<double> failure(std::isfinite(m.mtbf_s) ? 1.0 / m.mtbf_s : 1.0);
  const bool fails = std::isfinite(m.mtbf_s);
  const double busy = compute + m.write_s;
  while (true) {
    const double f = fails ? failure(rng) : std::numeric_limits<double>::infinity();
    if (f >= busy) {
      t.wall_s += busy;
      t.compute_s += compute;
      t.checkpoint_s += m.write_s;
      return;
    }
    t.wall_s += f;
    t.rework_s += f;
    t.failures += 1;
    while (true) {  // the restart, itself cut short by failures
      const double g = failure(rng);
      if (g >= m.restart_s) {
        t.wall_s += m.restart_s;
        t.restart_s += m.restart_s;
        break;
      }
      t.wall_s += g;
      t.restart_s += g;
      t.failures += 1;
    }
  }
}

}  // namespace

constexpr double kMaxTrials = 1e7;

Result<MonteCarlo> simulate_run(const RunModel& m, int trials, uint64_t seed) {
  if (trials < 1) return Error{fmt::format("trials: expected at least 1, got {}", trials)};
  if (!(m.work_s > 0) || !(m.interval_s > 0) || m.write_s < 0 || m.restart_s < 0 || !(m.mtbf_s > 0))
    return Error{
        "a run needs work, an interval and a mean time between failures above 0, and writes and "
        "restarts of at least 0"};
  // Expected segments and failures per trial: refuse a run whose trials would not end in reasonable time.
  const auto [full, rest] = split_run(m);
  const double segments = full + (rest > 0);
  const double per_segment =
      std::isfinite(m.mtbf_s) ? std::expm1((m.interval_s + m.write_s + m.restart_s) / m.mtbf_s) : 0;
  if (std::isfinite(m.mtbf_s) && m.restart_s > 20 * m.mtbf_s)
    return Error{fmt::format(
        "a restart of {:g} s is {:.3g} times the mean time between failures ({:g} s): one completes about "
        "once "
        "in e^{:.3g} tries, and the run never ends in practice; expected a restart shorter than a few MTBFs",
        m.restart_s, m.restart_s / m.mtbf_s, m.mtbf_s, m.restart_s / m.mtbf_s)};
  if (trials > kMaxTrials)
    return Error{
        fmt::format("trials: expected at most {:g} (each trial's time is kept for the percentiles), got {}",
                    kMaxTrials, trials)};
  if (segments * (1 + per_segment) * trials > 2e9)
    return Error{fmt::format(
        "the Monte Carlo would draw about {:.3g} events ({} trials x {:.3g} segments, {:.3g} failures each): "
        "use a longer checkpoint interval or fewer trials",
        segments * (1 + per_segment) * trials, trials, segments, per_segment)};
  std::mt19937_64 rng(seed);
  MonteCarlo mc;
  mc.wall_s.reserve(static_cast<size_t>(trials));
  for (int i = 0; i < trials; ++i) {
    RunTime t;
    for (double s = 0; s < full; ++s) run_segment(m.interval_s, m, rng, t);
    if (rest > 0) run_segment(rest, m, rng, t);
    mc.wall_s.push_back(t.wall_s);
    mc.mean.wall_s += t.wall_s / trials;
    mc.mean.compute_s += t.compute_s / trials;
    mc.mean.checkpoint_s += t.checkpoint_s / trials;
    mc.mean.rework_s += t.rework_s / trials;
    mc.mean.restart_s += t.restart_s / trials;
    mc.mean.failures += t.failures / trials;
  }
  double ss = 0;
  for (double w : mc.wall_s) ss += (w - mc.mean.wall_s) * (w - mc.mean.wall_s);
  // Trials alike (no failure drawn) have no spread; the mean's rounding would give one of 1e-17 s.
  const auto [lo, hi] = std::minmax_element(mc.wall_s.begin(), mc.wall_s.end());
  mc.wall_sd_s = trials > 1 && *lo != *hi ? std::sqrt(ss / (trials - 1)) : 0;
  mc.wall_ci95_s = 1.96 * mc.wall_sd_s / std::sqrt(static_cast<double>(trials));
  return mc;
}

}  // namespace pipegrid
