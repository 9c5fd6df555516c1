#include "core/validate.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/executor.h"

namespace pipegrid {

std::string mark_action(const std::vector<Action>& actions, size_t index, const std::string& device_name) {
  constexpr size_t kContext = 8;
  std::string out = "  " + device_name + ":";
  const size_t lo = index > kContext ? index - kContext : 0;
  const size_t hi = std::min(actions.size(), index + kContext + 1);
  if (lo > 0) out += " ...";
  for (size_t i = lo; i < hi; ++i)
    out +=
        i == index ? fmt::format(" [{}]", to_string(actions[i])) : fmt::format(" {}", to_string(actions[i]));
  if (hi < actions.size()) out += " ...";
  return out;
}

namespace {

// The checks of validate_schedule, device by device, then across the devices.
class ScheduleCheck {
 public:
  ScheduleCheck(const Schedule& s, const Partition& p, int m, const std::vector<std::string>& names)
      : s_(s), p_(p), m_(m), names_(names), D_(names.size()) {}

  Status run() {
    if (s_.device_actions.size() > D_)
      return Error{fmt::format("invalid schedule: it has {} device rows, the cluster has {} devices",
                               s_.device_actions.size(), D_)};
    find_hosted();
    for (size_t d = 0; d < s_.device_actions.size(); ++d)
      if (Status st = check_device(d); !st) return st;
    for (size_t stage = 0; stage < p_.stage_count(); ++stage)
      for (int d : p_.stage(stage).devices)
        if (static_cast<size_t>(d) >= s_.device_actions.size() || s_.device_actions[d].empty())
          return Error{
              fmt::format("invalid schedule: {} hosts stage {} but has no actions", names_[d], stage)};
    for (size_t stage = 0; stage < p_.stage_count(); ++stage)
      if (Status st = check_replica_order(stage); !st) return st;
    return {};
  }

 private:
  Error fail(size_t d, size_t i, const std::string& what) const {
    return Error{fmt::format("{}invalid schedule: on {}, {}\n{}", s_.location(d, i), names_[d], what,
                             mark_action(s_.device_actions[d], i, names_[d]))};
  }

  // The stages each device hosts. While a device is checked, each hosted stage's slot in `seen_`
  // (-1: not hosted there). Linear in the actions and the stages' device lists, with no string built
  // unless something is wrong (1F1B at p = 128, m = 1,024 has 262,144 actions to check).
  void find_hosted() {
    hosted_.assign(D_, {});
    for (size_t stage = 0; stage < p_.stage_count(); ++stage)
      for (int d : p_.stage(stage).devices)
        if (d >= 0 && static_cast<size_t>(d) < D_ &&
            (hosted_[d].empty() || hosted_[d].back() != static_cast<int>(stage)))
          hosted_[d].push_back(static_cast<int>(stage));
    slot_.assign(p_.stage_count(), -1);
  }

  Status check_device(size_t d) {
    const auto& acts = s_.device_actions[d];
    for (size_t k = 0; k < hosted_[d].size(); ++k) slot_[hosted_[d][k]] = static_cast<int>(k);
    seen_.assign(hosted_[d].size() * static_cast<size_t>(std::max(m_, 0)), 0);
    for (size_t i = 0; i < acts.size(); ++i)
      if (Status st = check_action(d, i); !st) return st;
    if (Status st = check_complete(d); !st) return st;
    for (int stage : hosted_[d]) slot_[stage] = -1;
    return {};
  }

  // Action i of device d: a stage hosted there, a micro-batch that exists, once, after the passes it
  // needs.
  Status check_action(size_t d, size_t i) {
    const Action& a = s_.device_actions[d][i];
    if (a.stage < 0 || static_cast<size_t>(a.stage) >= p_.stage_count())
      return fail(
          d, i,
          fmt::format("{} names stage {}, but there are {} stages", to_string(a), a.stage, p_.stage_count()));
    if (slot_[a.stage] < 0) {
      std::string where;
      for (int x : p_.stage(a.stage).devices)
        where += fmt::format("{}{}", where.empty() ? "" : ", ", names_[x]);
      return fail(d, i, fmt::format("{}: stage {} runs on {}", to_string(a), a.stage, where));
    }
    if (a.micro_batch < 0 || a.micro_batch >= m_)
      return fail(d, i,
                  fmt::format("{} names micro-batch {}, but there are {} micro-batches", to_string(a),
                              a.micro_batch, m_));
    if (!p_.stage(a.stage).runs(a.micro_batch, m_))
      return fail(d, i,
                  fmt::format("{}: stage {} runs the {} half of the {} micro-batches (DualPipe's two "
                              "pipelines), not micro-batch {}",
                              to_string(a), a.stage, p_.stage(a.stage).route == 1 ? "first" : "second", m_,
                              a.micro_batch));
    if (const Stage& st = p_.stage(a.stage); st.round_robin && st.replicas() > 1) {
      const int j = replica_on(a.stage, d);
      if (!st.runs_on(j, a.micro_batch, m_))
        return fail(d, i,
                    fmt::format("{}: stage {}'s {} replicas take whole micro-batches in turn (round-robin), "
                                "and micro-batch {} is replica {}'s, not {}'s (replica {})",
                                to_string(a), a.stage, st.replicas(), a.micro_batch,
                                a.micro_batch % st.replicas(), names_[d], j));
    }
    if (a.pass == Pass::Weight && !s_.split_backward)
      return fail(d, i,
                  fmt::format("{} is a weight-gradient pass, but the backward is not split", to_string(a)));
    uint8_t& st = seen_[static_cast<size_t>(slot_[a.stage]) * static_cast<size_t>(m_) +
                        static_cast<size_t>(a.micro_batch)];
    const int bit = 1 << static_cast<int>(a.pass);
    if (st & bit) return fail(d, i, fmt::format("{} appears twice", to_string(a)));
    if (a.pass == Pass::Backward && !(st & 1))
      return fail(d, i,
                  fmt::format("{} comes before its forward {}", to_string(a),
                              to_string({a.stage, Pass::Forward, a.micro_batch})));
    if (a.pass == Pass::Weight && !(st & 2))
      return fail(d, i,
                  fmt::format("{} comes before its backward {}", to_string(a),
                              to_string({a.stage, Pass::Backward, a.micro_batch})));
    st = static_cast<uint8_t>(st | bit);
    return {};
  }

  // Completeness: every stage hosted on d runs every pass of every micro-batch.
  Status check_complete(size_t d) const {
    const int want = s_.split_backward ? 7 : 3;
    for (size_t h = 0; h < hosted_[d].size(); ++h) {
      const int stage = hosted_[d][h];
      for (int k = 0; k < m_; ++k) {
        const int have = seen_[h * static_cast<size_t>(m_) + static_cast<size_t>(k)];
        if (have == want || !p_.stage(stage).runs_on(replica_on(stage, d), k, m_)) continue;
        Pass miss = !(have & 1) ? Pass::Forward : !(have & 2) ? Pass::Backward : Pass::Weight;
        // A schedule read from a file: its row (at its last action), and the micro-batch count it
        // must cover, which comes from the experiment, not the file.
        const size_t actions = d < s_.positions.size() ? s_.positions[d].size() : 0;
        const std::string where = actions > 0 ? s_.location(d, actions - 1)
                                  : s_.source.empty()
                                      ? ""
                                      : fmt::format("{}: row {} (empty or missing): ", s_.source, d + 1);
        return Error{fmt::format(
            "{}invalid schedule: {} hosts stage {} but never runs {}{}", where, names_[d], stage,
            to_string(Action{stage, miss, k}),
            s_.source.empty() ? "" : fmt::format(" (each row runs each of the {} micro-batches)", m_))};
      }
    }
    return {};
  }

  // The replica of `stage` that device d is (its position over t x cp); 0 when the stage is not
  // round-robin (runs_on ignores it then).
  int replica_on(int stage, size_t d) const {
    const Stage& st = p_.stage(stage);
    if (!st.round_robin) return 0;
    const auto at = std::find(st.devices.begin(), st.devices.end(), static_cast<int>(d));
    return static_cast<int>(at - st.devices.begin()) / (st.tensor_parallel * st.context_parallel);
  }

  // Replicas of a stage split each micro-batch: they must run that stage's actions in one order.
  // Round-robin replicas run different micro-batches, each in its own order.
  Status check_replica_order(size_t stage) const {
    if (p_.stage(stage).round_robin) return {};
    const auto& devs = p_.stage(stage).devices;
    auto order_of = [&](int d) {
      std::vector<std::pair<size_t, Action>> out;  // (position in the device's list, action)
      for (size_t i = 0; i < s_.device_actions[d].size(); ++i)
        if (s_.device_actions[d][i].stage == static_cast<int>(stage))
          out.emplace_back(i, s_.device_actions[d][i]);
      return out;
    };
    const auto first = order_of(devs.front());
    for (size_t r = 1; r < devs.size(); ++r) {
      const auto other = order_of(devs[r]);
      for (size_t k = 0; k < first.size() && k < other.size(); ++k) {
        if (first[k].second == other[k].second) continue;
        return Error{fmt::format(
            "{}invalid schedule: stage {} runs on {} and {}, which disagree on its order: {} runs "
            "{} where {} runs {}\n{}",
            s_.location(devs[r], other[k].first), stage, names_[devs.front()], names_[devs[r]],
            names_[devs[r]], to_string(other[k].second), names_[devs.front()], to_string(first[k].second),
            mark_action(s_.device_actions[devs[r]], other[k].first, names_[devs[r]]))};
      }
    }
    return {};
  }

  const Schedule& s_;
  const Partition& p_;
  const int m_;
  const std::vector<std::string>& names_;
  const size_t D_;
  std::vector<std::vector<int>> hosted_;
  std::vector<int> slot_;
  std::vector<uint8_t> seen_;  // per (hosted stage, micro-batch): bit 0 F seen, bit 1 B seen, bit 2 W seen
};

}  // namespace

Status validate_schedule(const Schedule& s, const Partition& p, int m,
                         const std::vector<std::string>& names) {
  return ScheduleCheck(s, p, m, names).run();
}

namespace {

// Runs every task in zero time: only the order matters.
class SymbolicLauncher : public TaskLauncher {
 public:
  std::vector<int32_t> running;
  void launch(int32_t task, double) override { running.push_back(task); }
};

}  // namespace

std::vector<int32_t> execution_order(const TaskGraph& g) {
  // A topological pass over the dependencies plus each device's order, with no backend and no times;
  // the order is also its queue.
  const size_t n = g.tasks.size();
  std::vector<int32_t> pending;
  reserve_huge(pending, n);
  pending.assign(g.predecessor_count.begin(), g.predecessor_count.end());
  std::vector<uint32_t> cursor(g.device_order.size(), 0);
  std::vector<int32_t> order;
  reserve_huge(order, n);
  auto head_ready = [&](size_t d) {
    if (cursor[d] < g.device_order[d].size() && pending[g.device_order[d][cursor[d]]] == 0)
      order.push_back(g.device_order[d][cursor[d]]);
  };
  for (size_t t = 0; t < n; ++t)
    if (!g.tasks[t].is_compute() && pending[t] == 0) order.push_back(static_cast<int32_t>(t));
  for (size_t d = 0; d < g.device_order.size(); ++d) head_ready(d);
  for (size_t head = 0; head < order.size(); ++head) {
    const int32_t t = order[head];
    for (int32_t s : g.successors(t)) {
      if (--pending[s] != 0) continue;
      const Task& st = g.tasks[s];
      if (!st.is_compute())
        order.push_back(s);
      else if (const auto d = static_cast<size_t>(st.device); d < g.device_order.size() &&
                                                              cursor[d] < g.device_order[d].size() &&
                                                              g.device_order[d][cursor[d]] == s)
        order.push_back(s);
    }
    const Task& task = g.tasks[t];
    if (task.is_compute()) {
      ++cursor[task.device];
      head_ready(static_cast<size_t>(task.device));
    }
  }
  return order;
}

Status check_deadlock_free(const TaskGraph& g, const Schedule& s, const std::vector<std::string>& names) {
  // One breadth-first pass proves freedom; only a graph that fails it is run symbolically again, for
  // the message.
  if (execution_order(g).size() == g.tasks.size()) return {};
  SymbolicLauncher l;
  Executor ex(g, l);
  ex.start();
  while (!l.running.empty()) {
    int32_t t = l.running.back();
    l.running.pop_back();
    ex.finished(t, 0.0);
  }
  if (ex.complete()) return {};
  const auto stuck = ex.stuck();
  std::string msg = fmt::format("{}invalid schedule: it deadlocks; no device can run its marked action",
                                s.location(stuck.front().first, stuck.front().second));
  for (auto [d, pos] : stuck) {
    const std::vector<Action>& actions = s.device_actions[d];
    const int32_t t = g.device_order[d][pos];
    std::string waits;
    for (int32_t b : ex.blockers(t)) {
      const Task& bt = g.tasks[b];
      waits += fmt::format("{}{}", waits.empty() ? "" : ", ", describe_task(bt, names));
    }
    if (pos < actions.size())
      msg += fmt::format("\n{}  (waits for {})", mark_action(actions, pos, names[d]), waits);
    else
      msg += fmt::format("\n  {}: the optimizer step waits for {}", names[d], waits);
  }
  return Error{msg};
}

}  // namespace pipegrid
