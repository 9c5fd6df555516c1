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

Status validate_schedule(const Schedule& s, const Partition& p, int m,
                         const std::vector<std::string>& names) {
  const size_t D = names.size();
  if (s.device_actions.size() > D)
    return Error{fmt::format("invalid schedule: it has {} device rows, the cluster has {} devices",
                             s.device_actions.size(), D)};
  auto fail = [&](size_t d, size_t i, const std::string& what) {
    return Error{fmt::format("{}invalid schedule: on {}, {}\n{}", s.location(d, i), names[d], what,
                             mark_action(s.device_actions[d], i, names[d]))};
  };
  // The stages each device hosts, and while a device is checked, each hosted stage's slot in `seen`
  // (-1: not hosted there). Linear in the actions and the stages' device lists, with no string built
  // unless something is wrong (1F1B at p = 128, m = 1,024 has 262,144 actions to check).
  std::vector<std::vector<int>> hosted(D);
  for (size_t stage = 0; stage < p.stage_count(); ++stage)
    for (int d : p.stage(stage).devices)
      if (d >= 0 && static_cast<size_t>(d) < D &&
          (hosted[d].empty() || hosted[d].back() != static_cast<int>(stage)))
        hosted[d].push_back(static_cast<int>(stage));
  std::vector<int> slot(p.stage_count(), -1);
  std::vector<uint8_t> seen;  // per (hosted stage, micro-batch): bit 0 F seen, bit 1 B seen, bit 2 W seen
  for (size_t d = 0; d < s.device_actions.size(); ++d) {
    const auto& acts = s.device_actions[d];
    for (size_t k = 0; k < hosted[d].size(); ++k) slot[hosted[d][k]] = static_cast<int>(k);
    seen.assign(hosted[d].size() * static_cast<size_t>(std::max(m, 0)), 0);
    for (size_t i = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      if (a.stage < 0 || static_cast<size_t>(a.stage) >= p.stage_count())
        return fail(d, i,
                    fmt::format("{} names stage {}, but there are {} stages", to_string(a), a.stage,
                                p.stage_count()));
      if (slot[a.stage] < 0) {
        std::string where;
        for (int x : p.stage(a.stage).devices)
          where += fmt::format("{}{}", where.empty() ? "" : ", ", names[x]);
        return fail(d, i, fmt::format("{}: stage {} runs on {}", to_string(a), a.stage, where));
      }
      if (a.micro_batch < 0 || a.micro_batch >= m)
        return fail(d, i,
                    fmt::format("{} names micro-batch {}, but there are {} micro-batches", to_string(a),
                                a.micro_batch, m));
      if (a.pass == Pass::Weight && !s.split_backward)
        return fail(d, i,
                    fmt::format("{} is a weight-gradient pass, but the backward is not split", to_string(a)));
      uint8_t& st = seen[static_cast<size_t>(slot[a.stage]) * static_cast<size_t>(m) +
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
    }
    // Completeness: every stage hosted here runs every pass of every micro-batch.
    const int want = s.split_backward ? 7 : 3;
    for (size_t h = 0; h < hosted[d].size(); ++h) {
      const int stage = hosted[d][h];
      for (int k = 0; k < m; ++k) {
        const int have = seen[h * static_cast<size_t>(m) + static_cast<size_t>(k)];
        if (have == want) continue;
        Pass miss = !(have & 1) ? Pass::Forward : !(have & 2) ? Pass::Backward : Pass::Weight;
        return Error{fmt::format("invalid schedule: {} hosts stage {} but never runs {}", names[d], stage,
                                 to_string(Action{stage, miss, k}))};
      }
    }
    for (int stage : hosted[d]) slot[stage] = -1;
  }
  for (size_t stage = 0; stage < p.stage_count(); ++stage)
    for (int d : p.stage(stage).devices)
      if (static_cast<size_t>(d) >= s.device_actions.size() || s.device_actions[d].empty())
        return Error{fmt::format("invalid schedule: {} hosts stage {} but has no actions", names[d], stage)};
  // Replicas of a stage split each micro-batch: they must run that stage's actions in one order.
  for (size_t stage = 0; stage < p.stage_count(); ++stage) {
    const auto& devs = p.stage(stage).devices;
    auto order_of = [&](int d) {
      std::vector<std::pair<size_t, Action>> out;  // (position in the device's list, action)
      for (size_t i = 0; i < s.device_actions[d].size(); ++i)
        if (s.device_actions[d][i].stage == static_cast<int>(stage))
          out.emplace_back(i, s.device_actions[d][i]);
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
            s.location(devs[r], other[k].first), stage, names[devs.front()], names[devs[r]], names[devs[r]],
            to_string(other[k].second), names[devs.front()], to_string(first[k].second),
            mark_action(s.device_actions[devs[r]], other[k].first, names[devs[r]]))};
      }
    }
  }
  return {};
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
