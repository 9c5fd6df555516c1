#include "core/metrics.h"

#include <algorithm>
#include <cstdint>

namespace pipegrid {

namespace {

// Calls emit(device, time, bytes) for every point of every device's memory step function, in time
// order per device, starting with (0, static memory); a point may repeat the previous one's time
// (the first group at time 0), in which case it replaces it.
template <class Emit>
void memory_points(const TaskGraph& g, const Timeline& t, Emit&& emit) {
  const size_t D = g.static_memory.size();
  // Every device's changes in one array of indices into g.memory_changes (counting sort by device,
  // keeping the lowering's order; 4 bytes per change, read with their times on the fly).
  std::vector<size_t> first(D + 1, 0);
  for (const MemoryChange& c : g.memory_changes) ++first[g.tasks[c.task].device + 1];
  for (size_t d = 0; d < D; ++d) first[d + 1] += first[d];
  std::vector<uint32_t> events;
  assign_huge(events, first[D], uint32_t{0});
  std::vector<size_t> fill(first.begin(), first.end() - 1);
  for (size_t i = 0; i < g.memory_changes.size(); ++i)
    events[fill[g.tasks[g.memory_changes[i].task].device]++] = static_cast<uint32_t>(i);
  auto time_of = [&](uint32_t i) {
    const MemoryChange& c = g.memory_changes[i];
    return c.at_end ? t.end[c.task] : t.start[c.task];
  };
  auto earlier = [&](uint32_t a, uint32_t b) { return time_of(a) < time_of(b); };
  for (size_t d = 0; d < D; ++d) {
    const auto lo = events.begin() + static_cast<std::ptrdiff_t>(first[d]);
    const auto hi = events.begin() + static_cast<std::ptrdiff_t>(first[d + 1]);
    // A device runs its tasks one after the other, and lower() lists each task's changes at its start
    // before those at its end: the times are then already in order, and one pass suffices. Other
    // graphs are sorted first.
    if (!std::is_sorted(lo, hi, earlier)) std::stable_sort(lo, hi, earlier);
    MemoryBytes cur = g.static_memory[d];
    emit(d, 0.0, cur);
    for (auto i = lo; i != hi;) {
      // At one time, frees before allocations, each in their order.
      const double time = time_of(*i);
      auto j = i;
      while (j != hi && time_of(*j) == time) ++j;
      for (auto k = i; k != j; ++k)
        if (const MemoryChange& c = g.memory_changes[*k]; c.bytes < 0)
          cur[static_cast<int>(c.category)] += c.bytes;
      for (auto k = i; k != j; ++k)
        if (const MemoryChange& c = g.memory_changes[*k]; c.bytes >= 0)
          cur[static_cast<int>(c.category)] += c.bytes;
      i = j;
      emit(d, time, cur);
    }
  }
}

}  // namespace

std::vector<MemoryTrace> memory_traces(const TaskGraph& g, const Timeline& t) {
  std::vector<MemoryTrace> traces(g.static_memory.size());
  memory_points(g, t, [&](size_t d, double time, const MemoryBytes& bytes) {
    if (!traces[d].empty() && traces[d].back().time == time)
      traces[d].back().bytes = bytes;
    else
      traces[d].push_back({time, bytes});
  });
  return traces;
}

Metrics compute_metrics(const Cluster& c, const TaskGraph& g, const Timeline& t,
                        const FoldLayout* fold_layout) {
  Metrics m;
  // Calls f on each device's tasks in order: a copied device's are its image's, its own step in place
  // of theirs (read in place, not copied: 131,072 devices at d = 1,024).
  auto each_task = [&](size_t d, auto&& f) {
    if (d >= g.device_order.size()) return;
    const auto& mine = g.device_order[d];
    if (fold_layout && fold_layout->copied(d) && !mine.empty()) {
      const auto& theirs = g.device_order[static_cast<size_t>(fold_layout->image[d])];
      for (size_t i = 0; i + 1 < theirs.size(); ++i) f(theirs[i]);
    }
    for (int32_t task : mine) f(task);
  };
  m.iteration_time_s = t.makespan();
  m.samples_per_iteration = g.samples_per_iteration;
  m.throughput_samples_per_s = m.iteration_time_s > 0 ? g.samples_per_iteration / m.iteration_time_s : 0;
  const size_t D = c.devices.size();
  m.devices.resize(D);
  for (size_t d = 0; d < D; ++d) {
    DeviceMetrics& dm = m.devices[d];
    dm.name = c.devices[d].name;
    dm.capacity_bytes = c.devices[d].spec.usable_memory();
    dm.used = d < g.device_order.size() && !g.device_order[d].empty();
    each_task(d, [&](int32_t task) { dm.busy_s += t.end[task] - t.start[task]; });
    dm.idle_s = std::max(0.0, m.iteration_time_s - dm.busy_s);
    dm.bubble_ratio = dm.busy_s + dm.idle_s > 0 ? dm.idle_s / (dm.busy_s + dm.idle_s) : 0;
    dm.static_bytes = d < g.static_memory.size() ? total(g.static_memory[d]) : 0;
  }
  // The peaks over the points of memory_traces(), without storing them: a point counts once no later
  // point replaces it (same time).
  std::vector<MemoryPoint> last(g.static_memory.size());
  std::vector<char> open(g.static_memory.size(), 0);
  auto fold = [&](size_t d) {
    if (d >= D || !open[d]) return;
    DeviceMetrics& dm = m.devices[d];
    dm.peak_memory_bytes = std::max(dm.peak_memory_bytes, total(last[d].bytes));
    dm.peak_activation_bytes =
        std::max(dm.peak_activation_bytes, last[d].bytes[static_cast<int>(MemoryCategory::Activations)]);
  };
  memory_points(g, t, [&](size_t d, double time, const MemoryBytes& bytes) {
    if (open[d] && last[d].time != time) fold(d);
    last[d] = {time, bytes};
    open[d] = 1;
  });
  for (size_t d = 0; d < D; ++d) fold(d);
  for (size_t d = 0; fold_layout && d < D; ++d)
    if (fold_layout->copied(d)) {  // a copy holds what its image holds, when it does
      const DeviceMetrics& theirs = m.devices[static_cast<size_t>(fold_layout->image[d])];
      m.devices[d].peak_memory_bytes = theirs.peak_memory_bytes;
      m.devices[d].peak_activation_bytes = theirs.peak_activation_bytes;
    }
  for (size_t d = 0; d < D; ++d) {
    if (m.devices[d].peak_memory_bytes > m.devices[d].capacity_bytes)
      m.over_capacity.push_back(static_cast<int>(d));
  }
  // The breakdown: every task's last-finishing dependency, then each device's gaps.
  const size_t n = g.tasks.size();
  std::vector<int32_t> waited(n, -1);
  for (size_t u = 0; u < n; ++u)
    for (int32_t v : g.successors(static_cast<int32_t>(u)))
      if (waited[v] < 0 || t.end[u] > t.end[waited[v]]) waited[v] = static_cast<int32_t>(u);
  auto explain = [&](TimeBreakdown& b, int32_t task, double from, double to) {
    double until = to;
    int32_t cur = task;
    while (until > from) {
      const int32_t p = waited[cur];
      if (p < 0 || !(t.end[p] > from) || g.tasks[p].is_compute()) break;
      const Task& x = g.tasks[p];
      double& part = x.transfer == TransferKind::TensorParallel    ? b.tensor_parallel_s
                     : x.transfer == TransferKind::DataParallel    ? b.data_parallel_s
                     : x.transfer == TransferKind::ExpertParallel  ? b.expert_parallel_s
                     : x.transfer == TransferKind::ContextParallel ? b.context_parallel_s
                                                                   : b.pipeline_s;
      const double begin = std::max(from, t.start[p]);
      part += until - begin;
      until = begin;
      cur = p;
    }
    if (until > from) b.bubble_s += until - from;
  };
  for (size_t d = 0; d < D && d < g.device_order.size(); ++d) {
    TimeBreakdown& b = m.devices[d].breakdown;
    double at = 0;
    each_task(d, [&](int32_t task) {
      if (t.start[task] > at) explain(b, task, at, t.start[task]);
      (g.tasks[task].kind == TaskKind::Optimizer ? b.optimizer_s : b.compute_s) +=
          t.end[task] - t.start[task];
      at = std::max(at, t.end[task]);
    });
    if (!g.device_order[d].empty() && m.iteration_time_s > at) b.bubble_s += m.iteration_time_s - at;
  }
  int used = 0;
  for (const DeviceMetrics& dm : m.devices) {
    if (!dm.used) continue;
    ++used;
    m.breakdown.compute_s += dm.breakdown.compute_s;
    m.breakdown.optimizer_s += dm.breakdown.optimizer_s;
    m.breakdown.tensor_parallel_s += dm.breakdown.tensor_parallel_s;
    m.breakdown.pipeline_s += dm.breakdown.pipeline_s;
    m.breakdown.data_parallel_s += dm.breakdown.data_parallel_s;
    m.breakdown.bubble_s += dm.breakdown.bubble_s;
    m.breakdown.expert_parallel_s += dm.breakdown.expert_parallel_s;
    m.breakdown.context_parallel_s += dm.breakdown.context_parallel_s;
  }
  if (used > 0)
    for (double* x : {&m.breakdown.compute_s, &m.breakdown.optimizer_s, &m.breakdown.tensor_parallel_s,
                      &m.breakdown.pipeline_s, &m.breakdown.data_parallel_s, &m.breakdown.bubble_s,
                      &m.breakdown.expert_parallel_s, &m.breakdown.context_parallel_s})
      *x /= used;
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
