#include "core/executor.h"

#include <fmt/format.h>

#include "core/schedule.h"

namespace pipegrid {

double Timeline::makespan() const {
  double m = 0;
  for (double e : end) m = std::max(m, e);
  return m;
}

std::string describe_task(const Task& t, const std::vector<std::string>& names) {
  auto name = [&](int d) {
    return d >= 0 && static_cast<size_t>(d) < names.size() ? names[d] : fmt::format("device{}", d);
  };
  switch (t.kind) {
    case TaskKind::Forward:
    case TaskKind::Backward:
    case TaskKind::Weight: {
      Pass p = t.kind == TaskKind::Forward    ? Pass::Forward
               : t.kind == TaskKind::Backward ? Pass::Backward
                                              : Pass::Weight;
      return fmt::format("{} on {}", to_string(Action{t.stage, p, t.micro_batch}), name(t.device));
    }
    case TaskKind::Optimizer:
      return fmt::format("optimizer step on {}", name(t.device));
    case TaskKind::Transfer:
      switch (t.transfer) {
        case TransferKind::Activation:
          return fmt::format("activation {}->{} of micro-batch {}, {}->{}", t.stage, t.peer_stage,
                             t.micro_batch, name(t.device), name(t.peer));
        case TransferKind::Gradient:
          return fmt::format("gradient {}->{} of micro-batch {}, {}->{}", t.stage, t.peer_stage,
                             t.micro_batch, name(t.device), name(t.peer));
        case TransferKind::TensorParallel:
        case TransferKind::ExpertParallel:
        case TransferKind::ContextParallel:
          return fmt::format("{} collective of stage {}, micro-batch {}, {}->{}", to_string(t.transfer),
                             t.stage, t.micro_batch, name(t.device), name(t.peer));
        default:
          return fmt::format("all-reduce step of stage {}, {}->{}", t.stage, name(t.device), name(t.peer));
      }
  }
  return "?";
}

Executor::Executor(const TaskGraph& graph, TaskLauncher& launcher) : graph_(graph), launcher_(launcher) {
  const size_t n = graph.tasks.size();
  reserve_huge(node_, n);
  for (size_t t = 0; t < n; ++t) {
    const std::span<const int32_t> next = graph.successors(static_cast<int32_t>(t));
    node_.push_back({graph.predecessor_count[t], graph.tasks[t].is_compute() ? graph.tasks[t].device : -1,
                     next.size() == 1 ? next[0] : -1});
  }
  devices_.reserve(graph.device_order.size());
  for (const std::vector<int32_t>& order : graph.device_order) {
    const auto size = static_cast<uint32_t>(order.size());
    devices_.push_back({order.data(), size, 0, size > 0 ? order[0] : -1, size > 1 ? order[1] : -1, false});
  }
  assign_huge(timeline_.start, graph.tasks.size(), -1.0);
  assign_huge(timeline_.end, graph.tasks.size(), -1.0);
}

void Executor::start() {
  for (size_t t = 0; t < graph_.tasks.size(); ++t)
    if (node_[t].device < 0 && node_[t].pending == 0) launch(static_cast<int32_t>(t), 0.0);
  for (size_t d = 0; d < graph_.device_order.size(); ++d) try_device(static_cast<int>(d), 0.0);
  drain();
}

void Executor::launch(int32_t t, double now) {
  timeline_.start[t] = now;
  const Task& task = graph_.tasks[t];
  const bool instant = task.is_compute() ? task.duration <= 0 : task.device == task.peer;
  if (instant)
    instant_.emplace_back(t, now);
  else
    launcher_.launch(t, now);
}

void Executor::try_device(int d, double now) {
  DeviceState& dev = devices_[d];
  const int32_t t = dev.next;
  if (dev.busy || t < 0 || node_[t].pending != 0) return;
  dev.busy = true;
  // The device's next task runs after this one: ask for its lines now. With a device's tasks in one
  // stretch of each array, a pipeline of p devices reads p places far apart, and at p = 1,024
  // they no longer stay in the cache between two tasks of a device (docs/speed.md, "Design choices,
  // measured").
  if (const int32_t n = dev.after; n >= 0) {
    __builtin_prefetch(&node_[n], 1, 1);
    __builtin_prefetch(&graph_.tasks[n], 0, 1);
    __builtin_prefetch(&timeline_.start[n], 1, 1);
    __builtin_prefetch(&timeline_.end[n], 1, 1);
  }
  launch(t, now);
}

void Executor::advance(DeviceState& dev) {
  ++dev.cursor;
  dev.next = dev.after;
  dev.after = dev.cursor + 1 < dev.size ? dev.order[dev.cursor + 1] : -1;
  if (dev.cursor + 2 < dev.size)
    __builtin_prefetch(dev.order + dev.cursor + 2, 0, 1);  // the next step's read
}

void Executor::finished(int32_t t, double end) {
  instant_.emplace_back(t, end);
  drain();
}

void Executor::drain() {
  while (!instant_.empty()) {
    // Not a structured binding: clang 14 (the fuzzing build) cannot capture one in the lambda below.
    const int32_t t = instant_.back().first;
    const double end = instant_.back().second;
    instant_.pop_back();
    timeline_.end[t] = end;
    ++done_;
    auto release = [&](int32_t s) {
      Node& next = node_[s];
      if (--next.pending != 0) return;
      if (next.device >= 0)
        try_device(next.device, end);
      else
        launch(s, end);
    };
    if (const int32_t s = node_[t].single; s >= 0)
      release(s);
    else
      for (int32_t s : graph_.successors(t)) release(s);
    if (const int d = node_[t].device; d >= 0) {
      devices_[d].busy = false;
      advance(devices_[d]);
      try_device(d, end);
    }
  }
}

std::vector<std::pair<int, size_t>> Executor::stuck() const {
  std::vector<std::pair<int, size_t>> out;
  for (size_t d = 0; d < graph_.device_order.size(); ++d)
    if (devices_[d].cursor < devices_[d].size) out.emplace_back(static_cast<int>(d), devices_[d].cursor);
  return out;
}

std::vector<int32_t> Executor::blockers(int32_t task) const {
  // Each task is visited once: transfers can wait on each other in a cycle (a trace graph whose
  // receives depend on their rank's own sends around a ring), and the walk must still end.
  std::vector<int32_t> out, frontier{task};
  std::vector<bool> seen(graph_.tasks.size(), false);
  seen[task] = true;
  while (!frontier.empty()) {
    int32_t t = frontier.back();
    frontier.pop_back();
    for (size_t u = 0; u < graph_.tasks.size(); ++u) {
      if (timeline_.end[u] >= 0 || seen[u]) continue;
      for (int32_t s : graph_.successors(static_cast<int32_t>(u))) {
        if (s != t) continue;
        seen[u] = true;
        if (graph_.tasks[u].is_compute())
          out.push_back(static_cast<int32_t>(u));
        else
          frontier.push_back(static_cast<int32_t>(u));
        break;
      }
    }
  }
  return out;
}

Error Executor::stuck_error(const std::vector<std::string>& names) const {
  std::string msg = "the schedule deadlocks:";
  const auto devices = stuck();
  if (devices.empty()) msg += " transfers wait on each other (a cycle of dependencies)";
  for (auto [d, pos] : devices) {
    int32_t t = graph_.device_order[d][pos];
    msg += fmt::format("\n  {} waits at {} for", names.at(d), describe_task(graph_.tasks[t], names));
    std::vector<int32_t> missing = blockers(t);
    for (size_t i = 0; i < missing.size(); ++i)
      msg += fmt::format("{} {}", i ? "," : "", describe_task(graph_.tasks[missing[i]], names));
    if (missing.empty()) msg += " transfers that wait on each other (a cycle of dependencies)";
  }
  return Error{msg};
}

}  // namespace pipegrid
