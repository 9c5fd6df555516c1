#include "core/backends.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

namespace pipegrid {

double BackendCatalog::conversion_time(int from, int to, double bytes) const {
  if (from == to) return 0;
  const std::string& a = backends[from].name;
  const std::string& b = backends[to].name;
  for (const Conversion& c : conversions) {
    if ((c.from == "*" || c.from == a) && (c.to == "*" || c.to == b))
      return c.latency_s + (c.bandwidth > 0 ? bytes / c.bandwidth : 0.0);
  }
  return 0;
}

bool op_matches(const PatternOp& op, const Layer& layer) {
  switch (op.kind) {
    case PatternOp::Kind::Any:
      return true;
    case PatternOp::Kind::LayerKind:
      return layer.kind == op.text;
    case PatternOp::Kind::Class: {
      const std::vector<Kernel> ks = layer_kernels(layer);
      return !ks.empty() &&
             std::all_of(ks.begin(), ks.end(), [&](const Kernel& k) { return k.cls == op.cls; });
    }
  }
  return false;
}

namespace {

DeviceSpec on_backend(const DeviceSpec& device, const PatternCost& c) {
  DeviceSpec d = device;
  for (int k = 0; k < kKernelClassCount; ++k) {
    if (c.compute_efficiency[k] > 0)
      for (Precision p : kMathPrecisions)
        d.compute_efficiency[static_cast<int>(p)][k] = c.compute_efficiency[k];
    if (c.memory_efficiency[k] > 0) d.memory_efficiency[k] = c.memory_efficiency[k];
  }
  if (c.launch_s >= 0) d.set_startup(c.launch_s);
  if (c.overhead_s >= 0) d.layer_overhead_s = c.overhead_s;
  return d;
}

// The chain of layers the pattern covers starting at v, or empty if it does not match there.
std::vector<int> match_chain(const Workload& w, const BackendPattern& p, int v) {
  std::vector<int> chain;
  int cur = v;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    if (i > 0) {
      if (boost::out_degree(cur, w.graph) != 1) return {};
      cur = static_cast<int>(boost::target(*boost::out_edges(cur, w.graph).first, w.graph));
    }
    if (!op_matches(p.ops[i], w.layer(cur))) return {};
    chain.push_back(cur);
  }
  return chain;
}

double sum(const PassTimes& t) {
  return t.forward + t.backward();
}

Result<BackendCandidate> cost_candidate(const Workload& w, const BackendCatalog& c, const DeviceSpec& device,
                                        const PlacementOptions& o, int b, int pi, std::vector<int> chain) {
  const BackendPattern& p = c.backends[b].patterns[pi];
  BackendCandidate cand;
  cand.backend = b;
  cand.pattern = pi;
  cand.layers = std::move(chain);
  cand.times.resize(cand.layers.size());
  if (p.cost.measured) {
    const MeasuredCost& m = *p.cost.measured;
    const double scale = o.batch / m.batch;
    cand.times[0].forward = m.forward_s * scale;
    cand.times[0].backward_weight = m.backward_weight_s * scale;
    cand.times[0].backward_input = (m.backward_s - m.backward_weight_s) * scale;
  } else {
    const DeviceSpec head = on_backend(device, p.cost);
    DeviceSpec fused = head;
    fused.set_startup(0);
    fused.kernel_dispatch_s = 0;
    fused.kernel_dispatch_class = DeviceSpec::unset_per_class();
    fused.layer_overhead_s = 0;
    for (size_t i = 0; i < cand.layers.size(); ++i) {
      Layer l = w.layer(cand.layers[i]);
      if (i > 0) {
        l.forward_bytes = 0;
        l.backward_bytes = 0;
        for (Kernel& k : l.kernels) k.forward_bytes = k.backward_bytes = 0;
      }
      auto t = layer_times(l, w.precision, i == 0 ? head : fused, o.batch);
      if (!t) return Error{fmt::format("backend \"{}\": {}", c.backends[b].name, t.error().message)};
      cand.times[i] = *t;
    }
  }
  for (const PassTimes& t : cand.times) cand.total_s += sum(t);
  return cand;
}

std::vector<int> allowed_backends(const BackendCatalog& c, const DeviceSpec& device,
                                  const PlacementOptions& o) {
  if (!o.allowed.empty()) return o.allowed;
  std::vector<int> out;
  for (size_t b = 0; b < c.backends.size(); ++b)
    if (runs_on(c.backends[b], device.kind)) out.push_back(static_cast<int>(b));
  return out;
}

double output_bytes(const Workload& w, int u, double batch) {
  return w.layer(u).output_bytes * batch;
}

}  // namespace

Result<std::vector<std::vector<BackendCandidate>>> placement_candidates(const Workload& w,
                                                                        const BackendCatalog& c,
                                                                        const DeviceSpec& device,
                                                                        const PlacementOptions& o) {
  const std::vector<int> allowed = allowed_backends(c, device, o);
  if (allowed.empty())
    return Error{fmt::format("no backend in the catalog runs on device kind \"{}\"", device.kind)};
  for (int b : allowed) {
    if (b < 0 || b >= static_cast<int>(c.backends.size()))
      return Error{fmt::format("backend index {} is not in the catalog", b)};
    // A backend's efficiencies belong to its device: on another they would cost the layers with the
    // wrong device's figures.
    const Backend& backend = c.backends[static_cast<size_t>(b)];
    if (!runs_on(backend, device.kind))
      return Error{fmt::format("backend \"{}\" runs on device kind \"{}\", not \"{}\"", backend.name,
                               backend.device_kind, device.kind)};
  }
  std::vector<std::vector<BackendCandidate>> out(w.layer_count());
  for (size_t v = 0; v < w.layer_count(); ++v) {
    const Layer& l = w.layer(v);
    if (l.measured && (l.measured->device_kind.empty() || l.measured->device_kind == device.kind))
      return Error{fmt::format(
          "layer \"{}\" carries measured times for {}: backend placement needs its FLOPs and bytes, not a "
          "fixed time",
          l.name,
          l.measured->device_kind.empty() ? std::string("every device kind")
                                          : fmt::format("device kind \"{}\"", device.kind))};
    for (int b : allowed) {
      for (size_t pi = 0; pi < c.backends[b].patterns.size(); ++pi) {
        std::vector<int> chain = match_chain(w, c.backends[b].patterns[pi], static_cast<int>(v));
        if (chain.empty()) continue;
        auto cand = cost_candidate(w, c, device, o, b, static_cast<int>(pi), std::move(chain));
        if (!cand) return cand.error();
        out[v].push_back(std::move(*cand));
      }
    }
  }
  return out;
}

Status evaluate_placement(const Workload& w, const BackendCatalog& c, const DeviceSpec& device,
                          const PlacementOptions& o, Placement& p) {
  const size_t n = w.layer_count();
  p.backend_of.assign(n, -1);
  p.layer_times.assign(n, PassTimes{});
  p.compute_s = p.conversion_s = 0;
  for (const PlacedGroup& g : p.groups) {
    auto cand = cost_candidate(w, c, device, o, g.backend, g.pattern, g.layers);
    if (!cand) return cand.error();
    for (size_t i = 0; i < g.layers.size(); ++i) {
      if (p.backend_of[g.layers[i]] >= 0)
        return Error{fmt::format("layer \"{}\" is covered twice", w.layer(g.layers[i]).name)};
      p.backend_of[g.layers[i]] = g.backend;
      p.layer_times[g.layers[i]] = cand->times[i];
    }
    p.compute_s += cand->total_s;
  }
  for (size_t v = 0; v < n; ++v)
    if (p.backend_of[v] < 0) return Error{fmt::format("layer \"{}\" is not placed", w.layer(v).name)};
  for (auto [e, end] = boost::edges(w.graph); e != end; ++e) {
    const int u = static_cast<int>(boost::source(*e, w.graph));
    const int v = static_cast<int>(boost::target(*e, w.graph));
    const double t = c.conversion_time(p.backend_of[u], p.backend_of[v], output_bytes(w, u, o.batch));
    // The activation into v in the forward pass, its gradient back in the backward pass: both are
    // charged to the consumer (its forward and its input-gradient pass).
    p.layer_times[v].forward += t;
    p.layer_times[v].backward_input += t;
    p.conversion_s += 2 * t;
  }
  return {};
}

namespace {

// place()'s dynamic programme over the layers in topological order. A state: (layer, backend) for
// every placed layer that is ahead of the current position or has an unplaced consumer, sorted by
// layer. Layers absent from it are placed and done, or unplaced (pos >= current position).
class PlacementSearch {
 public:
  PlacementSearch(const Workload& w, const BackendCatalog& c, const PlacementOptions& o,
                  const std::vector<std::vector<BackendCandidate>>& cands)
      : w_(w), c_(c), o_(o), cands_(cands), n_(w.layer_count()), order_(topological_order(w)), pos_(n_) {
    for (size_t i = 0; i < n_; ++i) pos_[order_[i]] = static_cast<int>(i);
    steps_.resize(n_ + 1);
    steps_[0][Key{}] = Entry{};
  }

  // Fails when no allowed backend implements a layer on `device`.
  Status run(const DeviceSpec& device) {
    for (size_t i = 0; i < n_; ++i) {
      for (const auto& [key, entry] : steps_[i]) expand(i, key, entry);
      const int v = order_[i];
      if (steps_[i + 1].empty())
        return Error{
            fmt::format("no allowed backend implements layer \"{}\" (kind \"{}\") on device kind \"{}\"",
                        w_.layer(v).name, w_.layer(v).kind, device.kind)};
      if (static_cast<long long>(steps_[i + 1].size()) > o_.max_states) prune(steps_[i + 1]);
    }
    return {};
  }

  // The final state is empty (every layer placed, none ahead): walk the parents back.
  Placement result() {
    const Key* key = &steps_[n_].begin()->first;
    for (size_t i = n_; i-- > 0;) {
      const Entry& e = steps_[i + 1].at(*key);
      if (e.cand >= 0) {
        const BackendCandidate& cd = cands_[order_[i]][e.cand];
        result_.groups.push_back(PlacedGroup{cd.backend, cd.pattern, cd.layers});
      }
      key = e.parent;
    }
    std::reverse(result_.groups.begin(), result_.groups.end());
    return std::move(result_);
  }

 private:
  using Key = std::vector<std::pair<int, int>>;
  struct Entry {
    double cost = 0;
    const Key* parent = nullptr;  // the state one step earlier
    int cand = -1;                // candidate index at order[step] taken from the parent; -1: skipped
  };

  static int placed_in(const Key& k, int layer) {
    auto it = std::lower_bound(k.begin(), k.end(), std::make_pair(layer, std::numeric_limits<int>::min()));
    return it != k.end() && it->first == layer ? it->second : -1;
  }

  // Keeps the entries that still matter at position `next`.
  Key canonical(Key k, int next) const {
    std::sort(k.begin(), k.end());
    Key out;
    for (const auto& [u, b] : k) {
      bool keep = pos_[u] >= next;
      for (auto [e, end] = boost::out_edges(u, w_.graph); !keep && e != end; ++e) {
        const int s = static_cast<int>(boost::target(*e, w_.graph));
        if (pos_[s] >= next && placed_in(k, s) < 0) keep = true;
      }
      if (keep) out.emplace_back(u, b);
    }
    return out;
  }

  void relax(size_t i, Key k, double cost, const Key* parent, int cand) {
    auto [it, inserted] = steps_[i + 1].try_emplace(std::move(k), Entry{cost, parent, cand});
    if (!inserted && cost < it->second.cost) it->second = Entry{cost, parent, cand};
  }

  // State `key` at step i: layer order[i] skipped when a chain placed it ahead, else every candidate
  // whose other layers are free.
  void expand(size_t i, const Key& key, const Entry& entry) {
    const int v = order_[i];
    ++result_.states;
    if (placed_in(key, v) >= 0) {  // placed ahead by a chain
      relax(i, canonical(key, static_cast<int>(i) + 1), entry.cost, &key, -1);
      return;
    }
    for (size_t ci = 0; ci < cands_[v].size(); ++ci) {
      const BackendCandidate& cd = cands_[v][ci];
      bool free = true;
      for (size_t j = 1; j < cd.layers.size(); ++j) free = free && placed_in(key, cd.layers[j]) < 0;
      if (!free) continue;
      const double cost = add_conversions(entry.cost + cd.total_s, key, cd);
      Key k = key;
      for (int m : cd.layers) k.emplace_back(m, cd.backend);
      relax(i, canonical(std::move(k), static_cast<int>(i) + 1), cost, &key, static_cast<int>(ci));
    }
  }

  // `cost` plus the conversions candidate cd adds in state `key`, forward and backward.
  double add_conversions(double cost, const Key& key, const BackendCandidate& cd) const {
    for (int m : cd.layers) {
      for (auto [e, end] = boost::in_edges(m, w_.graph); e != end; ++e) {
        const int u = static_cast<int>(boost::source(*e, w_.graph));
        if (std::find(cd.layers.begin(), cd.layers.end(), u) != cd.layers.end()) continue;
        // A producer not placed yet (the residual input of a fused add) pays when it is placed.
        const int bu = placed_in(key, u);
        if (bu >= 0) cost += 2 * c_.conversion_time(bu, cd.backend, output_bytes(w_, u, o_.batch));
      }
      // Consumers a chain placed ahead of their turn.
      for (auto [e, end] = boost::out_edges(m, w_.graph); e != end; ++e) {
        const int s = static_cast<int>(boost::target(*e, w_.graph));
        if (std::find(cd.layers.begin(), cd.layers.end(), s) != cd.layers.end()) continue;
        const int bs = placed_in(key, s);
        if (bs >= 0) cost += 2 * c_.conversion_time(cd.backend, bs, output_bytes(w_, m, o_.batch));
      }
    }
    return cost;
  }

  // Above max_states: the cheapest kept (a beam), the result inexact.
  void prune(std::map<Key, Entry>& next) {
    std::vector<std::pair<double, const Key*>> by_cost;
    for (const auto& [k, e] : next) by_cost.emplace_back(e.cost, &k);
    std::nth_element(by_cost.begin(), by_cost.begin() + o_.max_states, by_cost.end());
    std::map<Key, Entry> kept;
    for (long long j = 0; j < o_.max_states; ++j)
      kept.emplace(*by_cost[j].second, next.at(*by_cost[j].second));
    next = std::move(kept);
    result_.exact = false;
  }

  const Workload& w_;
  const BackendCatalog& c_;
  const PlacementOptions& o_;
  const std::vector<std::vector<BackendCandidate>>& cands_;
  const size_t n_;
  const std::vector<int> order_;
  std::vector<int> pos_;
  std::vector<std::map<Key, Entry>> steps_;
  Placement result_;
};

}  // namespace

Result<Placement> place(const Workload& w, const BackendCatalog& c, const DeviceSpec& device,
                        const PlacementOptions& o) {
  auto cands = placement_candidates(w, c, device, o);
  if (!cands) return cands.error();
  if (w.layer_count() == 0) return Placement{};
  PlacementSearch search(w, c, o, *cands);
  if (Status s = search.run(device); !s) return s.error();
  Placement result = search.result();
  if (Status s = evaluate_placement(w, c, device, o, result); !s) return s.error();
  return result;
}

Result<Placement> refine_placement(const Workload& w, const BackendCatalog& c, const DeviceSpec& device,
                                   const PlacementOptions& o, Placement start,
                                   const PlacementEvaluator& evaluate, int rounds) {
  auto cands_r = placement_candidates(w, c, device, o);
  if (!cands_r) return cands_r.error();
  if (Status s = evaluate_placement(w, c, device, o, start); !s) return s.error();
  double best = evaluate(start);
  for (int r = 0; r < rounds; ++r) {
    bool improved = false;
    for (size_t g = 0; g < start.groups.size(); ++g) {
      const PlacedGroup current = start.groups[g];
      for (const BackendCandidate& cd : (*cands_r)[current.layers.front()]) {
        if (cd.layers != current.layers || (cd.backend == current.backend && cd.pattern == current.pattern))
          continue;
        Placement trial = start;
        trial.groups[g] = PlacedGroup{cd.backend, cd.pattern, cd.layers};
        if (Status s = evaluate_placement(w, c, device, o, trial); !s) return s.error();
        const double t = evaluate(trial);
        if (t < best) {
          best = t;
          start = std::move(trial);
          improved = true;
        }
      }
    }
    if (!improved) break;
  }
  return start;
}

bool runs_on(const Backend& b, std::string_view kind) {
  return b.device_kind == kind ||
         std::find(b.device_aliases.begin(), b.device_aliases.end(), kind) != b.device_aliases.end();
}

namespace {

// A fused group's layers as one layer: their measured times, FLOPs, bytes, stash and parameters
// added up, the last layer's output, so that the partitioners cannot cut inside the fused kernel.
Layer fused_layer(const Workload& w, const PlacedGroup& g, const std::string& backend) {
  Layer m;
  const Layer& last = w.layer(static_cast<size_t>(g.layers.back()));
  std::vector<std::string> names, kinds;
  MeasuredCost t = *w.layer(static_cast<size_t>(g.layers.front())).measured;
  t.forward_s = t.backward_s = t.backward_weight_s = 0;
  bool selective = false;
  m.selective_stash_bytes = 0;  // summed below (-1, "the same as stash_bytes", again if none has its own)
  double recomputed_s = 0;      // forward seconds the selective recomputation re-runs
  for (int v : g.layers) {
    const Layer& l = w.layer(static_cast<size_t>(v));
    names.push_back(l.name);
    kinds.push_back(l.kind);
    add_layer_totals(m, l);
    selective = selective || l.selective_stash_bytes >= 0;
    m.selective_stash_bytes += l.selective_stash_bytes >= 0 ? l.selective_stash_bytes : l.stash_bytes;
    t.forward_s += l.measured->forward_s;
    t.backward_s += l.measured->backward_s;
    t.backward_weight_s += l.measured->backward_weight_s;
    recomputed_s += l.selective_recompute_fraction * l.measured->forward_s;
  }
  m.name = fmt::format("{}", fmt::join(names, "+"));
  m.kind = std::all_of(kinds.begin(), kinds.end(), [&](const std::string& k) { return k == kinds.front(); })
               ? kinds.front()
               : "fused";
  m.description = fmt::format("fused {}; backend: {}", fmt::join(kinds, " -> "), backend);
  m.output_bytes = last.output_bytes;
  if (!selective) m.selective_stash_bytes = -1;
  m.selective_recompute_fraction = t.forward_s > 0 ? recomputed_s / t.forward_s : 0;
  m.measured = t;
  return m;
}

// The placed workload with each fused group (two or more layers) contracted to one layer, placed
// where the group's last layer comes in topological order (every input of the chain precedes it, and
// only the chain consumes its intermediates, so no cycle can form).
Workload contract_fused_groups(const Workload& w, const Placement& p, const BackendCatalog& c) {
  std::vector<int> group_of(w.layer_count(), -1);
  for (size_t g = 0; g < p.groups.size(); ++g)
    if (p.groups[g].layers.size() > 1)
      for (int v : p.groups[g].layers) group_of[static_cast<size_t>(v)] = static_cast<int>(g);
  if (std::all_of(group_of.begin(), group_of.end(), [](int g) { return g < 0; })) return w;
  const std::vector<int> order = topological_order(w);
  std::vector<size_t> seen(p.groups.size(), 0);  // members met so far in `order`
  std::vector<int> id(w.layer_count(), -1);
  Workload out = w;
  out.graph = LayerGraph();
  for (int v : order) {
    const int g = group_of[static_cast<size_t>(v)];
    if (g < 0) {
      id[static_cast<size_t>(v)] = out.add_layer(w.layer(static_cast<size_t>(v)));
      continue;
    }
    const PlacedGroup& group = p.groups[static_cast<size_t>(g)];
    if (++seen[static_cast<size_t>(g)] < group.layers.size()) continue;
    const int merged =
        out.add_layer(fused_layer(w, group, c.backends[static_cast<size_t>(group.backend)].name));
    for (int u : group.layers) id[static_cast<size_t>(u)] = merged;
  }
  for (auto [e, end] = boost::edges(w.graph); e != end; ++e) {
    const int a = id[boost::source(*e, w.graph)], b = id[boost::target(*e, w.graph)];
    if (a != b && !boost::edge(a, b, out.graph).second) out.add_edge(a, b);
  }
  return out;
}

}  // namespace

Result<Workload> apply_placement(const Workload& w, const Placement& p, const BackendCatalog& c,
                                 const DeviceSpec& device, const PlacementOptions& o) {
  if (p.layer_times.size() != w.layer_count() || p.backend_of.size() != w.layer_count())
    return Error{"the placement does not belong to this workload"};
  Workload out = w;
  for (size_t v = 0; v < w.layer_count(); ++v) {
    Layer& l = out.graph[v];
    if (l.measured)
      return Error{fmt::format("layer \"{}\" already carries measured times; a placement cannot replace them",
                               l.name)};
    const PassTimes& t = p.layer_times[v];
    MeasuredCost m;
    m.forward_s = t.forward;
    m.backward_s = t.backward();
    m.backward_weight_s = t.backward_weight;
    m.batch = o.batch;
    m.device_kind = device.kind;
    l.measured = m;
    const std::string tag = "backend: " + c.backends[p.backend_of[v]].name;
    l.description = l.description.empty() ? tag : l.description + "; " + tag;
  }
  return contract_fused_groups(out, p, c);
}

std::string placed_backend(const Layer& layer) {
  constexpr std::string_view kTag = "backend: ";
  const size_t at = layer.description.rfind(kTag);
  if (at == std::string::npos || (at > 0 && layer.description.compare(at - 2, 2, "; ") != 0)) return "";
  const size_t from = at + kTag.size();
  return layer.description.substr(from, layer.description.find(';', from) - from);
}

}  // namespace pipegrid
