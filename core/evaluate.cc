#include "core/evaluate.h"

#include <algorithm>
#include <optional>
#include <queue>
#include <tuple>
#include <unordered_map>

#include "core/executor.h"

namespace pipegrid {
namespace {

class AnalyticLauncher : public TaskLauncher {
 public:
  AnalyticLauncher(const TaskGraph& g, const Cluster& c, const Router& r)
      : g_(g), cluster_(c), router_(r), free_at_(2 * c.links.size(), 0.0) {}

  void launch(int32_t t, double now) override {
    const Task& task = g_.tasks[t];
    double duration = task.duration;
    if (!task.is_compute()) {
      // Routes by (device, peer), kept for the run: the router rebuilds formula routes (fat-trees,
      // tori) at every call, and a graph sends over few pairs many times.
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(task.device)) << 32) |
                           static_cast<uint32_t>(task.peer);
      auto known = routes_.find(key);
      if (known == routes_.end()) {
        Result<Route> r = router_.route(task.device, task.peer);
        if (!r) {
          if (!error_) error_ = r.error();
          return;  // never finishes: the run ends incomplete and the error is reported
        }
        known = routes_.emplace(key, std::move(*r)).first;
      }
      const Route* route = &known->second;
      // Links are FIFO resources: a transfer starts when every hop of its route is free (in launch
      // order), after a collective engine's costs (its duration), and holds each hop for bytes / the
      // route's bandwidth (the engine's rate where lower: Cluster::engine_rate); the latency is pipelined.
      double start = now + task.duration;
      for (const Hop& h : route->hops) start = std::max(start, free_at_[channel(h)]);
      const double bandwidth = std::min(
          route->bandwidth, cluster_.engine_rate(task.device, task.peer, is_collective(task.transfer)));
      const double hold = route->hops.empty() ? 0.0 : task.bytes / bandwidth;
      for (const Hop& h : route->hops) free_at_[channel(h)] = start + hold;
      duration = start - now + (route->hops.empty() ? 0.0 : route->latency + hold);
    }
    events_.emplace(now + duration, seq_++, t);
  }

  std::priority_queue<std::tuple<double, uint64_t, int32_t>,
                      std::vector<std::tuple<double, uint64_t, int32_t>>, std::greater<>>
      events_;
  std::optional<Error> error_;

 private:
  size_t channel(const Hop& h) const { return link_channel(cluster_, h); }

  const TaskGraph& g_;
  const Cluster& cluster_;
  const Router& router_;
  std::vector<double> free_at_;  // per channel: when its last transfer stops sending
  std::unordered_map<uint64_t, Route> routes_;
  uint64_t seq_ = 0;
};

}  // namespace

Result<Timeline> evaluate(const TaskGraph& g, const Cluster& c) {
  Router router(c);
  return evaluate(g, c, router);
}

Result<Timeline> evaluate(const TaskGraph& g, const Cluster& c, const Router& router) {
  AnalyticLauncher l(g, c, router);
  Executor ex(g, l);
  ex.start();
  while (!l.events_.empty()) {
    auto [end, seq, t] = l.events_.top();
    l.events_.pop();
    ex.finished(t, end);
  }
  if (l.error_) return *l.error_;
  if (!ex.complete()) {
    std::vector<std::string> names;
    for (const Device& d : c.devices) names.push_back(d.name);
    return ex.stuck_error(names);
  }
  return ex.take_timeline();
}

}  // namespace pipegrid
