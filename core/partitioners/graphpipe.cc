// graphpipe: GraphPipe-style graph pipeline partitioner (Jeon et al., ASPLOS'25; our reading of
// ../shared/reference/papers.md, which also says what is [inferred]).
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

#include <chrono>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "core/sp_tree.h"
#include "core/strategy.h"

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
  Planner(const PartitionRequest& r, const SpTree& tree) : r_(r), t_(tree) {
    D_ = static_cast<int>(r.cluster.devices.size());
    spec_ = r.cluster.devices.front().spec;
    gpipe_memory_ = false;
  }

  Status init(bool gpipe_memory) {
    gpipe_memory_ = gpipe_memory;
    const Workload& w = r_.workload;
    const size_t L = w.layer_count();
    fb_.assign(L, std::vector<double>(D_ + 1, 0.0));
    f_.assign(L, std::vector<double>(D_ + 1, 0.0));
    for (size_t l = 0; l < L; ++l) {
      for (int n = 1; n <= D_; ++n) {
        Result<PassTimes> t = layer_times(w.layer(l), w.precision, spec_, r_.micro_batch_size / n);
        if (!t) return t.error();
        f_[l][n] = t->forward;
        fb_[l][n] = t->forward + t->backward();
      }
    }
    // Ring all-reduce over devices 0..n-1: the slowest and the longest of the routes between
    // consecutive devices (and back to the first).
    Router router(r_.cluster);
    ring_bw_.assign(D_ + 1, kInf);
    ring_lat_.assign(D_ + 1, 0.0);
    for (int n = 2; n <= D_; ++n) {
      double bw = kInf, lat = 0;
      for (int i = 0; i < n; ++i) {
        Result<Route> route = router.route(i, (i + 1) % n);
        if (!route) return route.error();
        bw = std::min(bw, route->bandwidth);
        lat = std::max(lat, route->latency);
      }
      ring_bw_[n] = bw;
      ring_lat_[n] = lat;
    }
    return {};
  }

  // Smallest T with a plan, by bisection; the plan's stages on success.
  Result<std::vector<std::pair<std::vector<int>, int>>> plan(double* best_tps) {
    const SpNode& root = t_.nodes[t_.root];
    double hi = leaf_tps(root.layers, 1) * (1 + 1e-9) + 1e-30;
    target_ = hi;
    memo_.clear();
    Option top = solve_node(t_.root, D_, 0);
    if (!top.feasible)
      return Error{fmt::format(
          "graphpipe: no partition of the model over {} devices fits their memory ({} each) with {} micro-batches of {} "
          "samples",
          D_, spec_.memory_bytes, r_.micro_batches, r_.micro_batch_size)};
    double lo = 0;
    for (int it = 0; it < 60 && hi - lo > 1e-9 * hi; ++it) {
      const double mid = 0.5 * (lo + hi);
      target_ = mid;
      memo_.clear();
      if (solve_node(t_.root, D_, 0).feasible)
        hi = mid;
      else
        lo = mid;
    }
    target_ = hi;
    memo_.clear();
    solve_node(t_.root, D_, 0);
    *best_tps = hi;
    std::vector<std::pair<std::vector<int>, int>> stages;
    emit_node(t_.root, D_, 0, stages);
    return stages;
  }

  double stage_tps(const std::vector<int>& layers, int n) const { return leaf_tps(layers, n); }

 private:
  // Layers of children [lo, hi] of a node, in topological order.
  std::vector<int> range_layers(int node, int lo, int hi) const {
    const SpNode& s = t_.nodes[node];
    if (s.kind == SpNode::Kind::Leaf) return s.layers;
    std::vector<int> out;
    for (int c = lo; c <= hi; ++c) {
      const auto& ls = t_.nodes[s.children[c]].layers;
      out.insert(out.end(), ls.begin(), ls.end());
    }
    return out;
  }

  double allreduce_s(double bytes, int n) const {
    if (n < 2 || bytes <= 0) return 0;
    return 2.0 * (n - 1) * ring_lat_[n] + 2.0 * (n - 1) / n * bytes / ring_bw_[n];
  }

  double leaf_tps(const std::vector<int>& layers, int n) const {
    double time = 0, grads = 0;
    for (int l : layers) {
      time += fb_[l][n] + recompute_s(l, n);
      grads += r_.workload.layer(l).parameter_bytes;
    }
    return (time + allreduce_s(grads, n) / r_.micro_batches) / r_.micro_batch_size;
  }

  double recompute_s(int l, int n) const {
    switch (r_.memory.recompute) {
      case Recompute::None: return 0;
      case Recompute::Full: return f_[l][n];
      case Recompute::Selective: return r_.workload.layer(l).selective_recompute_fraction * f_[l][n];
    }
    return 0;
  }

  // Peak bytes on each of the n devices of a stage holding `layers`, k stages after it.
  double leaf_memory(const std::vector<int>& layers, int n, int k) const {
    const Workload& w = r_.workload;
    double params = 0, pbytes = 0, full = 0, selective = 0, largest = 0, input = 0;
    std::vector<char> inside(w.layer_count(), 0);
    for (int l : layers) inside[l] = 1;
    for (int l : layers) {
      const Layer& layer = w.layer(l);
      params += layer.parameters;
      pbytes += layer.parameter_bytes;
      full += layer.stash_bytes;
      selective += layer.selective_stash_bytes >= 0 ? layer.selective_stash_bytes : layer.stash_bytes;
      largest = std::max(largest, layer.output_bytes);
      bool counted = false;
      for (auto [e, end] = boost::in_edges(l, w.graph); e != end; ++e) {
        const int u = static_cast<int>(boost::source(*e, w.graph));
        if (!inside[u] && !counted) {
          input += w.layer(u).output_bytes;
          counted = true;  // approximation: one producer's output per consuming layer
        }
      }
    }
    if (input == 0) input = w.input_bytes_per_sample;
    double stash = full, transient = 0;
    if (r_.memory.recompute == Recompute::Full) {
      stash = input;
      transient = full;
    } else if (r_.memory.recompute == Recompute::Selective) {
      stash = selective;
      transient = std::max(0.0, full - selective);
    }
    const double share = r_.micro_batch_size / n;
    MemoryBytes st = static_memory(params, pbytes, r_.memory);
    if (r_.memory.zero1) st[static_cast<int>(MemoryCategory::OptimizerState)] /= n;
    const int in_flight = gpipe_memory_ ? r_.micro_batches : std::min(r_.micro_batches, 1 + k);
    return total(st) + (in_flight * stash + transient + largest) * share;
  }

  Option leaf_option(const std::vector<int>& layers, int n, int k) const {
    Option o;
    o.how = 0;
    o.depth = 1;
    o.memory = leaf_memory(layers, n, k);
    o.feasible = leaf_tps(layers, n) <= target_ && o.memory <= spec_.memory_bytes;
    return o;
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

  Option solve(int node, int lo, int hi, int n, int k) {
    k = cap_k(k);
    const uint64_t kk = key(node, lo, hi, n, k);
    if (auto it = memo_.find(kk); it != memo_.end()) return it->second;
    const SpNode& s = t_.nodes[node];
    Option best = leaf_option(range_layers(node, lo, hi), n, k);
    if (s.kind != SpNode::Kind::Leaf && lo == hi) {
      Option d = solve_node(s.children[lo], n, k);
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
            o = {true, left.depth + right.depth, std::max(left.memory, right.memory), 2, q, n1};
          } else {
            Option left = solve(node, lo, q, n1, k);
            if (!left.feasible) continue;
            Option right = solve(node, q + 1, hi, n - n1, k);
            if (!right.feasible) continue;
            o = {true, std::max(left.depth, right.depth), std::max(left.memory, right.memory), 2, q, n1};
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
      out.emplace_back(range_layers(node, lo, hi), n);
    } else if (o.how == 1) {
      emit_node(s.children[lo], n, k, out);
    } else if (s.kind == SpNode::Kind::Series) {
      const int right_depth = solve(node, o.q + 1, hi, n - o.n1, k).depth;
      emit(node, lo, o.q, o.n1, k + right_depth, out);
      emit(node, o.q + 1, hi, n - o.n1, k, out);
    } else {
      emit(node, lo, o.q, o.n1, k, out);
      emit(node, o.q + 1, hi, n - o.n1, k, out);
    }
  }

  const PartitionRequest& r_;
  const SpTree& t_;
  int D_ = 0;
  DeviceSpec spec_;
  bool gpipe_memory_ = false;
  std::vector<std::vector<double>> fb_, f_;  // per layer, per device count: F + B, F
  std::vector<double> ring_bw_, ring_lat_;
  double target_ = 0;
  std::unordered_map<uint64_t, Option> memo_;
};

}  // namespace

Result<Partition> partition_graphpipe(const PartitionRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  if (r.cluster.devices.empty()) return Error{"graphpipe: the cluster has no device"};
  if (r.cluster.devices.size() >= 1000) return Error{"graphpipe: at most 999 devices"};
  const SpTree tree = sp_decompose(r.workload);
  Planner planner(r, tree);
  // graph-1f1b keeps min(m, 1 + k) micro-batches in flight; assume all m for any other schedule.
  if (Status s = planner.init(r.schedule != "graph-1f1b"); !s) return s.error();
  double tps = 0;
  auto stages = planner.plan(&tps);
  if (!stages) return stages.error();
  std::vector<int> stage_of(r.workload.layer_count(), -1);
  std::vector<std::vector<int>> devices;
  int next = 0;
  for (size_t s = 0; s < stages->size(); ++s) {
    for (int l : (*stages)[s].first) stage_of[l] = static_cast<int>(s);
    std::vector<int> devs;
    for (int i = 0; i < (*stages)[s].second; ++i) devs.push_back(next++);
    devices.push_back(std::move(devs));
  }
  Result<Partition> p = make_partition(r.workload, stage_of, devices, r.cluster.devices.size());
  if (!p) return p.error();
  p->plan.predicted_time_per_stage_s = tps * r.micro_batch_size;
  for (const auto& [layers, n] : *stages)
    p->plan.predicted_stage_time_s.push_back(planner.stage_tps(layers, n) * r.micro_batch_size);
  p->plan.added_dependencies = tree.added_dependencies;
  p->plan.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p->plan.summary = fmt::format(
      "graphpipe: {} stages, depth {}, bottleneck {:.6g} s per sample ({:.6g} s per micro-batch of {}); "
      "{} dependencies added to make the graph series-parallel",
      p->stage_count(), p->depth(), tps, tps * r.micro_batch_size, r.micro_batch_size, tree.added_dependencies);
  return p;
}

}  // namespace pipegrid
