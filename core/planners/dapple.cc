// dapple: a DAPPLE-style planner (Fan et al., PPoPP'21, "DAPPLE: A Pipelined Data Parallel Approach for
// Training Large Models"; docs/reference/papers.md gives only its outline: pipeline + data-parallel
// stages, early backward scheduling, topology-aware device placement). Our interpretation, named so:
//
// - Stages are contiguous ranges of the workload's topological order, coarsened to at most kBlocks
//   blocks of about equal compute (a stage boundary falls between blocks). Each stage runs on a group
//   of c devices (data-parallel replicas, each taking b / c samples of a micro-batch of b; c divides b,
//   as replicas of a real data loader take whole samples).
// - Devices are placed machine by machine (a machine = the devices sharing Cluster::machine_of) with
//   DAPPLE's three policies, applied to the devices still free when the stage is placed:
//     fresh-first:   GPUs from machines nothing uses yet first (a stage's all-reduce stays inside a
//                    machine, stages spread over machines);
//     append-first:  GPUs from machines already in use first (neighbouring stages share a machine,
//                    activations cross fast links);
//     scatter-first: GPUs evenly from every machine with free GPUs (round robin).
//   Inside a machine the policy takes its free devices in index order: like DAPPLE, the planner sees
//   machines, not the links between the GPUs of a machine (a DGX-1's cube-mesh is not looked at).
// - A dynamic programme over (first layer block of the remaining pipeline, stages after it, devices
//   used per machine) builds the pipeline from its last stage backwards, so a stage knows how many
//   stages follow it (its 1F1B in-flight micro-batches, min(m, stages from it to the end), for the
//   memory check) and which devices the next stage uses (for the activation transfer). A stage's cost
//   per micro-batch: the slowest replica's forward + backward, plus the activation sent to the next
//   stage and the gradient received from it (latency + bytes / (replicas x route bandwidth), over the
//   routes the replicas use), plus its ring all-reduce and optimizer step amortised over m. Each state
//   keeps the plan with the smallest slowest stage, ties by the smallest sum (DAPPLE's latency is a
//   sum over stages plus (m - 1) times its pivot stage); a state's value also depends on the devices
//   of its first stage, which the state does not hold, so the programme is a heuristic, not exact.
// - Every stage count's best plan is estimated as sum + (m - 1) x slowest (DAPPLE's warm-up + steady
//   phases), the best kFinalists are lowered with 1F1B and timed by the analytic evaluator, and the
//   judge (SimGrid from the CLI) times the best kDappleJudged; the fastest that fits memory wins.
// - Schedule: DAPPLE's early backward scheduling starts a stage's backward passes as soon as its
//   warm-up forwards (stage i of p: p - i forwards in flight) are done and then alternates one forward
//   and one backward: that is the `1f1b` schedule table's order (PipeDream-Flush), which is used.
//   A schedule given in the strategy (`schedule:`) replaces it.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "core/collectives.h"
#include "core/partitioners/common.h"
#include "core/planners/block_profile.h"
#include "core/planners/common.h"

namespace pipegrid {
namespace {

constexpr int kBlocks = 32;  // layer blocks the stage boundaries choose from
// Device-usage states (product over machines of their sizes + 1); above, the machines are planned as
// one (the policies then coincide), e.g. a cluster whose every device is its own machine.
constexpr long long kMaxStates = 1024;  // 3 DGX-1 (9^3 = 729) keep their machines; 4 (6561) do not
constexpr size_t kFinalists = 6, kDappleJudged = 3;

enum Policy { FreshFirst, AppendFirst, ScatterFirst };
constexpr const char* kPolicyNames[] = {"fresh-first", "append-first", "scatter-first"};

struct Machines {
  std::vector<std::vector<int>> devices;  // per machine, its devices in index order
  std::vector<long long> radix;           // state encoding: used counts, machine 0 fastest
  long long states = 1;
};

Machines group_machines(const Cluster& c) {
  Machines m;
  std::map<std::string, int> index;
  for (int d = 0; d < static_cast<int>(c.devices.size()); ++d) {
    auto [it, fresh] = index.emplace(c.machine_of(d), static_cast<int>(m.devices.size()));
    if (fresh) m.devices.emplace_back();
    m.devices[it->second].push_back(d);
  }
  long long states = 1;  // saturates above kMaxStates (a product over many machines overflows)
  for (const auto& g : m.devices)
    states = std::min(states * (static_cast<long long>(g.size()) + 1), kMaxStates + 1);
  if (states > kMaxStates) {  // e.g. every device its own machine: the policies coincide anyway
    std::vector<int> all(c.devices.size());
    for (size_t d = 0; d < all.size(); ++d) all[d] = static_cast<int>(d);
    m.devices = {all};
  }
  m.states = 1;
  for (const auto& g : m.devices) {
    m.radix.push_back(m.states);
    m.states *= static_cast<long long>(g.size()) + 1;
  }
  return m;
}

// Devices for a stage of `count` GPUs when `used` (per machine) are taken by the stages after it. The
// pipeline is built from its end, so each machine's used devices are its last ones and a stage takes
// the highest free ones: the first stage ends on the lowest indices. Empty if not enough are free.
std::vector<int> allocate(const Machines& m, const std::vector<int>& used, int count, Policy policy,
                          std::vector<int>& used_after) {
  const int M = static_cast<int>(m.devices.size());
  std::vector<int> take(M, 0);
  auto free_of = [&](int i) { return static_cast<int>(m.devices[i].size()) - used[i] - take[i]; };
  int need = count;
  if (policy == ScatterFirst) {
    bool progress = true;
    while (need > 0 && progress) {
      progress = false;
      for (int i = M - 1; i >= 0 && need > 0; --i)
        if (free_of(i) > 0) {
          ++take[i];
          --need;
          progress = true;
        }
    }
  } else {
    // Machines in the preferred class first, then the others; highest machine first in each (the
    // pipeline's end sits on the last machine).
    for (int pass = 0; pass < 2 && need > 0; ++pass)
      for (int i = M - 1; i >= 0 && need > 0; --i) {
        const bool fresh = used[i] == 0;
        const bool preferred = policy == FreshFirst ? fresh : !fresh;
        if (preferred != (pass == 0)) continue;
        const int t = std::min(need, free_of(i));
        take[i] += t;
        need -= t;
      }
  }
  if (need > 0) return {};
  std::vector<int> out;
  used_after = used;
  for (int i = 0; i < M; ++i) {
    const int free_end = static_cast<int>(m.devices[i].size()) - used[i];
    for (int x = free_end - take[i]; x < free_end; ++x) out.push_back(m.devices[i][x]);
    used_after[i] += take[i];
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct DappleState {
  double slowest = kInfinity, sum = kInfinity;
  std::vector<int> devices;   // of the first stage of this suffix
  int next_block = -1;        // where the stage after it starts (n: none)
  long long next_state = -1;  // device usage of the suffix after the first stage
  Policy policy = FreshFirst;
  double stage_time = 0;
};

struct Stages {
  std::vector<std::pair<int, int>> blocks;  // [first, last) block of each stage
  std::vector<std::vector<int>> devices;
  std::vector<Policy> policies;
  std::vector<double> times;
  double slowest = 0, estimate = 0;
};

// The planner: the layer blocks and their profile (shared by every micro-batching), the programme of
// one micro-batching (the compute table, device classes and the states), and the finalists.
class DapplePlanner {
 public:
  DapplePlanner(const PlanRequest& r, const ScheduleStrategy& schedule)
      : r_(r),
        w_(r.workload),
        cl_(r.cluster),
        D_(static_cast<int>(r.cluster.devices.size())),
        schedule_(schedule),
        gpipe_(schedule.name == "gpipe"),
        order_(topological_order(r.workload)),
        route_(r.cluster),
        machines_(group_machines(r.cluster)),
        M_(static_cast<int>(machines_.devices.size())) {}

  // Blocks: one per layer up to kBlocks layers; else the order cut where the running compute (on
  // device 0, one sample) passes k / kBlocks of the total (zero-cost layers join their neighbours).
  Status init() {
    Result<std::vector<int>> start = compute_blocks(w_, order_, cl_.devices[0], kBlocks);
    if (!start) return Error{"dapple: " + start.error().message};
    profile_.emplace(w_, order_, std::move(*start));
    B_ = profile_->blocks();
    return {};
  }

  // Every micro-batching's programme; its complete plans become options.
  Status explore() {
    for (MicroBatching mb : r_.micro_batchings) {
      Result<std::vector<Stages>> plans = plan_micro_batching(mb);
      if (!plans) return plans.error();
      for (Stages& p : *plans) options_.push_back({mb, std::move(p)});
    }
    if (route_.error()) return *route_.error();
    return {};
  }

  // The best estimates over every micro-batch size, lowered and evaluated; the winner.
  Result<Plan> choose(std::chrono::steady_clock::time_point t0);

 private:
  struct Option {
    MicroBatching mb;
    Stages stages;
  };
  // What a stage on `devs` followed by a stage on `next` (empty: none) costs besides its compute, per
  // micro-batch: the activation sent and the gradient received at the boundary, and the all-reduce.
  struct Fixed {
    std::vector<int> classes;
    double capacity = kInfinity, transfer = 0;
    LinkCost ring;  // the replicas' all-reduce ring, its slowest hop
  };
  using States = std::vector<std::vector<std::map<long long, DappleState>>>;

  Result<std::vector<Stages>> plan_micro_batching(MicroBatching mb);
  Status times_for(int c);
  void find_classes();
  Fixed fixed_costs(const std::vector<int>& devs, const std::vector<int>& next, int j);
  double stage_cost(int i, int j, int c, const Fixed& f, int after, double big) const;
  Status expand(int k, int j, long long s, const DappleState& from);
  void extend(int k, int j, long long s, const DappleState& from, const std::vector<int>& devs, long long s2,
              Policy pol);
  std::vector<Stages> complete_plans() const;
  Result<Candidate> lower_option(const Option& o, std::string& label);

  std::vector<int> decode(long long s) const {
    std::vector<int> u(M_);
    for (int i = 0; i < M_; ++i)
      u[i] = s / machines_.radix[i] % (static_cast<int>(machines_.devices[i].size()) + 1);
    return u;
  }
  long long encode(const std::vector<int>& u) const {
    long long s = 0;
    for (int i = 0; i < M_; ++i) s += u[i] * machines_.radix[i];
    return s;
  }

  const PlanRequest& r_;
  const Workload& w_;
  const Cluster& cl_;
  const int D_;
  const ScheduleStrategy& schedule_;
  const bool gpipe_;
  const std::vector<int> order_;
  RouteCache route_;  // routes of the pairs the search asks about, computed once each
  const Machines machines_;
  const int M_;
  std::optional<BlockProfile> profile_;
  int B_ = 0;
  long long explored_ = 0;
  std::vector<Option> options_;
  // The programme of the micro-batching being planned.
  MicroBatching mb_;
  // time_[c][d][k]: prefix over blocks of F + B on device d at b / c samples.
  std::vector<std::vector<std::vector<double>>> time_;
  std::vector<int> rep_;  // per device, the first device of its class
  // best_[k][j][s]: k stages covering blocks [j, B) on the devices of usage state s (reached states).
  States best_;
};

Result<std::vector<Stages>> DapplePlanner::plan_micro_batching(MicroBatching mb) {
  mb_ = mb;
  time_.assign(D_ + 1, {});
  if (Status st = times_for(1); !st) return st.error();
  find_classes();
  const int P = std::min(D_, B_);  // stages at most
  best_.assign(P + 1, std::vector<std::map<long long, DappleState>>(B_ + 1));
  best_[0][B_][0] = DappleState{0, 0, {}, -1, -1, FreshFirst, 0};
  for (int k = 0; k < P; ++k)
    for (int j = B_; j >= 1; --j)
      for (const auto& [s, from] : best_[k][j])
        if (Status st = expand(k, j, s, from); !st) return st.error();
  return complete_plans();
}

// time_[c], each block's layers summed first, then added to the prefix.
Status DapplePlanner::times_for(int c) {
  if (!time_[c].empty()) return {};
  const std::vector<int>& start = profile_->starts();
  time_[c].assign(D_, std::vector<double>(B_ + 1, 0));
  for (int d = 0; d < D_; ++d)
    for (int k = 0; k < B_; ++k) {
      double t = 0;
      for (int q = start[k]; q < start[k + 1]; ++q) {
        Result<PassTimes> pt =
            device_layer_times(w_.layer(order_[q]), w_.precision, cl_.devices[d], mb_.size / c);
        if (!pt) return Error{fmt::format("dapple: on {}: {}", cl_.devices[d].name, pt.error().message)};
        t += pt->forward + pt->backward();
      }
      time_[c][d][k + 1] = time_[c][d][k] + t;
    }
  return {};
}

// Devices with the same times and memory (class representatives): a stage's slowest replica is found
// among its distinct classes only.
void DapplePlanner::find_classes() {
  rep_.assign(D_, 0);
  for (int d = 0; d < D_; ++d) {
    rep_[d] = d;
    for (int e = 0; e < d; ++e)
      if (rep_[e] == e && time_[1][e] == time_[1][d] &&
          cl_.devices[e].spec.usable_memory() == cl_.devices[d].spec.usable_memory()) {
        rep_[d] = e;
        break;
      }
  }
}

DapplePlanner::Fixed DapplePlanner::fixed_costs(const std::vector<int>& devs, const std::vector<int>& next,
                                                int j) {
  Fixed f;
  const int c = static_cast<int>(devs.size());
  for (int d : devs) {
    f.capacity = std::min(f.capacity, cl_.devices[d].spec.usable_memory());
    if (std::find(f.classes.begin(), f.classes.end(), rep_[d]) == f.classes.end())
      f.classes.push_back(rep_[d]);
  }
  if (!next.empty()) {
    const int c2 = static_cast<int>(next.size()), k = std::max(c, c2);
    const double bytes = profile_->cut(j) * mb_.size / k;
    for (int x = 0; x < k; ++x) {
      const int a = devs[x % c], b = next[x % c2];
      if (a != b)
        f.transfer =
            std::max(f.transfer, route_(a, b).transfer_time(bytes) + route_(b, a).transfer_time(bytes));
    }
  }
  f.ring = route_.ring(devs);
  return f;
}

// Stage [i, j) on c devices (their fixed costs f), `after` stages after it; `big` the largest output
// in [i, j). Infinite when it does not fit memory.
double DapplePlanner::stage_cost(int i, int j, int c, const Fixed& f, int after, double big) const {
  const BlockProfile& pr = *profile_;
  const int m = mb_.count;
  double t = 0, step = 0;
  for (int d : f.classes) {
    t = std::max(t, time_[c][d][j] - time_[c][d][i]);
    step = std::max(step, device_step_time(w_, pr.parameters(i, j), r_.memory, cl_.devices[d]));
  }
  MemoryBytes st = static_memory(pr.parameters(i, j), pr.parameter_bytes(i, j), r_.memory);
  if (r_.memory.zero1) st[static_cast<int>(MemoryCategory::OptimizerState)] /= c;
  const int in_flight = gpipe_ ? m : std::min(after + 1, m);
  if (pipegrid::total(st) + (in_flight * pr.stash(i, j) + big) * (mb_.size / c) > f.capacity)
    return kInfinity;
  t += f.transfer;
  if (c > 1) t += closed_form::ring_allreduce(c, pr.parameter_bytes(i, j), f.ring) / m;
  return t + step / m;
}

// Every stage prepended to state (k stages from block j, usage s): each replica count that takes
// whole samples, each policy's devices (once per distinct set).
Status DapplePlanner::expand(int k, int j, long long s, const DappleState& from) {
  const std::vector<int> used = decode(s);
  int free = D_;
  for (int u : used) free -= u;
  for (int c = 1; c <= free; ++c) {
    if (std::fmod(mb_.size, c) != 0) continue;  // replicas take whole samples
    if (Status st = times_for(c); !st) return st;
    std::vector<std::vector<int>> seen;
    for (Policy pol : {FreshFirst, AppendFirst, ScatterFirst}) {
      std::vector<int> used_after;
      std::vector<int> devs = allocate(machines_, used, c, pol, used_after);
      if (devs.empty() || std::find(seen.begin(), seen.end(), devs) != seen.end()) continue;
      seen.push_back(devs);
      extend(k, j, s, from, devs, encode(used_after), pol);
    }
  }
  return {};
}

// The stages [i, j) on `devs` (usage s2 with them), longest last: a longer stage needs more memory.
void DapplePlanner::extend(int k, int j, long long s, const DappleState& from, const std::vector<int>& devs,
                           long long s2, Policy pol) {
  const int c = static_cast<int>(devs.size());
  const Fixed f = fixed_costs(devs, from.devices, j);
  double big = 0;
  for (int i = j - 1; i >= 0; --i) {
    ++explored_;
    big = std::max(big, profile_->largest_output(i));
    const double t = stage_cost(i, j, c, f, k, big);
    if (t == kInfinity) break;
    const double slowest = std::max(from.slowest, t), sum = from.sum + t;
    DappleState& to = best_[k + 1][i][s2];
    if (better(slowest, sum, to)) to = DappleState{slowest, sum, devs, j, s, pol, t};
  }
}

// Every stage count's best complete plan.
std::vector<Stages> DapplePlanner::complete_plans() const {
  std::vector<Stages> plans;
  for (int k = 1; k < static_cast<int>(best_.size()); ++k) {
    const DappleState* top = nullptr;
    long long arg = -1;
    for (const auto& [s, e] : best_[k][0])
      if (!top || better(e.slowest, e.sum, *top)) top = &e, arg = s;
    if (!top) continue;
    Stages p;
    p.slowest = top->slowest;
    p.estimate = top->sum + (mb_.count - 1) * p.slowest;
    int j = 0;
    long long s = arg;
    for (int left = k; left > 0; --left) {
      const DappleState& e = best_[left][j].at(s);
      p.blocks.push_back({j, e.next_block});
      p.devices.push_back(e.devices);
      p.policies.push_back(e.policy);
      p.times.push_back(e.stage_time);
      j = e.next_block;
      s = e.next_state;
    }
    plans.push_back(std::move(p));
  }
  return plans;
}

// An option lowered with the schedule and scored; `label` describes it.
Result<Candidate> DapplePlanner::lower_option(const Option& o, std::string& label) {
  const Stages& p = o.stages;
  const int S = static_cast<int>(p.blocks.size());
  const std::vector<int>& start = profile_->starts();
  std::vector<std::pair<int, int>> ranges;
  for (int st = 0; st < S; ++st) ranges.emplace_back(start[p.blocks[st].first], start[p.blocks[st].second]);
  Result<Partition> part = contiguous_stages(w_, order_, ranges, p.devices, D_);
  if (!part) return part.error();
  part->plan.predicted_time_per_stage_s = p.slowest;
  part->plan.predicted_stage_time_s = p.times;
  Candidate c;
  c.plan.partition = std::move(*part);
  c.plan.micro_batch_size = o.mb.size;
  c.plan.micro_batches = o.mb.count;
  c.plan.schedule_name = std::string(schedule_.name);
  if (Status st = schedule_and_score(r_, schedule_, c); !st) return st.error();
  std::string shape, pols;
  for (int st = 0; st < S; ++st) {
    shape += fmt::format("{}{}x{}", st ? " " : "", start[p.blocks[st].second] - start[p.blocks[st].first],
                         p.devices[st].size());
    pols += fmt::format("{}{}", st ? "/" : "", kPolicyNames[p.policies[st]]);
  }
  label = fmt::format("{}, {} stages (layers x replicas: {}; {})", micro_batching_text(o.mb), S, shape, pols);
  return c;
}

Result<Plan> DapplePlanner::choose(std::chrono::steady_clock::time_point t0) {
  std::stable_sort(options_.begin(), options_.end(),
                   [](const Option& a, const Option& b) { return a.stages.estimate < b.stages.estimate; });
  std::vector<Candidate> scored;
  std::vector<std::string> labels;
  for (size_t x = 0; x < options_.size() && x < kFinalists; ++x) {
    std::string label;
    Result<Candidate> c = lower_option(options_[x], label);
    if (!c) return c.error();
    labels.push_back(std::move(label));
    scored.push_back(std::move(*c));
  }
  const double search = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (scored.empty())
    return Error{fmt::format("dapple: no plan fits the devices' memory ({} micro-batch sizes tried)",
                             r_.micro_batchings.size())};
  Result<size_t> best = pick(scored, std::vector<char>(scored.size(), 0), r_, kDappleJudged);
  if (!best) return best.error();
  Candidate& win = scored[*best];
  win.plan.exploration = fmt::format(
      "dapple explored {} stage placements ({} layer blocks, {} machines, policies fresh-first, "
      "append-first, scatter-first; {} micro-batch sizes), {} complete plans; the best {} by its estimate "
      "analytically evaluated{}; chosen: {} ({} {:.6g} s{})",
      explored_, B_, M_, r_.micro_batchings.size(), options_.size(), scored.size(),
      r_.judge ? fmt::format(", the best {} judged by {}", kDappleJudged, r_.judge->name()) : "",
      labels[*best], r_.judge ? r_.judge->name() : "analytic", win.judged, win.fits ? "" : ", over memory");
  win.plan.planning_seconds = search;
  win.plan.partition.plan.search_seconds = search;
  return std::move(win.plan);
}

}  // namespace

Result<Plan> plan_dapple(const PlanRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  auto schedule = find_schedule(r.strategy.schedule_given ? r.strategy.schedule : "1f1b");
  if (!schedule) return schedule.error();
  DapplePlanner planner(r, **schedule);
  if (Status s = planner.init(); !s) return s.error();
  if (Status s = planner.explore(); !s) return s.error();
  return planner.choose(t0);
}

}  // namespace pipegrid
