// luo's scheduler (our interpretation of Luo et al.'s "pipeline scheduler deciding the processing
// order of micro-batches over the partitions"; only the paper's abstract is known). A list scheduler
// on the plan's task DAG with critical-path priorities and memory-bounded in-flight caps, whose
// variants are compared with the 1F1B and GPipe orders in the analytic evaluator (core/evaluate.h).
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <queue>
#include <tuple>

#include "core/evaluate.h"
#include "core/lower.h"
#include "core/metrics.h"
#include "core/planners/luo.h"

namespace pipegrid {
namespace {

// Links as FIFO channels (one per direction of a full-duplex link), as the analytic evaluator has
// them: a transfer waits until every hop of its route is free and holds each for bytes / bandwidth.
class Channels {
 public:
  explicit Channels(const Cluster& c) : cluster_(c), router_(c), free_at_(2 * c.links.size(), 0.0) {}

  // When a transfer launched at `now` arrives.
  Result<double> arrival(int from, int to, double bytes, double now) {
    if (from == to || bytes <= 0) return now;
    Result<Route> route = router_.route(from, to);
    if (!route) return route.error();
    double start = now;
    for (const Hop& h : route->hops) start = std::max(start, free_at_[channel(h)]);
    const double hold = route->hops.empty() ? 0.0 : bytes / route->bandwidth;
    for (const Hop& h : route->hops) free_at_[channel(h)] = start + hold;
    return start + route->transfer_time(bytes);
  }

 private:
  size_t channel(const Hop& h) const { return link_channel(cluster_, h); }
  const Cluster& cluster_;
  Router router_;
  std::vector<double> free_at_;
};

bool same_order(const Schedule& a, const Schedule& b) {
  return a.device_actions == b.device_actions;
}

}  // namespace

std::vector<int> one_f_one_b_depths(const Partition& p) {
  const int S = static_cast<int>(p.stage_count());
  std::vector<int> depth(S, 1);
  for (int s = S - 1; s >= 0; --s)
    for (int t : p.successors(s)) depth[s] = std::max(depth[s], depth[t] + 1);
  return depth;
}

Result<std::vector<int>> memory_caps(const PlanRequest& r, const Partition& p, double micro_batch_size) {
  auto costs = stage_costs(r.workload, r.cluster, p, micro_batch_size, r.memory.recompute);
  if (!costs) return costs.error();
  const size_t S = p.stage_count();
  // Static bytes per device (every stage it hosts).
  std::vector<double> fixed(r.cluster.devices.size(), 0.0);
  for (size_t s = 0; s < S; ++s) {
    const auto& devs = p.stage(s).devices;
    for (size_t j = 0; j < devs.size(); ++j) {
      const StageCost& sc = (*costs)[s][j];
      MemoryBytes st = static_memory(sc.parameters, sc.parameter_bytes, r.memory);
      if (r.memory.zero1) st[static_cast<int>(MemoryCategory::OptimizerState)] /= devs.size();
      fixed[devs[j]] += total(st);
    }
  }
  std::vector<int> caps(S, std::numeric_limits<int>::max());
  for (size_t s = 0; s < S; ++s) {
    const auto& devs = p.stage(s).devices;
    for (size_t j = 0; j < devs.size(); ++j) {
      const StageCost& sc = (*costs)[s][j];
      const double room = r.cluster.devices[devs[j]].spec.usable_memory() - fixed[devs[j]] -
                          sc.workspace_bytes - sc.recompute_bytes;
      if (sc.stash_bytes <= 0) continue;
      const double k = std::floor(room / sc.stash_bytes);
      caps[s] = std::min(caps[s], static_cast<int>(std::clamp(k, 1.0, 1e9)));
    }
  }
  return caps;
}

namespace {

// The list scheduler of one plan and policy: the task DAG of (stage, replica, micro-batch, pass)
// tasks, then an event-driven run in which idle devices start their best ready task.
class ListScheduler {
 public:
  ListScheduler(const PlanRequest& r, const Partition& p, double micro_batch_size, int micro_batches,
                const ListPolicy& policy, const std::vector<std::vector<StageCost>>& costs)
      : p_(p),
        policy_(policy),
        costs_(costs),
        S_(static_cast<int>(p.stage_count())),
        m_(micro_batches),
        D_(static_cast<int>(r.cluster.devices.size())),
        depth_(one_f_one_b_depths(p)),
        channels_(r.cluster) {
    number_pairs();
    add_edges(micro_batch_size);
  }

  Result<Schedule> run();

 private:
  struct Out {
    int to;
    double bytes;
  };
  using Event = std::tuple<double, int, int>;  // time, kind (0 compute end, 1 arrival), task

  // Task id = (pair x m + k) x 2 + pass (0 F, 1 B), pair = base_[s] + j for replica j of stage s.
  int id(int s, int j, int pass, int k) const { return ((base_[s] + j) * m_ + k) * 2 + pass; }
  int pair_of(int task) const { return task / 2 / m_; }
  void number_pairs();
  void add_edge(int a, int b, double bytes) {
    out_[a].push_back({b, bytes});
    ++pending_[b];
  }
  void add_edges(double micro_batch_size);
  double duration(int task) const {
    const int pair = pair_of(task);
    const StageCost& sc = costs_[stage_of_[pair]][replica_of_[pair]];
    return task % 2 == 0 ? sc.times.forward : sc.recompute_s + sc.times.backward();
  }
  // Priority: smaller is better.
  std::tuple<int, int, int, int> key(int task) const {
    const int pass = task % 2;
    const int k = (task / 2) % m_;
    const int pair = pair_of(task);
    const int first = policy_.backward_first ? (pass == 1 ? 0 : 1) : (pass == 0 ? 0 : 1);
    return std::make_tuple(first, k, -depth_[stage_of_[pair]], pair);
  }
  void dispatch(int d);
  Status finish(int t);

  const Partition& p_;
  const ListPolicy& policy_;
  const std::vector<std::vector<StageCost>>& costs_;
  const int S_, m_, D_;
  const std::vector<int> depth_;
  Channels channels_;
  std::vector<int> base_;
  int tasks_ = 0;
  std::vector<int> stage_of_, replica_of_, device_of_;  // per pair
  std::vector<std::vector<Out>> out_;
  std::vector<int> pending_;             // per task, its inputs not arrived yet
  std::vector<std::vector<int>> ready_;  // per device, ready tasks
  std::vector<int> in_flight_;           // per pair
  std::vector<char> busy_;
  Schedule sched_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  double now_ = 0;
  int done_ = 0;
};

void ListScheduler::number_pairs() {
  base_.assign(S_ + 1, 0);
  for (int s = 0; s < S_; ++s) base_[s + 1] = base_[s] + static_cast<int>(p_.stage(s).devices.size());
  const int pairs = base_[S_];
  tasks_ = pairs * m_ * 2;
  stage_of_.resize(pairs), replica_of_.resize(pairs), device_of_.resize(pairs);
  for (int s = 0; s < S_; ++s)
    for (int j = 0; j < base_[s + 1] - base_[s]; ++j) {
      stage_of_[base_[s] + j] = s;
      replica_of_[base_[s] + j] = j;
      device_of_[base_[s] + j] = p_.stage(s).devices[j];
    }
}

// Each forward before its backward; activations forward and gradients backward between the replicas
// that share samples.
void ListScheduler::add_edges(double micro_batch_size) {
  out_.assign(tasks_, {});
  pending_.assign(tasks_, 0);
  for (int s = 0; s < S_; ++s) {
    const int rs = base_[s + 1] - base_[s];
    for (int j = 0; j < rs; ++j)
      for (int k = 0; k < m_; ++k) add_edge(id(s, j, 0, k), id(s, j, 1, k), 0);
    for (int t : p_.successors(s)) {
      const double bytes = p_.graph[boost::edge(s, t, p_.graph).first].bytes_per_sample * micro_batch_size;
      const int rt = base_[t + 1] - base_[t];
      for (int i = 0; i < rs; ++i)
        for (int j = 0; j < rt; ++j) {
          const double share = replica_overlap(i, rs, j, rt);
          if (share <= 0) continue;
          for (int k = 0; k < m_; ++k) {
            add_edge(id(s, i, 0, k), id(t, j, 0, k), bytes * share);
            add_edge(id(t, j, 1, k), id(s, i, 1, k), bytes * share);
          }
        }
    }
  }
}

// Device d, when idle, starts its ready task of highest priority within the in-flight caps.
void ListScheduler::dispatch(int d) {
  if (busy_[d]) return;
  int best = -1;
  for (int t : ready_[d]) {
    const int pair = pair_of(t);
    const int cap = std::max(1, policy_.in_flight_cap.empty() ? m_ : policy_.in_flight_cap[stage_of_[pair]]);
    if (t % 2 == 0 && in_flight_[pair] >= cap) continue;
    if (best < 0 || key(t) < key(best)) best = t;
  }
  if (best < 0) return;
  ready_[d].erase(std::find(ready_[d].begin(), ready_[d].end(), best));
  const int pair = pair_of(best);
  in_flight_[pair] += best % 2 == 0 ? 1 : -1;
  busy_[d] = 1;
  sched_.device_actions[d].push_back(
      {stage_of_[pair], best % 2 == 0 ? Pass::Forward : Pass::Backward, (best / 2) % m_});
  events_.emplace(now_ + duration(best), 0, best);
}

// Task t's compute ends now: its device is free and its outputs leave over the channels.
Status ListScheduler::finish(int t) {
  ++done_;
  busy_[device_of_[pair_of(t)]] = 0;
  for (const Out& o : out_[t]) {
    const int from = device_of_[pair_of(t)], to = device_of_[pair_of(o.to)];
    Result<double> at = channels_.arrival(from, to, o.bytes, now_);
    if (!at) return at.error();
    events_.emplace(*at, 1, o.to);
  }
  return {};
}

Result<Schedule> ListScheduler::run() {
  ready_.assign(D_, {});
  in_flight_.assign(base_[S_], 0);
  busy_.assign(D_, 0);
  sched_.device_actions.resize(D_);
  for (int t = 0; t < tasks_; ++t)
    if (pending_[t] == 0) ready_[device_of_[pair_of(t)]].push_back(t);
  for (int d = 0; d < D_; ++d) dispatch(d);
  while (!events_.empty()) {
    now_ = std::get<0>(events_.top());
    // Everything that happens at this instant, then the idle devices choose.
    while (!events_.empty() && std::get<0>(events_.top()) == now_) {
      auto [time, kind, t] = events_.top();
      events_.pop();
      if (kind == 1) {
        if (--pending_[t] == 0) ready_[device_of_[pair_of(t)]].push_back(t);
        continue;
      }
      if (Status s = finish(t); !s) return s.error();
    }
    for (int d = 0; d < D_; ++d) dispatch(d);
  }
  if (done_ != tasks_)
    return Error{fmt::format("luo list schedule: stuck after {} of {} tasks (in-flight caps too small)",
                             done_, tasks_)};
  return std::move(sched_);
}

}  // namespace

Result<Schedule> list_schedule(const PlanRequest& r, const Partition& p, double micro_batch_size,
                               int micro_batches, const ListPolicy& policy) {
  auto costs = stage_costs(r.workload, r.cluster, p, micro_batch_size, r.memory.recompute);
  if (!costs) return costs.error();
  return ListScheduler(r, p, micro_batch_size, micro_batches, policy, *costs).run();
}

Result<Candidate> schedule_luo(const PlanRequest& r, Plan plan, std::string* chosen) {
  const Partition& part = plan.partition;
  const int m = plan.micro_batches;
  const std::vector<int> depth = one_f_one_b_depths(part);
  Result<std::vector<int>> mem = memory_caps(r, part, plan.micro_batch_size);
  if (!mem) return mem.error();
  struct Option {
    std::string label;
    Schedule schedule;
  };
  std::vector<Option> options;
  auto add = [&](std::string label, Result<Schedule> s) {
    if (!s) return;
    for (const Option& o : options)
      if (same_order(o.schedule, *s)) return;
    options.push_back({std::move(label), std::move(*s)});
  };
  // 1F1B and GPipe first: on ties they win, so a list order is kept only when strictly faster.
  for (const char* name : {"1f1b", "gpipe"}) {
    ScheduleRequest req{part, r.cluster.devices.size(), m, 1, {}, {}};
    add(name, (*find_schedule(name))->build(req));
  }
  auto caps = [&](auto f) {
    std::vector<int> c(depth.size());
    for (size_t s = 0; s < c.size(); ++s)
      c[s] = std::clamp(f(depth[s]), 1, std::max(1, std::min(m, (*mem)[s])));
    return c;
  };
  struct Variant {
    const char* label;
    bool backward_first;
    int (*cap)(int depth, int m);
  };
  constexpr Variant kVariants[] = {
      {"list, backward first, cap depth", true, [](int d, int) { return d; }},
      {"list, backward first, cap depth + 1", true, [](int d, int) { return d + 1; }},
      {"list, backward first, cap 2 depth", true, [](int d, int) { return 2 * d; }},
      {"list, backward first, cap m", true, [](int, int m) { return m; }},
      {"list, forward first, cap depth", false, [](int d, int) { return d; }},
      {"list, forward first, cap m", false, [](int, int m) { return m; }},
  };
  for (const Variant& v : kVariants) {
    ListPolicy policy{v.backward_first, caps([&](int d) { return v.cap(d, m); })};
    add(v.label, list_schedule(r, part, plan.micro_batch_size, m, policy));
  }
  if (options.empty()) return Error{"luo scheduler: no valid order for this plan"};
  std::optional<Candidate> best;
  std::string best_label;
  std::optional<Error> first_error;
  for (Option& o : options) {
    plan.schedule = std::move(o.schedule);
    Result<TaskGraph> g = lower_plan(r, plan);
    if (!g) {
      if (!first_error) first_error = g.error();
      continue;
    }
    Candidate c;
    c.graph = std::move(*g);
    if (Status s = score(r, c); !s) return s.error();
    // Faster by more than rounding (1e-9): on a tie the earlier option (1F1B first) stays.
    const bool better = !best || (c.fits && !best->fits) ||
                        (c.fits == best->fits && c.analytic < best->analytic * (1 - 1e-9));
    if (better) {
      c.plan = plan;
      best = std::move(c);
      best_label = o.label;
    }
  }
  if (!best) return *first_error;
  best->plan.schedule_name = "luo";
  if (chosen) *chosen = best_label;
  return std::move(*best);
}

}  // namespace pipegrid
