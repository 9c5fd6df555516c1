#include "core/jobs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <tuple>

#include "core/lower.h"
#include "core/units.h"

namespace pipegrid {

Result<Cluster> job_cluster(const Cluster& c, std::span<const int> devices) {
  if (!c.torus_dims.empty())
    return Error{
        fmt::format("cluster {} is a torus: jobs on part of a torus are not supported (its "
                    "dimension-order routing numbers the torus's points as devices)",
                    c.name)};
  const size_t D = c.devices.size();
  std::vector<int> node(c.node_count(), -1);  // the job cluster's node of each shared node
  int next = 0;
  for (int d : devices) {
    if (d < 0 || static_cast<size_t>(d) >= D)
      return Error{fmt::format("device {} is not one of cluster {}'s {} devices", d, c.name, D)};
    if (node[d] >= 0) return Error{fmt::format("device {} is given twice", c.devices[d].name)};
    node[d] = next++;
  }
  Cluster j;
  j.name = c.name;
  j.sharing = c.sharing;
  j.engine = c.engine;  // the FPGAs' collective engine: its per-call and per-message costs
  // Not machine_symmetry: the job's devices are renumbered, so machine n no longer holds devices
  // n x per_machine ...; the router searches each pair instead (the same routes, found slower).
  for (int d : devices) j.devices.push_back(c.devices[d]);
  for (size_t d = 0; d < D; ++d)
    if (node[d] < 0) {
      node[d] = next++;
      j.switches.push_back(c.devices[d].name);
    }
  for (size_t s = 0; s < c.switches.size(); ++s) {
    node[D + s] = static_cast<int>(D + s);
    j.switches.push_back(c.switches[s]);
  }
  j.links = c.links;
  for (Link& l : j.links) l = {node[l.a], node[l.b], l.bandwidth, l.latency, l.duplex};
  j.routes = c.routes;
  for (ExplicitRoute& r : j.routes) r.from = node[r.from], r.to = node[r.to];
  if (c.fat_tree) {
    j.fat_tree = c.fat_tree;
    for (int& e : j.fat_tree->endpoints) e = node[e];
    for (auto& [a, b] : j.fat_tree->down) a = node[a], b = node[b];
  }
  return j;
}

std::string_view to_string(JobPlacement p) {
  switch (p) {
    case JobPlacement::Packed:
      return "packed";
    case JobPlacement::Spread:
      return "spread";
    case JobPlacement::Random:
      return "random";
  }
  return "?";
}

namespace {

// The machines of c (Cluster::machine_of), each its devices in index order, in order of their first device.
std::vector<std::vector<int>> machines(const Cluster& c) {
  std::map<std::string, size_t> index;
  std::vector<std::vector<int>> out;
  for (size_t d = 0; d < c.devices.size(); ++d) {
    auto [it, fresh] = index.emplace(c.machine_of(static_cast<int>(d)), out.size());
    if (fresh) out.emplace_back();
    out[it->second].push_back(static_cast<int>(d));
  }
  return out;
}

}  // namespace

Result<std::vector<int>> place_job(const Cluster& c, const std::vector<bool>& taken, int count,
                                   JobPlacement placement, uint64_t seed) {
  std::vector<int> out;
  if (placement == JobPlacement::Packed) {
    for (size_t d = 0; d < c.devices.size() && out.size() < static_cast<size_t>(count); ++d)
      if (!taken[d]) out.push_back(static_cast<int>(d));
    if (out.size() < static_cast<size_t>(count))
      return Error{fmt::format("{} devices wanted, {} of cluster {}'s {} are free", count, out.size(), c.name,
                               c.devices.size())};
    return out;
  }
  std::vector<std::vector<int>> free;  // whole free machines
  size_t free_devices = 0;
  for (std::vector<int>& m : machines(c))
    if (std::none_of(m.begin(), m.end(), [&](int d) { return taken[d]; })) {
      free_devices += m.size();
      free.push_back(std::move(m));
    }
  if (free_devices < static_cast<size_t>(count))
    return Error{fmt::format("{} devices wanted, the {} whole free machines of cluster {} have {}", count,
                             free.size(), c.name, free_devices)};
  std::vector<size_t> order;  // the machines to take, in the order they are taken
  const size_t M = free.size();
  if (placement == JobPlacement::Spread) {
    const double per_machine = static_cast<double>(free_devices) / static_cast<double>(M);
    const size_t m = std::min(M, static_cast<size_t>(std::ceil(count / per_machine)));
    for (size_t i = 0; i < m; ++i) order.push_back(i * M / m);
    for (size_t i = 0; i < M; ++i)  // unequal machines: the others after, in order
      if (std::find(order.begin(), order.end(), i) == order.end()) order.push_back(i);
  } else {
    for (size_t i = 0; i < M; ++i) order.push_back(i);
    std::mt19937_64 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
  }
  for (size_t i : order)
    for (int d : free[i])
      if (out.size() < static_cast<size_t>(count)) out.push_back(d);
  std::sort(out.begin(), out.end());
  return out;
}

int JobsGraph::job_of(int32_t task) const {
  return static_cast<int>(std::upper_bound(begin.begin(), begin.end(), task) - begin.begin()) - 1;
}

namespace {

// Appends one iteration of job j's graph to `out` with its devices mapped; returns its first task.
int32_t append_iteration(TaskGraph& out, const TaskGraph& g, const std::vector<int>& devices) {
  const auto first = static_cast<int32_t>(out.tasks.size());
  for (Task t : g.tasks) {
    t.device = devices[t.device];
    if (!t.is_compute()) t.peer = devices[t.peer];
    out.add(t);
  }
  for (size_t t = 0; t < g.tasks.size(); ++t)
    for (int32_t s : g.successors(static_cast<int32_t>(t)))
      out.depend(first + static_cast<int32_t>(t), first + s);
  for (size_t d = 0; d < g.device_order.size(); ++d)
    for (int32_t t : g.device_order[d]) out.device_order[devices[d]].push_back(first + t);
  return first;
}

// A compute task of `seconds` on `device` that belongs to no stage or micro-batch.
Task marker(int device, double seconds) {
  Task t;
  t.kind = TaskKind::Optimizer;
  t.device = device;
  t.duration = seconds;
  return t;
}

Status check_job(size_t device_count, const JobRun& job, size_t j, std::vector<bool>& taken) {
  if (job.graph == nullptr || job.devices.empty()) return Error{fmt::format("job {} has no devices", j)};
  if (job.iterations < 1) return Error{fmt::format("job {} has {} iterations", j, job.iterations)};
  if (job.graph->device_order.size() > job.devices.size())
    return Error{fmt::format("job {}'s graph uses {} devices, it has {}", j, job.graph->device_order.size(),
                             job.devices.size())};
  for (int d : job.devices) {
    if (d < 0 || static_cast<size_t>(d) >= device_count)
      return Error{fmt::format("job {}: device {} is not one of the cluster's {}", j, d, device_count)};
    if (taken[d]) return Error{fmt::format("job {}: device {} is another job's", j, d)};
    taken[d] = true;
  }
  return {};
}

}  // namespace

Result<JobsGraph> join_jobs(size_t device_count, std::span<const JobRun> jobs) {
  JobsGraph out;
  std::vector<bool> taken(device_count, false);
  double tasks = 0, dependencies = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (Status s = check_job(device_count, jobs[j], j, taken); !s) return s.error();
    const TaskGraph& g = *jobs[j].graph;
    tasks += static_cast<double>(jobs[j].iterations) * static_cast<double>(g.tasks.size() + 1) + 1;
    dependencies += static_cast<double>(jobs[j].iterations) *
                    static_cast<double>(g.dependency_count() + 2 * g.tasks.size());
  }
  if (tasks >= 2147483647.0)
    return Error{fmt::format("the jobs' iterations make {:.0f} tasks, above the limit of 2^31", tasks)};
  // Checked before allocating, as lower() does: the joined graph and the replay's arrays.
  if (const double need = tasks * kBytesPerTask, have = available_memory_bytes(); need > have)
    return Error{
        fmt::format("the jobs' iterations make {:.0f} tasks, about {} of memory, more than the {} "
                    "available: fewer iterations or smaller jobs",
                    tasks, format_bytes(need), format_bytes(have))};
  TaskGraph& all = out.graph;
  all.reserve(static_cast<size_t>(tasks), static_cast<size_t>(dependencies));
  all.device_order.resize(device_count);
  all.static_memory.resize(device_count);
  for (const JobRun& job : jobs) {
    const TaskGraph& g = *job.graph;
    std::vector<int32_t> sources, sinks;
    for (size_t t = 0; t < g.tasks.size(); ++t) {
      if (g.predecessor_count[t] == 0) sources.push_back(static_cast<int32_t>(t));
      if (g.successors(static_cast<int32_t>(t)).empty()) sinks.push_back(static_cast<int32_t>(t));
    }
    for (size_t d = 0; d < g.static_memory.size(); ++d)
      all.static_memory[job.devices[d]] = g.static_memory[d];
    out.begin.push_back(static_cast<int32_t>(all.tasks.size()));
    out.size.push_back(static_cast<int32_t>(g.tasks.size()));
    out.start_s.push_back(job.start_s);
    int32_t gate = -1;  // the task iteration i's sources wait for
    if (job.start_s > 0) {
      gate = all.add(marker(job.devices[0], job.start_s));
      all.device_order[job.devices[0]].push_back(gate);
    }
    std::vector<int32_t>& first = out.first.emplace_back();
    for (int i = 0; i < job.iterations; ++i) {
      if (i > 0) {
        gate = all.add(marker(job.devices[0], 0));
        all.device_order[job.devices[0]].push_back(gate);
        for (int32_t t : sinks) all.depend(first.back() + t, gate);
      }
      first.push_back(append_iteration(all, g, job.devices));
      if (gate >= 0)
        for (int32_t t : sources) all.depend(gate, first.back() + t);
    }
  }
  out.begin.push_back(static_cast<int32_t>(all.tasks.size()));
  all.pack_dependencies();
  return out;
}

std::vector<double> iteration_times(const JobsGraph& g, const Timeline& t, int job) {
  std::vector<double> out;
  const int32_t start_task = g.start_s[job] > 0 ? g.begin[job] : -1;
  double start = start_task >= 0 ? t.end[start_task] : 0;
  for (int32_t first : g.first[job]) {
    double end = start;
    for (int32_t k = first; k < first + g.size[job]; ++k) end = std::max(end, t.end[k]);
    out.push_back(end - start);
    start = end;
  }
  return out;
}

Timeline iteration_timeline(const JobsGraph& g, const Timeline& t, int job, int iteration) {
  double start = g.start_s[job] > 0 ? t.end[g.begin[job]] : 0;
  if (iteration > 0) {
    const int32_t prev = g.first[job][iteration - 1];
    for (int32_t k = prev; k < prev + g.size[job]; ++k) start = std::max(start, t.end[k]);
  }
  Timeline out;
  const int32_t first = g.first[job][iteration];
  for (int32_t k = first; k < first + g.size[job]; ++k) {
    out.start.push_back(t.start[k] - start);
    out.end.push_back(t.end[k] - start);
  }
  return out;
}

namespace {

// Time during which flows of two or more jobs were in flight, from (date, job, +1 | -1) events.
double time_together(std::vector<std::tuple<double, int, int>>& events, size_t jobs) {
  // At equal dates the ends (-1) come first: intervals that only touch do not overlap.
  std::sort(events.begin(), events.end());
  std::vector<int> active(jobs, 0);
  int jobs_active = 0;
  double together = 0, last = 0;
  for (const auto& [date, job, change] : events) {
    if (jobs_active >= 2) together += date - last;
    last = date;
    const int before = active[job];
    active[job] += change;
    jobs_active += (active[job] > 0) - (before > 0);
  }
  return together;
}

}  // namespace

// Merges intervals into disjoint ones, in time order.
static std::vector<std::pair<double, double>> merged(std::vector<std::pair<double, double>> v) {
  std::sort(v.begin(), v.end());
  std::vector<std::pair<double, double>> out;
  for (const auto& [a, b] : v)
    if (!out.empty() && a <= out.back().second)
      out.back().second = std::max(out.back().second, b);
    else
      out.emplace_back(a, b);
  return out;
}

Result<SharedTraffic> shared_links(const Cluster& c, const JobsGraph& g, const Timeline& t, size_t top) {
  const size_t J = g.begin.size() - 1;
  struct Channel {
    std::vector<double> bytes;
    std::vector<std::tuple<double, int, int>> events;
    Hop hop;
  };
  std::map<size_t, Channel> channels;
  const Router router(c);
  for (size_t k = 0; k < g.graph.tasks.size(); ++k) {
    const Task& task = g.graph.tasks[k];
    if (task.is_compute() || task.device == task.peer || task.bytes <= 0) continue;
    Result<Route> r = router.route(task.device, task.peer);
    if (!r) return r.error();
    const int job = g.job_of(static_cast<int32_t>(k));
    for (const Hop& h : r->hops) {
      Channel& ch = channels[link_channel(c, h)];
      if (ch.bytes.empty()) ch.bytes.assign(J, 0), ch.hop = h;
      ch.bytes[job] += task.bytes;
      ch.events.emplace_back(t.start[k], job, +1);
      ch.events.emplace_back(t.end[k], job, -1);
    }
  }
  SharedTraffic out;
  std::vector<std::vector<std::pair<double, double>>> busy(J);
  for (auto& [channel, ch] : channels) {
    if (std::count_if(ch.bytes.begin(), ch.bytes.end(), [](double b) { return b > 0; }) < 2) continue;
    const bool shared_duplex = c.links[ch.hop.link].duplex == Duplex::Shared;
    // Each flow's interval: its +1 and -1 events, added one after the other (time_together sorts them after).
    for (size_t e = 0; e + 1 < ch.events.size(); e += 2)
      busy[std::get<1>(ch.events[e])].emplace_back(std::get<0>(ch.events[e]), std::get<0>(ch.events[e + 1]));
    out.links.push_back(
        {ch.hop.link, !shared_duplex && ch.hop.reverse, ch.bytes, time_together(ch.events, J)});
  }
  for (auto& b : busy) out.busy.push_back(merged(std::move(b)));
  auto total = [](const SharedLink& l) {
    double s = 0;
    for (double b : l.bytes) s += b;
    return s;
  };
  std::stable_sort(out.links.begin(), out.links.end(),
                   [&](const SharedLink& a, const SharedLink& b) { return total(a) > total(b); });
  if (top > 0 && out.links.size() > top) out.links.resize(top);
  return out;
}

}  // namespace pipegrid
