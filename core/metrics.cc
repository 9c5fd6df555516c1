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
  // Every device's events in one array (counting sort by device, keeping the lowering's order).
  std::vector<size_t> first(D + 1, 0);
  for (const MemoryChange& c : g.memory_changes) ++first[g.tasks[c.task].device + 1];
  for (size_t d = 0; d < D; ++d) first[d + 1] += first[d];
  std::vector<Event> events(first[D]);
  std::vector<size_t> fill(first.begin(), first.end() - 1);
  for (const MemoryChange& c : g.memory_changes) {
    const auto d = static_cast<size_t>(g.tasks[c.task].device);
    events[fill[d]++] = {c.at_end ? t.end[c.task] : t.start[c.task], c.bytes, c.category};
  }
  std::vector<MemoryTrace> traces(D);
  for (size_t d = 0; d < D; ++d) {
    const auto lo = events.begin() + static_cast<std::ptrdiff_t>(first[d]);
    const auto hi = events.begin() + static_cast<std::ptrdiff_t>(first[d + 1]);
    // A device runs its tasks one after the other, and lower() lists each task's changes at its start
    // before those at its end: the times are then already in order, and one pass suffices. Other
    // graphs are sorted first.
    if (!std::is_sorted(lo, hi, [](const Event& a, const Event& b) { return a.time < b.time; }))
      std::stable_sort(lo, hi, [](const Event& a, const Event& b) { return a.time < b.time; });
    MemoryBytes cur = g.static_memory[d];
    traces[d].reserve(static_cast<size_t>(hi - lo) + 1);
    traces[d].push_back({0.0, cur});
    for (auto i = lo; i != hi;) {
      // At one time, frees before allocations, each in their order.
      const double time = i->time;
      auto j = i;
      while (j != hi && j->time == time) ++j;
      for (auto k = i; k != j; ++k)
        if (k->bytes < 0) cur[static_cast<int>(k->category)] += k->bytes;
      for (auto k = i; k != j; ++k)
        if (k->bytes >= 0) cur[static_cast<int>(k->category)] += k->bytes;
      i = j;
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
