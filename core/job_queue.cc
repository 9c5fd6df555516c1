#include "core/job_queue.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <numeric>

namespace pipegrid {
namespace {

struct Active {
  int job;
  std::vector<int> devices;
  double remaining;  // iterations
  double rate = 0;   // iterations per second in the current set
};

class QueueRun {
 public:
  QueueRun(const Cluster& c, std::span<const QueuedJob> jobs, JobPlacement placement, uint64_t seed,
           const SetIterationTimes& times)
      : c_(c),
        jobs_(jobs),
        placement_(placement),
        seed_(seed),
        times_(times),
        taken_(c.devices.size(), false) {
    out_.jobs.resize(jobs.size());
    order_.resize(jobs.size());
    std::iota(order_.begin(), order_.end(), 0);
    std::stable_sort(order_.begin(), order_.end(),
                     [&](int a, int b) { return jobs_[a].arrival_s < jobs_[b].arrival_s; });
  }

  Result<QueueOutcome> run() {
    for (size_t j = 0; j < jobs_.size(); ++j)
      if (jobs_[j].devices < 1 || static_cast<size_t>(jobs_[j].devices) > c_.devices.size())
        return Error{fmt::format("job {} needs {} devices, cluster {} has {}", j, jobs_[j].devices, c_.name,
                                 c_.devices.size())};
    double now = 0, held = 0;
    size_t next = 0, done = 0;
    while (done < jobs_.size()) {
      while (next < order_.size() && jobs_[order_[next]].arrival_s <= now) waiting_.push_back(order_[next++]);
      if (Status s = start_waiting(now); !s) return s.error();
      const double arrival = next < order_.size() ? jobs_[order_[next]].arrival_s : kNever;
      double end = kNever;
      for (const Active& a : running_) end = std::min(end, now + a.remaining / a.rate);
      const double then = std::min(arrival, end);
      if (then == kNever)
        return Error{fmt::format("job {} finds no devices by placement {} on the free cluster",
                                 waiting_.front(), to_string(placement_))};
      for (Active& a : running_) {
        // A job whose end is `then` ends there exactly: subtracting rounds, and far from 0 s what is
        // left can be a step that no longer moves `now` (a queue at 1e7 s looped for ever).
        a.remaining = now + a.remaining / a.rate <= then ? 0 : a.remaining - (then - now) * a.rate;
        held += (then - now) * static_cast<double>(a.devices.size());
      }
      now = then;
      done += finish(now);
    }
    out_.makespan_s = now;
    out_.utilisation = now > 0 ? held / (now * static_cast<double>(c_.devices.size())) : 0;
    return std::move(out_);
  }

 private:
  static constexpr double kNever = std::numeric_limits<double>::infinity();

  // Starts the waiting jobs in arrival order while the first of them finds devices; replays the new
  // set when one started.
  Status start_waiting(double now) {
    bool started = false;
    while (!waiting_.empty()) {
      const int j = waiting_.front();
      Result<std::vector<int>> d =
          place_job(c_, taken_, jobs_[j].devices, placement_, seed_ + static_cast<uint64_t>(j));
      if (!d) break;
      for (int x : *d) taken_[x] = true;
      out_.jobs[j].start_s = now;
      out_.jobs[j].devices = *d;
      running_.push_back({j, std::move(*d), jobs_[j].iterations});
      waiting_.pop_front();
      started = true;
    }
    return started || changed_ ? replay_set() : Status{};
  }

  Status replay_set() {
    changed_ = false;
    if (running_.empty()) return {};
    std::vector<RunningJob> set;
    for (const Active& a : running_) set.push_back({a.job, a.devices});
    Result<std::vector<double>> t = times_(set);
    if (!t) return t.error();
    if (t->size() != running_.size())
      return Error{"internal error: one iteration time per running job expected"};
    for (size_t i = 0; i < running_.size(); ++i) {
      if (!((*t)[i] > 0))
        return Error{fmt::format("job {}: an iteration time of {} s", running_[i].job, (*t)[i])};
      running_[i].rate = 1 / (*t)[i];
    }
    ++out_.sets;
    return {};
  }

  // Ends the jobs with no iterations left (to a relative 1e-9 of their length); returns how many.
  size_t finish(double now) {
    size_t n = 0;
    for (size_t i = 0; i < running_.size();) {
      Active& a = running_[i];
      if (a.remaining > 1e-9 * jobs_[a.job].iterations) {
        ++i;
        continue;
      }
      out_.jobs[a.job].end_s = now;
      for (int d : a.devices) taken_[d] = false;
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      changed_ = true;
      ++n;
    }
    return n;
  }

  const Cluster& c_;
  std::span<const QueuedJob> jobs_;
  JobPlacement placement_;
  uint64_t seed_;
  const SetIterationTimes& times_;
  std::vector<bool> taken_;
  std::vector<int> order_;  // jobs by arrival
  std::deque<int> waiting_;
  std::vector<Active> running_;
  bool changed_ = false;  // a job finished: the set is replayed again
  QueueOutcome out_;
};

}  // namespace

Result<QueueOutcome> run_queue(const Cluster& c, std::span<const QueuedJob> jobs, JobPlacement placement,
                               uint64_t seed, const SetIterationTimes& times) {
  return QueueRun(c, jobs, placement, seed, times).run();
}

}  // namespace pipegrid
