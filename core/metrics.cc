#include "core/metrics.h"

#include <algorithm>

namespace pipegrid {

std::vector<MemoryTrace> memory_traces(const TaskGraph& g, const Timeline& t) {
  const size_t D = g.static_memory.size();
  struct Event {
    double time;
    double bytes;
    MemoryCategory category;
  };
  std::vector<std::vector<Event>> events(D);
  for (const MemoryChange& c : g.memory_changes) {
    const Task& task = g.tasks[c.task];
    double at = c.at_end ? t.end[c.task] : t.start[c.task];
    events[task.device].push_back({at, c.bytes, c.category});
  }
  std::vector<MemoryTrace> traces(D);
  for (size_t d = 0; d < D; ++d) {
    auto& ev = events[d];
    std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) {
      return a.time < b.time || (a.time == b.time && a.bytes < 0 && b.bytes >= 0);
    });
    MemoryBytes cur = g.static_memory[d];
    traces[d].push_back({0.0, cur});
    for (size_t i = 0; i < ev.size();) {
      const double time = ev[i].time;
      for (; i < ev.size() && ev[i].time == time; ++i) cur[static_cast<int>(ev[i].category)] += ev[i].bytes;
      if (traces[d].back().time == time)
        traces[d].back().bytes = cur;
      else
        traces[d].push_back({time, cur});
    }
  }
  return traces;
}

Metrics compute_metrics(const Cluster& c, const TaskGraph& g, const Timeline& t) {
  Metrics m;
  m.iteration_time_s = t.makespan();
  m.samples_per_iteration = g.samples_per_iteration;
  m.throughput_samples_per_s = m.iteration_time_s > 0 ? g.samples_per_iteration / m.iteration_time_s : 0;
  const size_t D = c.devices.size();
  m.devices.resize(D);
  for (size_t d = 0; d < D; ++d) {
    DeviceMetrics& dm = m.devices[d];
    dm.name = c.devices[d].name;
    dm.capacity_bytes = c.devices[d].spec.memory_bytes;
    dm.used = d < g.device_order.size() && !g.device_order[d].empty();
    for (int32_t task : d < g.device_order.size() ? g.device_order[d] : std::vector<int32_t>{})
      dm.busy_s += t.end[task] - t.start[task];
    dm.idle_s = std::max(0.0, m.iteration_time_s - dm.busy_s);
    dm.bubble_ratio = dm.busy_s + dm.idle_s > 0 ? dm.idle_s / (dm.busy_s + dm.idle_s) : 0;
    dm.static_bytes = d < g.static_memory.size() ? total(g.static_memory[d]) : 0;
  }
  const std::vector<MemoryTrace> traces = memory_traces(g, t);
  for (size_t d = 0; d < D && d < traces.size(); ++d) {
    DeviceMetrics& dm = m.devices[d];
    for (const MemoryPoint& p : traces[d]) {
      dm.peak_memory_bytes = std::max(dm.peak_memory_bytes, total(p.bytes));
      dm.peak_activation_bytes =
          std::max(dm.peak_activation_bytes, p.bytes[static_cast<int>(MemoryCategory::Activations)]);
    }
    if (dm.peak_memory_bytes > dm.capacity_bytes) m.over_capacity.push_back(static_cast<int>(d));
  }
  double idle = 0, all = 0;
  for (const DeviceMetrics& dm : m.devices) {
    if (!dm.used) continue;
    idle += dm.idle_s;
    all += dm.idle_s + dm.busy_s;
  }
  m.bubble_ratio = all > 0 ? idle / all : 0;
  return m;
}

}  // namespace pipegrid
