// piper: a Piper-style planner; the interpretation is in core/planners/piper.h and docs/piper.md.
#include "core/planners/piper.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

#include "core/lower.h"
#include "core/partitioners/common.h"
#include "core/planners/block_profile.h"
#include "core/planners/common.h"
#include "core/tensor_parallel.h"

namespace pipegrid {
namespace {

constexpr size_t kPiperJudged = 3;
// Stage options the DP may evaluate for one micro-batching; above, a located refusal instead of a
// search of minutes (the DP is blocks^2 x stages x devices x (t, d) options).
constexpr double kPiperMaxSteps = 4e9;

bool splits(TensorSplitKind k) {
  return k == TensorSplitKind::Transformer || k == TensorSplitKind::VocabEmbedding ||
         k == TensorSplitKind::VocabHead || k == TensorSplitKind::ColumnGathered;
}

// Per block prefix sums (and per block maxima) of one (t, share)'s per-device layer costs: a device's
// share of a tensor-parallel group, so not the BlockProfile's per-layer totals (only its cut bytes
// are used).
struct Costs {
  std::vector<double> time, flow, collectives, stash, recompute, parameters, parameter_bytes;  // prefix
  std::vector<double> recompute_max, workspace_max;                                            // per block
};

// Where a stage of (t, d) starting at device a runs: its links and its memory.
struct Place {
  bool ok = false;  // every group of t devices in one machine
  LinkCost tp, dp;  // the slowest hop of its tensor-parallel and of its data-parallel rings
  double capacity = kInfinity;
  double slowdown = 1;  // its slowest device's Device::slowdown (a fault's straggler)
};

struct PiperState {
  double slowest = kInfinity, sum = kInfinity;
  int next_j = -1, next_s = -1, next_k = -1;  // the suffix after this state's first stage
  int t = 1, d = 1;
  double time = 0;
};

// The programme of one micro-batching (piper.h): the layer blocks, the tensor-parallel degrees each
// block allows, the per-(t, share) block costs, the stage placements and the states.
class PiperProgramme {
 public:
  PiperProgramme(const PlanRequest& r, MicroBatching mb)
      : r_(r),
        w_(r.workload),
        cl_(r.cluster),
        D_(static_cast<int>(r.cluster.devices.size())),
        m_(std::max(1, mb.count)),
        mb_(mb),
        tp_options_{r.strategy.sequence_parallel, r.strategy.tp_overlap, {},
                    r.strategy.context,           r.memory.modules,      r.strategy.tp_wgrad_overlap},
        route_(r.cluster),
        gpipe_(r.strategy.schedule_given && r.strategy.schedule == "gpipe") {}

  Status init();
  Status run();
  Result<PiperSolution> solution();

 private:
  // A stage being prepended to the state (j, s, k): its (t, d) on devices from a, what it costs
  // besides its blocks, and the state it reaches.
  struct Prepend {
    int t, d, a, to_s, in_flight;
    double share, transfer;
    const Costs& c;
    const Place& pl;
  };

  void find_machines();
  void find_degrees();
  Result<const Costs*> costs_for(int t, double share);
  Result<std::vector<std::vector<StageCost>>> layer_costs(int t, double share) const;
  const Place& place_of(int a, int t, int d);
  Status check_size() const;
  size_t idx(int s, int j, int k) const { return (static_cast<size_t>(s) * (B_ + 1) + j) * (D_ + 1) + k; }
  Status expand(int j, int s, int k);
  void prepend(int j, int s, int k, const Prepend& x);

  const PlanRequest& r_;
  const Workload& w_;
  const Cluster& cl_;
  const int D_, m_;
  const MicroBatching mb_;
  const TensorParallelOptions tp_options_;
  RouteCache route_;  // each pair's route computed once
  const bool gpipe_;
  std::vector<int> order_;
  int n_ = 0, B_ = 0, cap_ = 0;
  std::optional<BlockProfile> profile_;  // the blocks and the bytes crossing their boundaries
  std::vector<int> machine_;             // per device
  int largest_machine_ = 0;
  // The tensor-parallel degrees: t up to the largest machine; per t, which blocks can run split (every
  // layer has a split and t satisfies Megatron's rules, tensor_parallel_layer decides) and which contain
  // a split layer.
  std::vector<int> degrees_{1};
  std::map<int, std::vector<char>> block_ok_, block_splits_;  // by t
  std::map<int, std::vector<char>> layer_ok_;                 // by t, per position
  std::map<std::pair<int, double>, Costs> cost_cache_;
  std::vector<std::pair<int, int>> options_;  // (t, d): d replicas take whole samples
  std::map<std::tuple<int, int, int>, Place> places_;
  // best_[idx(s, j, k)]: the pipeline over blocks [j, B) on the last k devices, its first stage
  // followed by s stages (capped at cap_).
  std::vector<PiperState> best_;
  long long explored_ = 0;
};

Status PiperProgramme::init() {
  if (D_ == 0) return Error{"piper: the cluster has no devices"};
  order_ = topological_order(w_);
  n_ = static_cast<int>(order_.size());
  if (n_ == 0) return Error{"piper: the workload has no layers"};
  // Blocks of about equal compute (device 0, one sample; identical devices assumed for compute,
  // docs/piper.md) where the model has more than kPiperBlocks layers, as dapple coarsens.
  Result<std::vector<int>> start = compute_blocks(w_, order_, cl_.devices[0], kPiperBlocks);
  if (!start) return Error{"piper: " + start.error().message};
  profile_.emplace(w_, order_, std::move(*start));
  B_ = profile_->blocks();
  find_machines();
  find_degrees();
  for (int t : degrees_)
    for (int d = 1; t * d <= D_; ++d)
      if (whole_samples_per_replica(mb_.size, d)) options_.emplace_back(t, d);
  const int max_stages = std::min(D_, B_);
  cap_ = gpipe_ ? 0 : std::max(0, std::min(m_ - 1, max_stages - 1));
  return check_size();
}

void PiperProgramme::find_machines() {
  std::map<std::string, int> machine_index;
  std::map<int, int> machine_size;
  machine_.resize(D_);
  for (int d = 0; d < D_; ++d) {
    machine_[d] =
        machine_index.emplace(cl_.machine_of(d), static_cast<int>(machine_index.size())).first->second;
    ++machine_size[machine_[d]];
  }
  for (const auto& entry : machine_size) largest_machine_ = std::max(largest_machine_, entry.second);
}

void PiperProgramme::find_degrees() {
  const std::vector<int>& start = profile_->starts();
  for (int t = 2; t <= largest_machine_; ++t) {
    std::vector<char> ok(n_, 0), bok(B_, 1), bsplit(B_, 0);
    bool any = false;
    for (int q = 0; q < n_; ++q) {
      const Layer& l = w_.layer(order_[q]);
      ok[q] = l.split.kind != TensorSplitKind::Undefined &&
              tensor_parallel_layer(l, t, tp_options_, w_.precision).ok();
    }
    for (int k = 0; k < B_; ++k)
      for (int q = start[k]; q < start[k + 1]; ++q) {
        bok[k] = bok[k] && ok[q];
        bsplit[k] = bsplit[k] || splits(w_.layer(order_[q]).split.kind);
      }
    for (int k = 0; k < B_; ++k) any = any || (bok[k] && bsplit[k]);
    if (!any) continue;
    degrees_.push_back(t);
    block_ok_[t] = std::move(bok);
    block_splits_[t] = std::move(bsplit);
    layer_ok_[t] = std::move(ok);
  }
}

// Per-device costs of each layer at (t, samples per replica), from the lowering's stage_costs on a
// partition with one stage per layer (a group of t devices inside a machine; layers that cannot split
// run at t = 1 there and are not used at t).
Result<std::vector<std::vector<StageCost>>> PiperProgramme::layer_costs(int t, double share) const {
  int a = -1;
  for (int x = 0; x + t <= D_ && a < 0; ++x) {
    bool one = true;
    for (int y = x; y < x + t; ++y) one = one && machine_[y] == machine_[x];
    if (one) a = x;
  }
  std::vector<int> stage_of(n_);
  std::vector<std::vector<int>> devices(n_);
  for (int q = 0; q < n_; ++q) {
    stage_of[order_[q]] = q;
    if (t > 1 && layer_ok_.at(t)[q])
      for (int y = a; y < a + t; ++y) devices[q].push_back(y);
    else
      devices[q] = {a};
  }
  Result<Partition> part = make_partition(w_, stage_of, devices, static_cast<size_t>(D_));
  if (!part) return Error{"piper: " + part.error().message};
  for (int q = 0; q < n_; ++q) part->graph[q].tensor_parallel = static_cast<int>(devices[q].size());
  Result<std::vector<std::vector<StageCost>>> sc =
      stage_costs(w_, cl_, *part, share, r_.memory.recompute, tp_options_);
  if (!sc) return Error{"piper: " + sc.error().message};
  return sc;
}

// layer_costs summed per block (prefix sums, and per block maxima).
Result<const Costs*> PiperProgramme::costs_for(int t, double share) {
  auto it = cost_cache_.find({t, share});
  if (it != cost_cache_.end()) return &it->second;
  Result<std::vector<std::vector<StageCost>>> sc = layer_costs(t, share);
  if (!sc) return sc.error();
  const std::vector<int>& start = profile_->starts();
  Costs c;
  for (auto* v :
       {&c.time, &c.flow, &c.collectives, &c.stash, &c.recompute, &c.parameters, &c.parameter_bytes})
    v->assign(B_ + 1, 0);
  c.recompute_max.assign(B_, 0);
  c.workspace_max.assign(B_, 0);
  for (int k = 0; k < B_; ++k) {
    double time = 0, flow = 0, coll = 0, stash = 0, rec = 0, par = 0, pb = 0;
    for (int q = start[k]; q < start[k + 1]; ++q) {
      const StageCost& x = (*sc)[q][0];
      time += x.times.forward + x.times.backward() + x.recompute_s;
      for (const TpProgram* p : {&x.tp_forward, &x.tp_backward})
        for (size_t y = 0; y < p->collectives(); ++y) {
          flow += ring_flow_bytes(p->kinds[y], p->bytes[y], t);
          coll += 1;
        }
      stash += x.stash_bytes;
      rec += x.recompute_bytes;
      par += x.parameters;
      pb += x.parameter_bytes;
      c.recompute_max[k] = std::max(c.recompute_max[k], x.recompute_bytes);
      c.workspace_max[k] = std::max(c.workspace_max[k], x.workspace_bytes);
    }
    c.time[k + 1] = c.time[k] + time;
    c.flow[k + 1] = c.flow[k] + flow;
    c.collectives[k + 1] = c.collectives[k] + coll;
    c.stash[k + 1] = c.stash[k] + stash;
    c.recompute[k + 1] = c.recompute[k] + rec;
    c.parameters[k + 1] = c.parameters[k] + par;
    c.parameter_bytes[k + 1] = c.parameter_bytes[k] + pb;
  }
  return &cost_cache_.emplace(std::make_pair(t, share), std::move(c)).first->second;
}

const Place& PiperProgramme::place_of(int a, int t, int d) {
  auto [it, fresh] = places_.try_emplace({a, t, d});
  if (!fresh) return it->second;
  Place& p = it->second;
  p.ok = true;
  for (int j = 0; j < d && p.ok; ++j)
    for (int q = 1; q < t; ++q) p.ok = p.ok && machine_[a + j * t + q] == machine_[a + j * t];
  if (!p.ok) return p;
  for (int x = a; x < a + t * d; ++x) {
    p.capacity = std::min(p.capacity, cl_.devices[x].spec.usable_memory());
    p.slowdown = std::max(p.slowdown, cl_.devices[x].slowdown);
  }
  std::vector<int> ring;
  for (int j = 0; j < d && t > 1; ++j) {  // each replica's tensor-parallel ring
    ring.clear();
    for (int q = 0; q < t; ++q) ring.push_back(a + j * t + q);
    const LinkCost hop = route_.ring(ring);
    p.tp.add_hop(hop.latency, hop.bandwidth);
  }
  for (int q = 0; q < t && d > 1; ++q) {  // each rank's data-parallel ring over the replicas
    ring.clear();
    for (int j = 0; j < d; ++j) ring.push_back(a + j * t + q);
    const LinkCost hop = route_.ring(ring);
    p.dp.add_hop(hop.latency, hop.bandwidth);
  }
  return p;
}

Status PiperProgramme::check_size() const {
  const double steps =
      0.5 * B_ * (B_ + 1.0) * (cap_ + 1.0) * (D_ + 1.0) * static_cast<double>(options_.size());
  if (steps > kPiperMaxSteps)
    return Error{
        fmt::format("piper: the search is too large ({} blocks, {} devices, {} (t, d) options, up to "
                    "{} stages after: about {:.3g} stage options, above {:.3g}); plan fewer devices "
                    "or micro-batches",
                    B_, D_, options_.size(), cap_, steps, kPiperMaxSteps)};
  return {};
}

Status PiperProgramme::run() {
  best_.assign(static_cast<size_t>(cap_ + 1) * (B_ + 1) * (D_ + 1), PiperState{});
  best_[idx(0, B_, 0)] = PiperState{0, 0, -1, -1, -1, 1, 1, 0};
  for (int j = B_; j >= 1; --j)
    for (int s = 0; s <= cap_; ++s)
      for (int k = 0; k <= D_; ++k)
        if (Status st = expand(j, s, k); !st) return st;
  if (route_.error()) return *route_.error();
  return {};
}

// Every (t, d) stage prepended to the state (j, s, k): on the devices just before its k.
Status PiperProgramme::expand(int j, int s, int k) {
  const PiperState& from = best_[idx(s, j, k)];
  if (from.slowest == kInfinity) return {};
  if ((k == 0) != (j == B_)) return {};     // only the empty suffix uses no device
  const int after = (j == B_) ? 0 : s + 1;  // stages after a stage prepended here
  for (auto [t, d] : options_) {
    const int a = D_ - k - t * d;
    if (a < 0) continue;
    const Place& pl = place_of(a, t, d);
    if (!pl.ok) continue;
    const double share = mb_.size / d;
    Result<const Costs*> cr = costs_for(t, share);
    if (!cr) return cr.error();
    double transfer = 0;
    if (j < B_) {
      const double bytes = profile_->cut(j) * mb_.size / (t * d);
      transfer =
          route_(D_ - k - 1, D_ - k).transfer_time(bytes) + route_(D_ - k, D_ - k - 1).transfer_time(bytes);
    }
    const int in_flight = gpipe_ ? m_ : std::min(m_, after + 1);
    prepend(j, s, k, Prepend{t, d, a, std::min(after, cap_), in_flight, share, transfer, **cr, pl});
  }
  return {};
}

// The stages [i, j) of x's (t, d), longest last: a longer stage holds more weights.
void PiperProgramme::prepend(int j, int s, int k, const Prepend& x) {
  const PiperState from = best_[idx(s, j, k)];
  const Costs& c = x.c;
  const int t = x.t, d = x.d;
  double rec_max = 0, ws_max = 0;
  bool has_split = false;
  for (int i = j - 1; i >= 0; --i) {
    if (t > 1 && !block_ok_[t][i]) break;
    ++explored_;
    has_split = has_split || (t > 1 && block_splits_[t][i]);
    rec_max = std::max(rec_max, c.recompute_max[i]);
    ws_max = std::max(ws_max, c.workspace_max[i]);
    // With a copy of a tied weight the range keeps (the layers' costs, one per stage on one group,
    // have none), split over t.
    const double params = c.parameters[j] - c.parameters[i] + profile_->tied_copy(i, j, false) / t;
    MemoryBytes st = static_memory(
        params, c.parameter_bytes[j] - c.parameter_bytes[i] + profile_->tied_copy(i, j, true) / t, r_.memory);
    if (r_.memory.zero1) st[static_cast<int>(MemoryCategory::OptimizerState)] /= d;
    const double fixed = pipegrid::total(st);
    if (fixed > x.pl.capacity) break;
    if (t > 1 && !has_split) continue;
    const double stash = (t == 1 && r_.memory.recompute == Recompute::Full) ? profile_->cut(i) * x.share
                                                                            : c.stash[j] - c.stash[i];
    const double rec = t == 1 ? c.recompute[j] - c.recompute[i] : rec_max;
    if (fixed + x.in_flight * stash + rec + ws_max > x.pl.capacity) continue;
    double time = (c.time[j] - c.time[i]) * x.pl.slowdown + x.transfer;
    // The blocks' merged-ring collectives (closed_form::merged_ring each), summed by prefix.
    if (t > 1)
      time += (c.collectives[j] - c.collectives[i]) * x.pl.tp.latency +
              (c.flow[j] - c.flow[i]) / x.pl.tp.bandwidth;
    double sync =
        (w_.optimizer_step_s >= 0 ? w_.optimizer_step_s
                                  : optimizer_step_time(r_.memory.zero1 ? params / d : params, r_.memory,
                                                        w_.precision, cl_.devices[x.a].spec)) *
        x.pl.slowdown;
    if (d > 1) sync += closed_form::ring_allreduce(d, c.parameter_bytes[j] - c.parameter_bytes[i], x.pl.dp);
    time += sync / m_;
    const double slowest = std::max(from.slowest, time), sum = from.sum + time;
    PiperState& to = best_[idx(x.to_s, i, k + t * d)];
    if (better(slowest, sum, to)) to = PiperState{slowest, sum, j, s, k, t, d, time};
  }
}

// The best complete pipeline: smallest bottleneck, then sum, then fewer devices.
Result<PiperSolution> PiperProgramme::solution() {
  int bs = -1, bk = -1;
  for (int k = 1; k <= D_; ++k)
    for (int s = 0; s <= cap_; ++s) {
      const PiperState& e = best_[idx(s, 0, k)];
      if (e.slowest == kInfinity) continue;
      if (bs < 0 || better(e.slowest, e.sum, best_[idx(bs, 0, bk)])) bs = s, bk = k;
    }
  if (bs < 0)
    return Error{
        fmt::format("piper: no stage assignment fits the devices' memory at micro-batches of {} "
                    "({} blocks, {} devices, t in {{{}}})",
                    mb_.size, B_, D_, fmt::join(degrees_, ", "))};
  PiperSolution sol;
  sol.blocks = B_;
  sol.explored = explored_;
  const PiperState& top = best_[idx(bs, 0, bk)];
  sol.bottleneck_s = top.slowest;
  sol.sum_s = top.sum;
  sol.devices = bk;
  int j = 0, s = bs, k = bk;
  while (j < B_) {
    const PiperState& e = best_[idx(s, j, k)];
    PiperStage st;
    st.first = profile_->start(j);
    st.last = profile_->start(e.next_j);
    st.t = e.t;
    st.d = e.d;
    st.first_device = D_ - k;
    st.time_s = e.time;
    sol.stages.push_back(st);
    j = e.next_j, s = e.next_s, k = e.next_k;
  }
  return sol;
}

}  // namespace

Result<PiperSolution> piper_partition(const PlanRequest& r, MicroBatching mb) {
  PiperProgramme programme(r, mb);
  if (Status s = programme.init(); !s) return s.error();
  if (Status s = programme.run(); !s) return s.error();
  return programme.solution();
}

Result<Plan> plan_piper(const PlanRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  const Workload& w = r.workload;
  const Cluster& cl = r.cluster;
  const int D = static_cast<int>(cl.devices.size());
  auto schedule = find_schedule(r.strategy.schedule_given ? r.strategy.schedule : "1f1b");
  if (!schedule) return schedule.error();
  const std::vector<int> order = topological_order(w);
  std::vector<Candidate> scored;
  std::vector<std::string> labels, skipped;
  long long explored = 0;
  int blocks = 0;
  for (MicroBatching mb : r.micro_batchings) {
    Result<PiperSolution> sol = piper_partition(r, mb);
    if (!sol) {
      skipped.push_back(sol.error().message);
      continue;
    }
    explored += sol->explored;
    blocks = sol->blocks;
    const int S = static_cast<int>(sol->stages.size());
    std::vector<std::pair<int, int>> ranges;
    std::vector<std::vector<int>> devices(S);
    std::vector<double> times;
    std::string shape;
    for (int st = 0; st < S; ++st) {
      const PiperStage& p = sol->stages[st];
      ranges.emplace_back(p.first, p.last);
      for (int x = p.first_device; x < p.first_device + p.t * p.d; ++x) devices[st].push_back(x);
      times.push_back(p.time_s);
      shape += fmt::format("{}{} layers t{} d{}", st ? ", " : "", p.last - p.first, p.t, p.d);
    }
    Result<Partition> part = contiguous_stages(w, order, ranges, devices, static_cast<size_t>(D));
    if (!part) return part.error();
    for (int st = 0; st < S; ++st) part->graph[st].tensor_parallel = sol->stages[st].t;
    part->plan.predicted_time_per_stage_s = sol->bottleneck_s;
    part->plan.predicted_stage_time_s = std::move(times);
    Candidate c;
    c.plan.partition = std::move(*part);
    c.plan.micro_batch_size = mb.size;
    c.plan.micro_batches = mb.count;
    c.plan.schedule_name = std::string((*schedule)->name);
    if (Status st = check_task_count(count_tasks(c.plan.partition, mb.count, 2, r.strategy.allreduce),
                                     c.plan.partition, mb.count, 2);
        !st) {
      skipped.push_back(st.error().message);
      continue;
    }
    if (Status st = schedule_and_score(r, **schedule, c); !st) return st.error();
    labels.push_back(fmt::format("{}, {} stages ({}), bottleneck {:.6g} s", micro_batching_text(mb), S, shape,
                                 sol->bottleneck_s));
    scored.push_back(std::move(c));
  }
  const double search = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (scored.empty())
    return Error{skipped.empty() ? std::string("piper: no micro-batching to plan") : skipped.front()};
  Result<size_t> best = pick(scored, std::vector<char>(scored.size(), 0), r, kPiperJudged);
  if (!best) return best.error();
  std::vector<TriedPlan> tried;
  for (size_t x = 0; x < scored.size(); ++x) {
    tried.push_back(tried_plan(scored[x], labels[x]));
    if (x == *best) tried.back().outcome = "chosen";
  }
  Candidate& win = scored[*best];
  win.plan.exploration = fmt::format(
      "piper explored {} stage options ({} layer blocks, {} devices, {} micro-batch sizes{}); {} plans "
      "analytically evaluated{}; chosen: {} ({} {:.6g} s{})",
      explored, blocks, D, r.micro_batchings.size(),
      skipped.empty() ? "" : fmt::format(", {} without a plan", skipped.size()), scored.size(),
      r.judge ? fmt::format(", the best {} judged by {}", kPiperJudged, r.judge->name()) : "", labels[*best],
      r.judge ? r.judge->name() : "analytic", win.judged, win.fits ? "" : ", over memory");
  win.plan.planning_seconds = search;
  win.plan.partition.plan.search_seconds = search;
  win.plan.tried = std::move(tried);
  return std::move(win.plan);
}

}  // namespace pipegrid
