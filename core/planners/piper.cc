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
#include "core/planners/common.h"
#include "core/tensor_parallel.h"

namespace pipegrid {
namespace {

constexpr size_t kPiperJudged = 3;
// Stage options the DP may evaluate for one micro-batching; above, a located refusal instead of a
// search of minutes (the DP is blocks^2 x stages x devices x (t, d) options).
constexpr double kMaxSteps = 4e9;

bool splits(TensorSplitKind k) {
  return k == TensorSplitKind::Transformer || k == TensorSplitKind::VocabEmbedding ||
         k == TensorSplitKind::VocabHead;
}

// Per block prefix sums (and per block maxima) of one (t, share)'s per-device layer costs.
struct Costs {
  std::vector<double> time, flow, collectives, stash, recompute, parameters, parameter_bytes;  // prefix
  std::vector<double> recompute_max, workspace_max;                                            // per block
};

// Where a stage of (t, d) starting at device a runs: its links and its memory.
struct Place {
  bool ok = false;  // every group of t devices in one machine
  LinkCost tp, dp;  // the slowest hop of its tensor-parallel and of its data-parallel rings
  double capacity = kInfinity;
};

struct PiperState {
  double slowest = kInfinity, sum = kInfinity;
  int next_j = -1, next_s = -1, next_k = -1;  // the suffix after this state's first stage
  int t = 1, d = 1;
  double time = 0;
};

}  // namespace

Result<PiperSolution> piper_partition(const PlanRequest& r, MicroBatching mb) {
  const Workload& w = r.workload;
  const Cluster& cl = r.cluster;
  const int D = static_cast<int>(cl.devices.size());
  const int m = std::max(1, mb.count);
  if (D == 0) return Error{"piper: the cluster has no devices"};
  const std::vector<int> order = topological_order(w);
  const int n = static_cast<int>(order.size());
  if (n == 0) return Error{"piper: the workload has no layers"};
  std::vector<int> position(n);
  for (int q = 0; q < n; ++q) position[order[q]] = q;
  const DeviceSpec& spec = cl.devices[0].spec;  // identical devices assumed for compute (docs/piper.md)

  // Blocks of about equal compute (device 0, one sample) where the model has more than kPiperBlocks
  // layers, as dapple coarsens.
  std::vector<double> unit(n);
  for (int q = 0; q < n; ++q) {
    Result<PassTimes> t = layer_times(w.layer(order[q]), w.precision, spec, 1);
    if (!t) return Error{fmt::format("piper: on {}: {}", cl.devices[0].name, t.error().message)};
    unit[q] = t->forward + t->backward();
  }
  std::vector<int> start = cost_blocks(unit, kPiperBlocks);
  const int B = static_cast<int>(start.size()) - 1;

  // Bytes per sample crossing the boundary before block k (block 0: the model's input).
  std::vector<double> cut(B + 1, 0);
  cut[0] = w.input_bytes_per_sample;
  for (int k = 1; k < B; ++k)
    for (int q = 0; q < start[k]; ++q) {
      bool crosses = false;
      for (auto e : boost::make_iterator_range(boost::out_edges(order[q], w.graph)))
        crosses |= position[boost::target(e, w.graph)] >= start[k];
      if (crosses) cut[k] += w.layer(order[q]).output_bytes;
    }

  // Machines, and the tensor-parallel degrees: t up to the largest machine; per t, which blocks can run
  // split (every layer has a split and t satisfies Megatron's rules, tensor_parallel_layer decides) and
  // which contain a split layer.
  std::map<std::string, int> machine_index;
  std::vector<int> machine(D);
  std::map<int, int> machine_size;
  for (int d = 0; d < D; ++d) {
    machine[d] =
        machine_index.emplace(cl.machine_of(d), static_cast<int>(machine_index.size())).first->second;
    ++machine_size[machine[d]];
  }
  int largest_machine = 0;
  for (const auto& entry : machine_size) largest_machine = std::max(largest_machine, entry.second);
  const TensorParallelOptions tp_options{r.strategy.sequence_parallel, r.strategy.tp_overlap};
  std::vector<int> degrees{1};
  std::map<int, std::vector<char>> block_ok, block_splits;  // by t
  std::map<int, std::vector<char>> layer_ok;                // by t, per position
  for (int t = 2; t <= largest_machine; ++t) {
    std::vector<char> ok(n, 0), bok(B, 1), bsplit(B, 0);
    bool any = false;
    for (int q = 0; q < n; ++q) {
      const Layer& l = w.layer(order[q]);
      ok[q] = l.split.kind != TensorSplitKind::Undefined &&
              tensor_parallel_layer(l, t, tp_options, w.precision).ok();
    }
    for (int k = 0; k < B; ++k)
      for (int q = start[k]; q < start[k + 1]; ++q) {
        bok[k] = bok[k] && ok[q];
        bsplit[k] = bsplit[k] || splits(w.layer(order[q]).split.kind);
      }
    for (int k = 0; k < B; ++k) any = any || (bok[k] && bsplit[k]);
    if (!any) continue;
    degrees.push_back(t);
    block_ok[t] = std::move(bok);
    block_splits[t] = std::move(bsplit);
    layer_ok[t] = std::move(ok);
  }

  // Per-device costs of each layer at (t, samples per replica), from the lowering's stage_costs on a
  // partition with one stage per layer (a group of t devices inside a machine; layers that cannot
  // split run at t = 1 there and are not used at t).
  std::map<std::pair<int, double>, Costs> cost_cache;
  auto costs_for = [&](int t, double share) -> Result<const Costs*> {
    auto it = cost_cache.find({t, share});
    if (it != cost_cache.end()) return &it->second;
    int a = -1;
    for (int x = 0; x + t <= D && a < 0; ++x) {
      bool one = true;
      for (int y = x; y < x + t; ++y) one = one && machine[y] == machine[x];
      if (one) a = x;
    }
    std::vector<int> stage_of(n);
    std::vector<std::vector<int>> devices(n);
    for (int q = 0; q < n; ++q) {
      stage_of[order[q]] = q;
      if (t > 1 && layer_ok[t][q])
        for (int y = a; y < a + t; ++y) devices[q].push_back(y);
      else
        devices[q] = {a};
    }
    Result<Partition> part = make_partition(w, stage_of, devices, static_cast<size_t>(D));
    if (!part) return Error{"piper: " + part.error().message};
    for (int q = 0; q < n; ++q) part->graph[q].tensor_parallel = static_cast<int>(devices[q].size());
    Result<std::vector<std::vector<StageCost>>> sc =
        stage_costs(w, cl, *part, share, r.memory.recompute, tp_options);
    if (!sc) return Error{"piper: " + sc.error().message};
    Costs c;
    for (auto* v :
         {&c.time, &c.flow, &c.collectives, &c.stash, &c.recompute, &c.parameters, &c.parameter_bytes})
      v->assign(B + 1, 0);
    c.recompute_max.assign(B, 0);
    c.workspace_max.assign(B, 0);
    for (int k = 0; k < B; ++k) {
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
    return &cost_cache.emplace(std::make_pair(t, share), std::move(c)).first->second;
  };

  RouteCache route(cl);  // each pair's route computed once

  // The (t, d) options: d replicas take whole samples of the micro-batch.
  std::vector<std::pair<int, int>> options;
  for (int t : degrees)
    for (int d = 1; t * d <= D; ++d)
      if (whole_samples_per_replica(mb.size, d)) options.emplace_back(t, d);
  std::map<std::tuple<int, int, int>, Place> places;
  auto place_of = [&](int a, int t, int d) -> const Place& {
    auto [it, fresh] = places.try_emplace({a, t, d});
    if (!fresh) return it->second;
    Place& p = it->second;
    p.ok = true;
    for (int j = 0; j < d && p.ok; ++j)
      for (int q = 1; q < t; ++q) p.ok = p.ok && machine[a + j * t + q] == machine[a + j * t];
    if (!p.ok) return p;
    for (int x = a; x < a + t * d; ++x) p.capacity = std::min(p.capacity, cl.devices[x].spec.memory_bytes);
    for (int j = 0; j < d; ++j)
      for (int q = 0; q < t && t > 1; ++q) {
        const Route& rt = route(a + j * t + q, a + j * t + (q + 1) % t);
        p.tp.add_hop(rt.latency, rt.bandwidth);
      }
    for (int q = 0; q < t && d > 1; ++q)
      for (int j = 0; j < d; ++j) {
        const Route& rt = route(a + j * t + q, a + ((j + 1) % d) * t + q);
        p.dp.add_hop(rt.latency, rt.bandwidth);
      }
    return p;
  };

  const bool gpipe = r.strategy.schedule_given && r.strategy.schedule == "gpipe";
  const int max_stages = std::min(D, B);
  const int cap = gpipe ? 0 : std::max(0, std::min(m - 1, max_stages - 1));
  {
    const double steps = 0.5 * B * (B + 1.0) * (cap + 1.0) * (D + 1.0) * static_cast<double>(options.size());
    if (steps > kMaxSteps)
      return Error{
          fmt::format("piper: the search is too large ({} blocks, {} devices, {} (t, d) options, up to "
                      "{} stages after: about {:.3g} stage options, above {:.3g}); plan fewer devices "
                      "or micro-batches",
                      B, D, options.size(), cap, steps, kMaxSteps)};
  }

  // best[s][j][k]: the pipeline over blocks [j, B) on the last k devices, its first stage followed by s
  // stages (capped at `cap`).
  auto idx = [&](int s, int j, int k) { return (static_cast<size_t>(s) * (B + 1) + j) * (D + 1) + k; };
  std::vector<PiperState> best(static_cast<size_t>(cap + 1) * (B + 1) * (D + 1));
  best[idx(0, B, 0)] = PiperState{0, 0, -1, -1, -1, 1, 1, 0};
  PiperSolution sol;
  sol.blocks = B;
  for (int j = B; j >= 1; --j)
    for (int s = 0; s <= cap; ++s)
      for (int k = 0; k <= D; ++k) {
        const PiperState from = best[idx(s, j, k)];
        if (from.slowest == kInfinity) continue;
        if ((k == 0) != (j == B)) continue;      // only the empty suffix uses no device
        const int after = (j == B) ? 0 : s + 1;  // stages after a stage prepended here
        const int to_s = std::min(after, cap);
        for (auto [t, d] : options) {
          const int a = D - k - t * d;
          if (a < 0) continue;
          const Place& pl = place_of(a, t, d);
          if (!pl.ok) continue;
          const double share = mb.size / d;
          Result<const Costs*> cr = costs_for(t, share);
          if (!cr) return cr.error();
          const Costs& c = **cr;
          double transfer = 0;
          if (j < B) {
            const double bytes = cut[j] * mb.size / (t * d);
            transfer =
                route(D - k - 1, D - k).transfer_time(bytes) + route(D - k, D - k - 1).transfer_time(bytes);
          }
          const int in_flight = gpipe ? m : std::min(m, after + 1);
          double rec_max = 0, ws_max = 0;
          bool has_split = false;
          for (int i = j - 1; i >= 0; --i) {
            if (t > 1 && !block_ok[t][i]) break;
            ++sol.explored;
            has_split = has_split || (t > 1 && block_splits[t][i]);
            rec_max = std::max(rec_max, c.recompute_max[i]);
            ws_max = std::max(ws_max, c.workspace_max[i]);
            const double params = c.parameters[j] - c.parameters[i];
            MemoryBytes st = static_memory(params, c.parameter_bytes[j] - c.parameter_bytes[i], r.memory);
            if (r.memory.zero1) st[static_cast<int>(MemoryCategory::OptimizerState)] /= d;
            const double fixed = pipegrid::total(st);
            if (fixed > pl.capacity) break;  // a longer stage holds more weights
            if (t > 1 && !has_split) continue;
            const double stash =
                (t == 1 && r.memory.recompute == Recompute::Full) ? cut[i] * share : c.stash[j] - c.stash[i];
            const double rec = t == 1 ? c.recompute[j] - c.recompute[i] : rec_max;
            if (fixed + in_flight * stash + rec + ws_max > pl.capacity) continue;
            double time = c.time[j] - c.time[i] + transfer;
            // The blocks' merged-ring collectives (closed_form::merged_ring each), summed by prefix.
            if (t > 1) time += (c.collectives[j] - c.collectives[i]) * pl.tp.latency + (c.flow[j] - c.flow[i]) / pl.tp.bandwidth;
            double sync = w.optimizer_step_s >= 0
                              ? w.optimizer_step_s
                              : optimizer_step_time(r.memory.zero1 ? params / d : params, r.memory,
                                                    w.precision, cl.devices[a].spec);
            if (d > 1) sync += closed_form::ring_allreduce(d, c.parameter_bytes[j] - c.parameter_bytes[i], pl.dp);
            time += sync / m;
            const double slowest = std::max(from.slowest, time), sum = from.sum + time;
            PiperState& to = best[idx(to_s, i, k + t * d)];
            if (better(slowest, sum, to)) to = PiperState{slowest, sum, j, s, k, t, d, time};
          }
        }
      }
  if (route.error()) return *route.error();

  // The best complete pipeline: smallest bottleneck, then sum, then fewer devices.
  int bs = -1, bk = -1;
  for (int k = 1; k <= D; ++k)
    for (int s = 0; s <= cap; ++s) {
      const PiperState& e = best[idx(s, 0, k)];
      if (e.slowest == kInfinity) continue;
      if (bs < 0 || better(e.slowest, e.sum, best[idx(bs, 0, bk)])) bs = s, bk = k;
    }
  if (bs < 0)
    return Error{
        fmt::format("piper: no stage assignment fits the devices' memory at micro-batches of {} "
                    "({} blocks, {} devices, t in {{{}}})",
                    mb.size, B, D, fmt::join(degrees, ", "))};
  const PiperState& top = best[idx(bs, 0, bk)];
  sol.bottleneck_s = top.slowest;
  sol.sum_s = top.sum;
  sol.devices = bk;
  int j = 0, s = bs, k = bk;
  while (j < B) {
    const PiperState& e = best[idx(s, j, k)];
    PiperStage st;
    st.first = start[j];
    st.last = start[e.next_j];
    st.t = e.t;
    st.d = e.d;
    st.first_device = D - k;
    st.time_s = e.time;
    sol.stages.push_back(st);
    j = e.next_j, s = e.next_s, k = e.next_k;
  }
  return sol;
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
    std::vector<int> stage_of(order.size());
    std::vector<std::vector<int>> devices(S);
    std::vector<double> times;
    std::string shape;
    for (int st = 0; st < S; ++st) {
      const PiperStage& p = sol->stages[st];
      for (int q = p.first; q < p.last; ++q) stage_of[order[q]] = st;
      for (int x = p.first_device; x < p.first_device + p.t * p.d; ++x) devices[st].push_back(x);
      times.push_back(p.time_s);
      shape += fmt::format("{}{} layers t{} d{}", st ? ", " : "", p.last - p.first, p.t, p.d);
    }
    Result<Partition> part = make_partition(w, stage_of, devices, static_cast<size_t>(D));
    if (!part) return part.error();
    for (int st = 0; st < S; ++st) part->graph[st].tensor_parallel = sol->stages[st].t;
    add_sequence_edges(*part);
    part->plan.predicted_time_per_stage_s = sol->bottleneck_s;
    part->plan.predicted_stage_time_s = std::move(times);
    Candidate c;
    c.plan.partition = std::move(*part);
    c.plan.micro_batch_size = mb.size;
    c.plan.micro_batches = mb.count;
    c.plan.schedule_name = std::string((*schedule)->name);
    if (Status st =
            check_task_count(count_tasks(c.plan.partition, mb.count, 2), c.plan.partition, mb.count, 2);
        !st) {
      skipped.push_back(st.error().message);
      continue;
    }
    if (Status st = schedule_and_score(r, **schedule, c); !st) return st.error();
    labels.push_back(fmt::format("{} micro-batches of {}, {} stages ({}), bottleneck {:.6g} s", mb.count,
                                 mb.size, S, shape, sol->bottleneck_s));
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
