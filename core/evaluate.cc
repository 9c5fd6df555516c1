#include "core/evaluate.h"

#include <optional>
#include <queue>
#include <tuple>

#include "core/executor.h"

namespace pipegrid {
namespace {

class AnalyticLauncher : public TaskLauncher {
 public:
  AnalyticLauncher(const TaskGraph& g, const Router& r) : g_(g), router_(r) {}

  void launch(int32_t t, double now) override {
    const Task& task = g_.tasks[t];
    double duration = task.duration;
    if (!task.is_compute()) {
      Result<Route> route = router_.route(task.device, task.peer);
      if (!route) {
        if (!error_) error_ = route.error();
        return;  // never finishes: the run ends incomplete and the error is reported
      }
      duration = route->transfer_time(task.bytes);
    }
    events_.emplace(now + duration, seq_++, t);
  }

  std::priority_queue<std::tuple<double, uint64_t, int32_t>, std::vector<std::tuple<double, uint64_t, int32_t>>,
                      std::greater<>>
      events_;
  std::optional<Error> error_;

 private:
  const TaskGraph& g_;
  const Router& router_;
  uint64_t seq_ = 0;
};

}  // namespace

Result<Timeline> evaluate(const TaskGraph& g, const Cluster& c) {
  Router router(c);
  AnalyticLauncher l(g, router);
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
