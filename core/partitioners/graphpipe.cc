// graphpipe: GraphPipe-style graph pipeline partitioner (Jeon et al., ASPLOS'25; our reading of
// docs/reference/papers.md, which also says what is [inferred]).
//
// The layer DAG is decomposed into a series-parallel tree (core/sp_tree.h). For a target
// bottleneck time-per-sample T, a memoised DP over the tree answers "can this part of the model,
// given n devices and k stages after it, be split into stages that each meet T and fit memory,
// and with how shallow a stage graph?":
//  - leaf: the part is one stage, data-parallel over its n devices (each takes b/n samples of a
//    micro-batch); it meets T if (F + B of its share + ring all-reduce of its gradients / m) / b
//    <= T, and fits if static + in-flight x stash + the backward's transient <= capacity, with
//    in-flight = min(m, 1 + k) as graph-1f1b implies (m for gpipe and other schedules);
//  - series split (a contiguous run of a series node's children on n1 devices, the rest on n2):
//    the later part is solved first, and the earlier part then sees k + (depth of the later part)
//    stages after it;
//  - parallel split (a run of a parallel node's branches on n1 devices, the rest on n2): both
//    see the same k; the depth is the larger.
// Among the candidates that meet T the DP keeps the shallowest stage graph (fewest in-flight
// micro-batches at the source), then the lowest peak memory. A binary search finds the smallest T
// with a plan. Assumptions (documented in the README): devices are identical (the first device's
// cost model and capacity are used); stage-to-stage transfers overlap compute and are left out of
// T; all-reduce bandwidth and latency are those of the routes between consecutive devices;
// stages are placed on consecutive devices in the tree's order (series parts in order, parallel
// branches one after another), so a stage's replicas and its neighbours are adjacent in device
// order, which groups devices by node in the generated clusters.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <unordered_map>

#include "core/collectives.h"
#include "core/sp_tree.h"
#include "core/strategy.h"
#include "core/units.h"

namespace pipegrid {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Option {
  bool feasible = false;
  int depth = 0;
  double memory = kInf;  // peak bytes on the fullest device of the part
  // How it was obtained: 0 leaf, 1 descend into the single child, 2 split at q with n1 devices first.
  int how = 0;
  int q = 0, n1 = 0;
};

bool better(const Option& a, const Option& b) {
  if (a.feasible != b.feasible) return a.feasible;
  if (a.depth != b.depth) return a.depth < b.depth;
  return a.memory < b.memory;
}

class Planner {
 public:
  // `members`: when the request's workload fuses layers of `original` (join fusion, below), the
  // original layers of each, whose times are summed (each costed on its own, as the replay will).
  Planner(const PartitionRequest& r, const SpTree& tree, const Workload* original = nullptr,
          const std::vector<std::vector<int>>* members = nullptr)
      : r_(r), t_(tree), original_(original), members_(members) {
    D_ = static_cast<int>(r.cluster.devices.size());
    spec_ = r.cluster.devices.front().spec;
  }

  Status init(bool gpipe_memory) {
    gpipe_memory_ = gpipe_memory;
    const Workload& w = r_.workload;
    const size_t L = w.layer_count();
    fb_.assign(L, std::vector<double>(D_ + 1, 0.0));
    for (size_t l = 0; l < L; ++l) {
      for (int n = 1; n <= D_; ++n) {
        if (members_) {
          for (int o : (*members_)[l]) {
            const Layer& layer = original_->layer(o);
            Result<PassTimes> t = layer_times(layer, w.precision, spec_, r_.micro_batch_size / n);
            if (!t) return t.error();
            fb_[l][n] += t->forward + t->backward() + recompute_s(layer, t->forward);
          }
          continue;
        }
        Result<PassTimes> t = layer_times(w.layer(l), w.precision, spec_, r_.micro_batch_size / n);
        if (!t) return t.error();
        fb_[l][n] = t->forward + t->backward() + recompute_s(w.layer(l), t->forward);
      }
    }
    // Ring all-reduce over devices 0..n-1: the slowest and the longest of the routes between
    // consecutive devices (and back to the first).
    Router router(r_.cluster);
    ring_.assign(D_ + 1, LinkCost{});
    for (int n = 2; n <= D_; ++n) {
      std::vector<int> ring(n);
      std::iota(ring.begin(), ring.end(), 0);
      Result<LinkCost> cost = ring_link_cost(router, ring);
      if (!cost) return cost.error();
      ring_[n] = *cost;
    }
    // Interchangeable children: a parallel node's branches with identical costs and structure are
    // made adjacent, so that a run inside one group of identical branches is solved once.
    signature_.assign(t_.nodes.size(), -1);
    order_.assign(t_.nodes.size(), {});
    group_start_.assign(t_.nodes.size(), {});
    std::map<std::string, int> ids;
    std::function<int(int)> sign = [&](int v) -> int {
      if (signature_[v] >= 0) return signature_[v];
      const SpNode& n = t_.nodes[v];
      std::string key;
      if (n.kind == SpNode::Kind::Leaf) {
        const Layer& l = w.layer(n.layers.front());
        key = fmt::format("L{}|{}|{}|{}|{}|{}|{}|{}|{}", l.kind, fb_[n.layers.front()][1], l.parameters,
                          l.parameter_bytes, l.stash_bytes, l.output_bytes, l.selective_stash_bytes,
                          l.forward_bytes, l.backward_bytes);
      } else {
        std::vector<int> kids;
        for (int c : n.children) kids.push_back(sign(c));
        if (n.kind == SpNode::Kind::Parallel) std::sort(kids.begin(), kids.end());
        key = fmt::format("{}{}", n.kind == SpNode::Kind::Series ? 'S' : 'P', fmt::join(kids, ","));
      }
      auto it = ids.emplace(key, static_cast<int>(ids.size())).first;
      return signature_[v] = it->second;
    };
    for (size_t v = 0; v < t_.nodes.size(); ++v) {
      sign(static_cast<int>(v));
      const SpNode& n = t_.nodes[v];
      order_[v] = n.children;
      if (n.kind == SpNode::Kind::Parallel)
        std::stable_sort(order_[v].begin(), order_[v].end(),
                         [&](int a, int b) { return signature_[a] < signature_[b]; });
      group_start_[v].resize(order_[v].size());
      for (size_t c = 0; c < order_[v].size(); ++c)
        group_start_[v][c] = (c > 0 && signature_[order_[v][c]] == signature_[order_[v][c - 1]])
                                 ? group_start_[v][c - 1]
                                 : static_cast<int>(c);
    }
    return {};
  }

  // Smallest target with a plan: a bisection over the sorted stage times every candidate stage
  // could have (the bottleneck of the best plan is one of them).
  Result<std::vector<std::pair<std::vector<int>, int>>> plan(double* best_tps) {
    std::vector<double> candidates;
    for (size_t v = 0; v < t_.nodes.size(); ++v) {
      const int c = t_.nodes[v].kind == SpNode::Kind::Leaf ? 1 : static_cast<int>(order_[v].size());
      for (int lo = 0; lo < c; ++lo)
        for (int hi = lo; hi < c; ++hi) {
          if (lo != canonical_lo(static_cast<int>(v), lo, hi)) continue;
          const RangeInfo& info = range(static_cast<int>(v), lo, hi);
          for (int n = 1; n <= D_; ++n) candidates.push_back(tps(info, n));
        }
    }
    std::sort(candidates.begin(), candidates.end());
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
    auto feasible = [&](double target) {
      target_ = target;
      memo_.clear();
      return solve_node(t_.root, root_n_, 0).feasible;
    };
    // With whole samples per replica, every device may be out of reach (8 layers on 64 devices with
    // micro-batches of 1 sample: no replication): then the most devices that have a plan.
    root_n_ = D_;
    if (r_.micro_batch_size == std::floor(r_.micro_batch_size))
      while (root_n_ > 1 && !feasible(candidates.back())) --root_n_;
    if (!feasible(candidates.back()))
      return Error{fmt::format(
          "graphpipe: no partition of the model over {} devices fits their memory ({} each) with "
          "{} micro-batches of {:g} samples{}",
          D_, format_bytes(spec_.usable_memory()), r_.micro_batches, r_.micro_batch_size,
          gpipe_memory_ ? fmt::format(", counting all {} in flight as under schedule {} (graph-1f1b "
                                      "counts 1 + a stage's longest path to the last; docs/planners.md)",
                                      r_.micro_batches, r_.schedule)
                        : std::string())};
    size_t lo = 0, hi = candidates.size() - 1;  // candidates[hi] is feasible
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      if (feasible(candidates[mid]))
        hi = mid;
      else
        lo = mid + 1;
    }
    feasible(candidates[hi]);
    *best_tps = candidates[hi];
    std::vector<std::pair<std::vector<int>, int>> stages;
    emit_node(t_.root, root_n_, 0, stages);
    return stages;
  }

  double stage_tps(const std::vector<int>& layers, int n) const {
    double time = 0, grads = 0;
    for (int l : layers) {
      time += fb_[l][n];
      grads += r_.workload.layer(l).parameter_bytes;
    }
    return (time + allreduce_s(grads, n) / r_.micro_batches) / r_.micro_batch_size;
  }

 private:
  // Aggregates of a run of a node's children (or a leaf), independent of the target.
  struct RangeInfo {
    std::vector<int> layers;
    std::vector<double> time;  // per device count: F + B (+ recomputation) of one share
    double grads = 0;          // parameter bytes (all-reduced)
    double static_bytes = 0, static_optimizer = 0;
    double stash = 0, transient = 0;  // per sample
  };

  double recompute_s(const Layer& l, double forward) const {
    switch (r_.memory.recompute) {
      case Recompute::None:
        return 0;
      case Recompute::Full:
        return forward;
      case Recompute::Selective:
        return l.selective_recompute_fraction * forward;
    }
    return 0;
  }

  double allreduce_s(double bytes, int n) const {
    if (n < 2 || bytes <= 0) return 0;
    return closed_form::ring_allreduce(n, bytes, ring_[n]);
  }

  // A run inside one group of identical branches is solved as the group's first run of that length.
  int canonical_lo(int node, int lo, int hi) const {
    if (t_.nodes[node].kind != SpNode::Kind::Parallel) return lo;
    const int g = group_start_[node][lo];
    return group_start_[node][hi] == g ? g : lo;
  }

  const RangeInfo& range(int node, int lo, int hi) {
    const uint64_t k =
        (static_cast<uint64_t>(node) << 32) | (static_cast<uint64_t>(lo) << 16) | static_cast<uint64_t>(hi);
    if (auto it = ranges_.find(k); it != ranges_.end()) return it->second;
    const Workload& w = r_.workload;
    RangeInfo info;
    const SpNode& s = t_.nodes[node];
    if (s.kind == SpNode::Kind::Leaf) {
      info.layers = s.layers;
    } else {
      for (int c = lo; c <= hi; ++c) {
        const auto& ls = t_.nodes[order_[node][c]].layers;
        info.layers.insert(info.layers.end(), ls.begin(), ls.end());
      }
      std::sort(info.layers.begin(), info.layers.end());  // any order: only sums and membership matter
    }
    info.time.assign(D_ + 1, 0.0);
    double params = 0, full = 0, selective = 0, largest = 0, input = 0;
    for (int l : info.layers) {
      const Layer& layer = w.layer(l);
      for (int n = 1; n <= D_; ++n) info.time[n] += fb_[l][n];
      params += layer.parameters;
      info.grads += layer.parameter_bytes;
      if (layer.tied_to >= 0 && !std::binary_search(info.layers.begin(), info.layers.end(), layer.tied_to)) {
        params += layer.tied_parameters;  // a copy (partition.h TiedCopy)
        info.grads += tied_bytes(w, layer, layer.tied_parameters);
      }
      full += layer.stash_bytes;
      selective += layer.selective_stash_bytes >= 0 ? layer.selective_stash_bytes : layer.stash_bytes;
      largest = std::max(largest, layer.output_bytes);
      for (auto [e, end] = boost::in_edges(l, w.graph); e != end; ++e) {
        const int u = static_cast<int>(boost::source(*e, w.graph));
        if (!std::binary_search(info.layers.begin(), info.layers.end(), u)) {
          input += w.layer(u).output_bytes;  // approximation: one producer's output per consuming layer
          break;
        }
      }
    }
    if (input == 0) input = w.input_bytes_per_sample;
    info.stash = full;
    info.transient = largest;
    if (r_.memory.recompute == Recompute::Full) {
      info.stash = input;
      info.transient += full;
    } else if (r_.memory.recompute == Recompute::Selective) {
      info.stash = selective;
      info.transient += std::max(0.0, full - selective);
    }
    MemoryBytes st = static_memory(params, info.grads, r_.memory);
    info.static_optimizer = st[static_cast<int>(MemoryCategory::OptimizerState)];
    info.static_bytes = total(st) - info.static_optimizer;
    return ranges_.emplace(k, std::move(info)).first->second;
  }

  double tps(const RangeInfo& info, int n) const {
    return (info.time[n] + allreduce_s(info.grads, n) / r_.micro_batches) / r_.micro_batch_size;
  }

  // Peak bytes on each of the n devices of a stage, k stages after it.
  double memory(const RangeInfo& info, int n, int k) const {
    const double share = r_.micro_batch_size / n;
    const int in_flight = gpipe_memory_ ? r_.micro_batches : std::min(r_.micro_batches, 1 + k);
    const double optimizer = r_.memory.zero1 ? info.static_optimizer / n : info.static_optimizer;
    return info.static_bytes + optimizer + (in_flight * info.stash + info.transient) * share;
  }

  uint64_t key(int node, int lo, int hi, int n, int k) const {
    return (static_cast<uint64_t>(node) << 44) | (static_cast<uint64_t>(lo) << 32) |
           (static_cast<uint64_t>(hi) << 20) | (static_cast<uint64_t>(n) << 10) | static_cast<uint64_t>(k);
  }

  int cap_k(int k) const { return std::min(k, std::max(0, r_.micro_batches - 1)); }

  Option solve_node(int node, int n, int k) {
    const SpNode& s = t_.nodes[node];
    const int hi = s.kind == SpNode::Kind::Leaf ? 0 : static_cast<int>(s.children.size()) - 1;
    return solve(node, 0, hi, n, k);
  }

  // Options record split points relative to lo, so canonical runs serve their identical copies.
  Option solve(int node, int lo, int hi, int n, int k) {
    k = cap_k(k);
    const int clo = canonical_lo(node, lo, hi);
    hi += clo - lo;
    lo = clo;
    const uint64_t kk = key(node, lo, hi, n, k);
    if (auto it = memo_.find(kk); it != memo_.end()) return it->second;
    const SpNode& s = t_.nodes[node];
    const RangeInfo& info = range(node, lo, hi);
    Option best;
    best.depth = 1;
    best.memory = memory(info, n, k);
    // One stage on n devices splits each micro-batch between n replicas: only whole samples (issue 30).
    best.feasible = whole_samples_per_replica(r_.micro_batch_size, n) && tps(info, n) <= target_ &&
                    best.memory <= spec_.usable_memory();
    if (s.kind != SpNode::Kind::Leaf && lo == hi) {
      Option d = solve_node(order_[node][lo], n, k);
      d.how = 1;
      if (better(d, best)) best = d;
    } else if (s.kind != SpNode::Kind::Leaf && !(best.feasible && s.kind == SpNode::Kind::Series)) {
      // A one-stage series run is already the shallowest; parallel splits may save memory.
      for (int q = lo; q < hi; ++q) {
        for (int n1 = 1; n1 < n; ++n1) {
          Option o;
          if (s.kind == SpNode::Kind::Series) {
            Option right = solve(node, q + 1, hi, n - n1, k);
            if (!right.feasible) continue;
            Option left = solve(node, lo, q, n1, k + right.depth);
            if (!left.feasible) continue;
            o = {true, left.depth + right.depth, std::max(left.memory, right.memory), 2, q - lo, n1};
          } else {
            Option left = solve(node, lo, q, n1, k);
            if (!left.feasible) continue;
            Option right = solve(node, q + 1, hi, n - n1, k);
            if (!right.feasible) continue;
            o = {true, std::max(left.depth, right.depth), std::max(left.memory, right.memory), 2, q - lo, n1};
          }
          if (better(o, best)) best = o;
        }
      }
    }
    memo_.emplace(kk, best);
    return best;
  }

  void emit_node(int node, int n, int k, std::vector<std::pair<std::vector<int>, int>>& out) {
    const SpNode& s = t_.nodes[node];
    const int hi = s.kind == SpNode::Kind::Leaf ? 0 : static_cast<int>(s.children.size()) - 1;
    emit(node, 0, hi, n, k, out);
  }

  void emit(int node, int lo, int hi, int n, int k, std::vector<std::pair<std::vector<int>, int>>& out) {
    const Option o = solve(node, lo, hi, n, k);
    const SpNode& s = t_.nodes[node];
    if (o.how == 0) {
      std::vector<int> layers;
      if (s.kind == SpNode::Kind::Leaf) {
        layers = s.layers;
      } else {
        for (int c = lo; c <= hi; ++c) {
          const auto& ls = t_.nodes[order_[node][c]].layers;
          layers.insert(layers.end(), ls.begin(), ls.end());
        }
      }
      out.emplace_back(std::move(layers), n);
    } else if (o.how == 1) {
      emit_node(order_[node][lo], n, k, out);
    } else if (s.kind == SpNode::Kind::Series) {
      const int q = lo + o.q;
      const int right_depth = solve(node, q + 1, hi, n - o.n1, k).depth;
      emit(node, lo, q, o.n1, k + right_depth, out);
      emit(node, q + 1, hi, n - o.n1, k, out);
    } else {
      const int q = lo + o.q;
      emit(node, lo, q, o.n1, k, out);
      emit(node, q + 1, hi, n - o.n1, k, out);
    }
  }

  const PartitionRequest& r_;
  const SpTree& t_;
  const Workload* original_ = nullptr;
  const std::vector<std::vector<int>>* members_ = nullptr;
  int D_ = 0;
  int root_n_ = 0;  // devices the whole model is planned on (D_ unless whole samples forbid it)
  DeviceSpec spec_;
  bool gpipe_memory_ = false;
  std::vector<std::vector<double>> fb_;  // per layer, per device count: F + B (+ recomputation)
  std::vector<LinkCost> ring_;           // the ring over devices 0 .. n - 1: its slowest hop
  std::vector<int> signature_;
  std::vector<std::vector<int>> order_, group_start_;
  std::unordered_map<uint64_t, RangeInfo> ranges_;
  double target_ = 0;
  std::unordered_map<uint64_t, Option> memo_;
};

// Join fusion: a stage is any convex set of layers, but the runs of an SP tree cannot put a join
// (a layer with several inputs, e.g. MMT's concat) in the same stage as the end of one of the
// branches it joins, so a cheap join would take devices of its own. A fused variant merges every
// join with the tail of its costliest predecessor's chain (layers with one input and one output,
// walking back from the join, so the merge is convex and the graph stays acyclic) of up to `tail`
// layers. The planner runs on the original, then on tails of 1, 2, ... layers while the plan
// improves (a short tail leaves the join's stage idle, a long one makes it the bottleneck), and
// keeps the best plan.
struct Fused {
  Workload workload;
  std::vector<std::vector<int>> members;  // fused layer -> original layers (topological order)
  int fusions = 0;
  int fused_layers = 0;  // original layers merged into joins
};

std::optional<Fused> fuse_joins(const Workload& w, const DeviceSpec& spec, double batch, int tail) {
  const int L = static_cast<int>(w.layer_count());
  std::vector<double> cost(L);  // F + B of each layer; infinite when the device cannot run it
  for (int l = 0; l < L; ++l) {
    Result<PassTimes> t = layer_times(w.layer(l), w.precision, spec, batch);
    cost[l] = t ? t->forward + t->backward() : std::numeric_limits<double>::infinity();
  }
  const std::vector<int> order = topological_order(w);
  std::vector<int> into(L, -1);
  std::vector<char> used(L, 0);
  Fused f;
  for (int v : order) {
    if (boost::in_degree(v, w.graph) < 2 || used[v]) continue;
    int best = -1;
    double best_cost = -1;
    for (auto [e, end] = boost::in_edges(v, w.graph); e != end; ++e) {
      const int u = static_cast<int>(boost::source(*e, w.graph));
      if (boost::out_degree(u, w.graph) != 1 || used[u] || !std::isfinite(cost[u])) continue;
      if (cost[u] > best_cost) best = u, best_cost = cost[u];
    }
    if (best < 0) continue;
    used[v] = 1;
    for (int u = best, taken = 1;; ++taken) {
      into[u] = v;
      used[u] = 1;
      ++f.fused_layers;
      if (taken == tail || boost::in_degree(u, w.graph) != 1) break;
      const int prev = static_cast<int>(boost::source(*boost::in_edges(u, w.graph).first, w.graph));
      if (boost::out_degree(prev, w.graph) != 1 || used[prev] || !std::isfinite(cost[prev])) break;
      u = prev;
    }
    ++f.fusions;
  }
  if (f.fusions == 0) return std::nullopt;
  f.workload.name = w.name;
  f.workload.precision = w.precision;
  f.workload.micro_batch_size = w.micro_batch_size;
  f.workload.optimizer_step_s = w.optimizer_step_s;
  f.workload.input_bytes_per_sample = w.input_bytes_per_sample;
  std::vector<int> of(L, -1);
  for (int x = 0; x < L; ++x) {
    if (into[x] >= 0) continue;
    of[x] = static_cast<int>(f.members.size());
    f.members.push_back({x});
  }
  for (int x : order)
    if (into[x] >= 0) {
      of[x] = of[into[x]];
      auto& m = f.members[of[x]];
      m.insert(m.end() - 1, x);  // before the join, in topological order
    }
  for (const auto& m : f.members) {
    Layer merged = w.layer(m.back());
    if (m.size() > 1) {
      merged.name = w.layer(m.front()).name + ".." + merged.name;
      bool selective = merged.selective_stash_bytes >= 0;
      double sel = merged.selective_stash_bytes >= 0 ? merged.selective_stash_bytes : merged.stash_bytes;
      double weighted = merged.forward_flops * merged.selective_recompute_fraction;
      merged.kernels = layer_kernels(merged);
      for (size_t i = 0; i + 1 < m.size(); ++i) {
        const Layer& u = w.layer(m[i]);
        for (const Kernel& k : layer_kernels(u)) merged.kernels.push_back(k);
        add_layer_totals(merged, u);
        merged.output_bytes = std::max(merged.output_bytes, u.output_bytes);  // the backward's workspace
        selective = selective || u.selective_stash_bytes >= 0;
        sel += u.selective_stash_bytes >= 0 ? u.selective_stash_bytes : u.stash_bytes;
        weighted += u.forward_flops * u.selective_recompute_fraction;
      }
      if (selective) merged.selective_stash_bytes = sel;
      merged.selective_recompute_fraction = merged.forward_flops > 0 ? weighted / merged.forward_flops : 0;
      merged.measured.reset();  // costs come from the members (Planner)
    }
    f.workload.add_layer(std::move(merged));
  }
  std::set<std::pair<int, int>> edges;
  for (auto [e, end] = boost::edges(w.graph); e != end; ++e) {
    const int a = of[boost::source(*e, w.graph)], c = of[boost::target(*e, w.graph)];
    if (a != c && edges.emplace(a, c).second) f.workload.add_edge(a, c);
  }
  return f;
}

struct Planned {
  Partition partition;
  double tps = 0;
};

// Plans `r` (whose workload may be a fused one) and builds the partition of the original workload.
// The planner's memo grows with the runs of every node's children: per run (lo, hi) a time per
// device count and the run's layer list. Estimated before planning, with a limit of 2^28 cells
// (about 2 GB); a node of more than 4,095 children would also overflow the memo's keys.
constexpr double kMaxMemoCells = 268435456;  // 2^28
constexpr size_t kMaxChildren = 4095;

Status check_memo_size(const SpTree& tree, size_t devices) {
  double cells = 0;
  size_t widest = 0;
  for (const SpNode& n : tree.nodes) {
    const double c = static_cast<double>(n.children.size());
    widest = std::max(widest, n.children.size());
    cells += c * (c + 1) / 2 * static_cast<double>(devices + 1) + c * (c + 1) * (c + 2) / 6;
  }
  if (widest > kMaxChildren)
    return Error{
        fmt::format("graphpipe: the model's series-parallel tree has a node of {} parts (a chain of "
                    "{} layers or branches), above the planner's limit of {}",
                    widest, widest, kMaxChildren)};
  if (cells > kMaxMemoCells)
    return Error{
        fmt::format("graphpipe: planning needs about {:.3g} memo cells (runs of the series-parallel "
                    "tree's children, widest {}, x {} device counts, and their layers), above the "
                    "limit of {:.3g} (2^28); use fewer layers or devices, or another partitioner",
                    cells, widest, devices, kMaxMemoCells)};
  return {};
}

// The search's time: per node of c children, runs (c^2 / 2) x device counts (D) x in-flight depths
// (up to min(m, D): a stage needs a device) x splits (c x D); bisection and fusion repeat it a few
// times. Counted as sum c^3 / 6 x D^2 x min(m, D), an upper bound: on chains of 48 layers with 16
// micro-batches on 8, 16 and 32 devices it counts 9.4e6, 7.5e7 and 3.0e8 against 2.9e6, 3.7e7 and
// 2.6e8 splits tried in all (0.1, 1.9 and 17 s); feasibility prunes more on branched models. Limit
// 2^30: about a minute at the 60-90 ns per split measured; 48 layers on 64 devices (1.2e9) ran
// for minutes.
double search_steps(const SpTree& tree, size_t devices, int micro_batches) {
  double steps = 0;
  const double d = static_cast<double>(devices);
  const double depths = std::min(d, static_cast<double>(std::max(1, micro_batches)));
  for (const SpNode& n : tree.nodes) {
    const double c = static_cast<double>(n.children.size());
    steps += c * c * c / 6 * d * d * depths;
  }
  return steps;
}

Status check_search_steps(const SpTree& tree, size_t devices, int micro_batches) {
  const double steps = search_steps(tree, devices, micro_batches);
  if (steps <= kMaxPartitionSearchSteps) return {};
  size_t widest = 0;
  for (const SpNode& n : tree.nodes) widest = std::max(widest, n.children.size());
  return Error{fmt::format(
      "graphpipe: the search would take about {:.3g} steps (runs of the series-parallel tree's children, "
      "widest {}, x {} devices squared x {} in-flight depths), above the planner's limit of {:.3g} (2^30, "
      "about a minute); use fewer layers, devices or micro-batches, or another partitioner",
      steps, widest, devices, std::min<double>(static_cast<double>(devices), std::max(1, micro_batches)),
      kMaxPartitionSearchSteps)};
}

Result<Planned> plan_once(const PartitionRequest& r, const Workload& original, const Fused* fused) {
  const SpTree tree = sp_decompose(r.workload);
  if (Status s = check_memo_size(tree, r.cluster.devices.size()); !s) return s.error();
  if (Status s = check_search_steps(tree, r.cluster.devices.size(), r.micro_batches); !s) return s.error();
  Planner planner(r, tree, fused ? &original : nullptr, fused ? &fused->members : nullptr);
  // graph-1f1b keeps min(m, 1 + k) micro-batches in flight; assume all m for any other schedule.
  if (Status s = planner.init(r.schedule != "graph-1f1b"); !s) return s.error();
  double tps = 0;
  auto stages = planner.plan(&tps);
  if (!stages) return stages.error();
  std::vector<int> stage_of(original.layer_count(), -1);
  std::vector<std::vector<int>> devices;
  int next = 0;
  for (size_t s = 0; s < stages->size(); ++s) {
    for (int l : (*stages)[s].first) {
      if (fused) {
        for (int o : fused->members[l]) stage_of[o] = static_cast<int>(s);
      } else {
        stage_of[l] = static_cast<int>(s);
      }
    }
    std::vector<int> devs;
    for (int i = 0; i < (*stages)[s].second; ++i) devs.push_back(next++);
    devices.push_back(std::move(devs));
  }
  Result<Partition> p = make_partition(original, stage_of, devices, r.cluster.devices.size());
  if (!p) return p.error();
  p->plan.predicted_time_per_stage_s = tps * r.micro_batch_size;
  for (const auto& [layers, n] : *stages)
    p->plan.predicted_stage_time_s.push_back(planner.stage_tps(layers, n) * r.micro_batch_size);
  p->plan.added_dependencies = tree.added_dependencies;
  return Planned{std::move(*p), tps};
}

}  // namespace

double graphpipe_search_steps(const PartitionRequest& r) {
  return search_steps(sp_decompose(r.workload), r.cluster.devices.size(), r.micro_batches);
}

Result<Partition> partition_graphpipe(const PartitionRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  if (r.cluster.devices.empty()) return Error{"graphpipe: the cluster has no device"};
  if (r.cluster.devices.size() >= 1000) return Error{"graphpipe: at most 999 devices"};
  Result<Planned> best = plan_once(r, r.workload, nullptr);
  int fusions = 0, fused_layers = 0;
  int last_fused = -1, plateau = 0;
  for (int tail = 1; tail <= 16; ++tail) {
    std::optional<Fused> f = fuse_joins(r.workload, r.cluster.devices.front().spec, r.micro_batch_size, tail);
    if (!f || f->fused_layers == last_fused) break;  // nothing (more) to fuse
    last_fused = f->fused_layers;
    const PartitionRequest fr{f->workload,     r.cluster, r.stages,   r.micro_batch_size, r.chunks,
                              r.micro_batches, r.memory,  r.schedule, r.replicas,         r.options};
    Result<Planned> other = plan_once(fr, r.workload, &*f);
    // A fused plan wins on a lower bottleneck, or an equal one with a shallower stage graph.
    const bool wins =
        other &&
        (!best || other->tps < best->tps * (1 - 1e-9) ||
         (other->tps <= best->tps * (1 + 1e-9) && other->partition.depth() < best->partition.depth()));
    // Longer tails only load the join's stage more once the bottleneck has grown; on a plateau
    // (equal bottleneck) a longer tail may still let the branches balance, so go on, twice at most.
    if (!wins && (!other || !best || other->tps > best->tps * (1 + 1e-9) || ++plateau > 2)) break;
    if (!wins) continue;
    plateau = 0;
    best = std::move(other);
    fusions = f->fusions;
    fused_layers = f->fused_layers;
  }
  if (!best) return best.error();
  Partition& p = best->partition;
  const double tps = best->tps;
  p.plan.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p.plan.summary = fmt::format(
      "graphpipe: {} stages, depth {}, bottleneck {:.6g} s per sample ({:.6g} s per micro-batch of {}); "
      "{} dependencies added to make the graph series-parallel; {}",
      p.stage_count(), p.depth(), tps, tps * r.micro_batch_size, r.micro_batch_size,
      p.plan.added_dependencies,
      fusions ? fmt::format("{} joins fused with {} layers before them", fusions, fused_layers)
              : "no join fused");
  return std::move(p);
}

}  // namespace pipegrid
